package client

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"unicode/utf8"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/internal/safetext"
	"github.com/oac/sandbox-agent/internal/strictjson"
)

// MaxHelperLine bounds one line of oac-guest helper's output: a log
// event carries at most 4 KiB of the workload's output, which JSON may
// escape to six bytes a byte.
const MaxHelperLine = 64 << 10

// seqSince is the schema version from which every line carries seq.
const seqSince = 7

// helperKinds are the events oac-guest helper writes: it has no control
// API, no forwards and no kept state.
var helperKinds = map[string]bool{
	api.KindState: true, api.KindAgent: true, api.KindProcess: true, api.KindLog: true, api.KindDropped: true,
	api.KindEgressDropped: true, api.KindProcessDropped: true, api.KindEgress: true, api.KindEgressClosed: true,
	api.KindEgressPolicy: true,
}

var eventSchema = strictjson.ForType(reflect.TypeFor[api.Event]())

// allKinds are the published event kinds: a kind the helper does not
// write is named only when it is one of them.
var allKinds = map[string]bool{api.KindAnswer: true, api.KindForward: true, api.KindKept: true, api.KindClock: true}

// word quotes w for an error only when it is one of known: what else
// stands in the output may be the workload's (a broken line can put a
// log line's value where a key or a kind belongs).
func word(w string, known map[string]bool) string {
	if known[w] || helperKinds[w] {
		return fmt.Sprintf(" %q", w)
	}
	return ""
}

// keyName names a key for an error when it is an event field's name in
// any letter case (a case variant is a rule of its own).
func keyName(k string) string {
	for _, f := range eventSchema.Fields {
		if strings.EqualFold(f.Name, k) {
			return fmt.Sprintf(" (key %q)", k)
		}
	}
	return ""
}

// HelperError is output of oac-guest helper that breaks its contract:
// Line is the line's number (from 1), Reason the rule it broke. It never
// quotes the line (the workload's log lines pass through it).
type HelperError struct {
	Line   int
	Reason string
	// Err is io.ErrUnexpectedEOF when the output ended before the last
	// state (the helper was killed, or the stream was cut).
	Err error
}

func (e *HelperError) Error() string {
	return fmt.Sprintf("client: oac-guest helper output, line %d: %s", e.Line, e.Reason)
}

func (e *HelperError) Unwrap() error { return e.Err }

// HelperOutput reads the events oac-guest helper writes on its stdout, as
// an E2B process or a `msb exec --stream` delivers them (docs/hosted.md):
// one JSON event a line, strictly. Every line must be an event of the
// published schema the helper writes ("mode":"helper", a schema version
// no newer than this client's, one sandbox, attempt 1, seq 1, 2, 3 ...
// from schema version 7) within
// MaxHelperLine; nothing may follow the last state (stopped or failed),
// and the output must not end before it. The first line that breaks a
// rule is a *HelperError, returned again by every later call.
//
// It reads only what it is given: to give up waiting, close the stream
// (E2B's CloseStdin and the process's end, msb's exec) or r.
type HelperOutput struct {
	r       *bufio.Reader
	line    int
	sandbox string
	seq     uint64 // the last line's seq
	last    bool   // the last state was read
	err     error
}

// NewHelperOutput reads r.
func NewHelperOutput(r io.Reader) *HelperOutput {
	return &HelperOutput{r: bufio.NewReaderSize(r, 4096)}
}

// Next returns the next event; io.EOF once the output ended after the
// last state.
func (h *HelperOutput) Next() (api.Event, error) {
	if h.err != nil {
		return api.Event{}, h.err
	}
	e, err := h.next()
	if err != nil {
		h.err = err
	}
	return e, err
}

func (h *HelperOutput) fail(reason string, args ...any) error {
	return &HelperError{Line: h.line, Reason: fmt.Sprintf(reason, args...)}
}

func (h *HelperOutput) next() (api.Event, error) {
	line, err := h.readLine()
	if err != nil {
		return api.Event{}, err
	}
	if h.last {
		return api.Event{}, h.fail("output after the last state (stopped or failed)")
	}
	if !utf8.Valid(line) {
		return api.Event{}, h.fail("not UTF-8")
	}
	if err := strictjson.Check(line, eventSchema); err != nil {
		var se *strictjson.Error
		if errors.As(err, &se) && se.Key != "" {
			return api.Event{}, h.fail("not an event of this client's schema: %v%s", se.Err, keyName(se.Key))
		}
		return api.Event{}, h.fail("not one JSON event object")
	}
	var e api.Event
	if err := json.Unmarshal(line, &e); err != nil {
		return api.Event{}, h.fail("not an event of this client's schema: a value has the wrong type or range")
	}
	switch {
	case e.SchemaVersion > api.SchemaVersion:
		return api.Event{}, h.fail("schema version %d is newer than this client's %d: use the client of the helper's release", e.SchemaVersion, api.SchemaVersion)
	case e.SchemaVersion < 1:
		return api.Event{}, h.fail("no schema_version")
	case e.Mode != api.ModeHelper:
		return api.Event{}, h.fail(`not an event of oac-guest helper ("mode" is not "helper"): is the platform running the helper?`)
	case !helperKinds[e.Event]:
		return api.Event{}, h.fail("event kind%s is not one oac-guest helper writes", word(e.Event, allKinds))
	case e.Time.IsZero():
		return api.Event{}, h.fail("no time")
	case e.Sandbox == "":
		return api.Event{}, h.fail("no sandbox")
	case h.sandbox != "" && e.Sandbox != h.sandbox:
		return api.Event{}, h.fail("another sandbox's event")
	case e.Event != api.KindState && e.State != "":
		return api.Event{}, h.fail("a state on a %s event", e.Event)
	case e.Attempt > 1:
		return api.Event{}, h.fail("attempt %d: the helper has only attempt 1", e.Attempt)
	}
	if e.SchemaVersion >= seqSince || e.Seq != 0 {
		// Every line of the helper's is an event (it writes no answers):
		// the seqs follow one another from 1, and a gap is a lost line.
		if e.Seq != h.seq+1 {
			return api.Event{}, h.fail("seq %d after %d: a line was lost or the stream is not one helper's from its start", e.Seq, h.seq)
		}
		h.seq = e.Seq
	}
	h.sandbox = e.Sandbox
	if e.Event == api.KindState {
		switch e.State {
		case api.StateStarting, api.StateReady:
		case api.StateFailed:
			if !knownFailure(e.Code) {
				return api.Event{}, h.fail("a failed state without a published failure code")
			}
			h.last = true
		case api.StateStopped:
			h.last = true
		default:
			return api.Event{}, h.fail("a state that is not one oac-guest helper writes (starting, ready, failed, stopped)")
		}
	}
	return e, nil
}

// readLine returns the next line without its "\n", at most MaxHelperLine
// bytes.
func (h *HelperOutput) readLine() ([]byte, error) {
	var buf []byte
	for {
		frag, err := h.r.ReadSlice('\n')
		if len(buf)+len(frag) > MaxHelperLine+1 {
			h.line++
			return nil, h.fail("longer than %d bytes", MaxHelperLine)
		}
		buf = append(buf, frag...)
		switch {
		case err == nil:
			h.line++
			return buf[:len(buf)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(buf) == 0 && h.last:
			return nil, io.EOF
		case errors.Is(err, io.EOF) && len(buf) == 0:
			return nil, &HelperError{Line: h.line, Reason: "the output ended before the last state (stopped or failed): the helper was killed or the stream cut", Err: io.ErrUnexpectedEOF}
		case errors.Is(err, io.EOF):
			h.line++
			return nil, &HelperError{Line: h.line, Reason: "the output ended inside a line: the stream was cut", Err: io.ErrUnexpectedEOF}
		default:
			return nil, fmt.Errorf("client: read oac-guest helper's output: %w", err)
		}
	}
}

// WaitReady reads until the ready state and returns it (URL, Username:
// the daemon's address in the workload's namespace and its Basic auth
// user; the password is the payload's). A failed state is a
// *FailedError; a stop before ready or output that breaks the contract a
// *HelperError. onEvent, when set, sees every event read.
func (h *HelperOutput) WaitReady(onEvent func(api.Event)) (api.Event, error) {
	for {
		e, err := h.Next()
		if errors.Is(err, io.EOF) {
			return api.Event{}, h.fail("the output ended before ready")
		}
		if err != nil {
			return api.Event{}, err
		}
		if onEvent != nil {
			onEvent(e)
		}
		switch e.State {
		case api.StateReady:
			return e, nil
		case api.StateFailed:
			return e, &FailedError{Code: e.Code, Message: safetext.Clean(e.Message, 1024, ' '), Event: e}
		case api.StateStopped:
			return e, h.fail("stopped before ready: %s", safetext.Clean(e.Message, 256, ' '))
		}
	}
}

func knownFailure(code string) bool {
	for _, f := range api.Failures {
		if f.Code == code {
			return true
		}
	}
	return false
}
