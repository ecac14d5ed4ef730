package api

import (
	"bytes"
	"encoding/json"
	"io"
	"sync"
	"time"

	"github.com/oac/sandbox-agent/protocol"
)

// Event kinds.
const (
	KindState   = "state"   // lifecycle state change: state, message
	KindAgent   = "agent"   // the guest agent connected: pid, protocol, agent_version
	KindProcess = "process" // a guest process started, exited or is restarting
	KindLog     = "log"     // one line of guest process output: stream, line
	KindDropped = "log_dropped"
	// KindEgressDropped and KindProcessDropped count egress (and
	// egress_closed) and process events dropped over their rate limit:
	// dropped.
	KindEgressDropped  = "egress_dropped"
	KindProcessDropped = "process_dropped"
	// KindEgress is one egress decision: target, via, decision (allowed,
	// denied, failed), rule or reason, code and effect on refusal, address
	// dialed when allowed.
	KindEgress = "egress"
	// KindEgressClosed ends an allowed egress connection: bytes each way,
	// duration, and code/reason when it did not end cleanly.
	KindEgressClosed = "egress_closed"
	// KindEgressPolicy reports a policy replacement (or a refused one).
	KindEgressPolicy = "egress_policy"
	// KindForward reports a forward (ingress) listening or removed, or a
	// connection it refused: listen, guest_port, message.
	KindForward = "forward"
	// KindAnswer answers one control command: id, command, ok, error and
	// the command's result.
	KindAnswer = "answer"
	// KindKept reports what the shim did to a kept sandbox's state
	// (oac-shim start, the control API's reset): message, e.g. a
	// half-created sandbox discarded, the state discarded by a reset, or
	// an image that changed since create.
	KindKept = "kept"
	// KindClock reports a VM guest's clock stepped by more than a second
	// to the host's (after the host slept, say): correction_ms, trigger.
	KindClock = "clock"
	// KindEventsLost is written by oac-shim attach, never by a shim: the
	// events lost_from to lost_to (seqs, both included) are not in the
	// journal it replays (older than the journal keeps, or a line its
	// shim never wrote whole): message says which. Its seq is lost_to:
	// the line stands for the lost ones, so a caller that resumes after
	// the last seq it saw does not ask for them again.
	KindEventsLost = "events_lost"
	// KindWarmExpired says a warm sandbox nobody claimed reached its
	// maximum age (oac-shim run --warm-max-age): it stops next, in order
	// (message). A pool replaces it. Since schema version 8.
	KindWarmExpired = "warm_expired"
)

// State is a sandbox's lifecycle state: starting, ready, failed or
// stopped, the states the guest reports in the protocol's State messages,
// and warm: booted for nobody, its guest connected and waiting for a
// claim (oac-shim run --warm; docs/warm.md).
type State string

// States.
const (
	StateStarting State = protocol.StateStarting
	StateReady    State = protocol.StateReady
	StateFailed   State = protocol.StateFailed
	StateStopped  State = protocol.StateStopped
	StateWarm     State = "warm"
)

// ModeHelper is Event.Mode on the events of oac-guest helper.
const ModeHelper = "helper"

// SchemaVersion is the version of the published schema (schema/*.json)
// that describes what this build writes and reads; every event and answer
// carries it. Any change to the schema files bumps it, so a line is
// described exactly by the schema of its version (docs/schema.md).
const SchemaVersion = 10

// Event is one line of oac-shim output.
type Event struct {
	Time    time.Time `json:"time"`
	Sandbox string    `json:"sandbox"`
	Event   string    `json:"event"`
	// SchemaVersion is set by the sink (JSONLines) when zero.
	SchemaVersion int `json:"schema_version"`
	// Seq numbers the lines of one events output: 1 on the first, one
	// more on each next (answers written there included), set by the
	// sink (JSONLines). A gap means lines were lost; an attach replays
	// from it (docs/events-and-control.md).
	Seq uint64 `json:"seq"`
	// Mode is ModeHelper on the events oac-guest helper writes (a hosted
	// sandbox with no shim beside it, docs/hosted.md); absent on
	// oac-shim's.
	Mode         string `json:"mode,omitempty"`
	State        State  `json:"state,omitempty"`
	Message      string `json:"message,omitempty"`
	Process      string `json:"process,omitempty"`
	PID          int    `json:"pid,omitempty"`
	Running      *bool  `json:"running,omitempty"`
	ExitCode     *int   `json:"exit_code,omitempty"`
	Signal       string `json:"signal,omitempty"`
	Protocol     int    `json:"protocol,omitempty"`
	AgentVersion string `json:"agent_version,omitempty"`
	Stream       string `json:"stream,omitempty"`
	Line         string `json:"line,omitempty"`
	Dropped      int64  `json:"dropped,omitempty"`
	// Egress fields (egress, egress_closed). Conn links the two events of
	// one connection; bytes_out went from the guest to the upstream.
	Conn     uint64 `json:"conn,omitempty"`
	Via      string `json:"via,omitempty"`
	Target   string `json:"target,omitempty"`
	Decision string `json:"decision,omitempty"`
	Rule     string `json:"rule,omitempty"`
	Reason   string `json:"reason,omitempty"`
	// Code is the egress failure code (egress, egress_closed) or, on a
	// failed state, the failure code (see Failures).
	Code       string `json:"code,omitempty"`
	Effect     string `json:"effect,omitempty"`
	Address    string `json:"address,omitempty"`
	BytesOut   *int64 `json:"bytes_out,omitempty"`
	BytesIn    *int64 `json:"bytes_in,omitempty"`
	DurationMS *int64 `json:"duration_ms,omitempty"`
	// SourcePort names an egress connection as the workload sees it: its
	// client's source port in the guest (read from the workload's socket
	// when the guest handed it over, else the guest's word).
	SourcePort int `json:"source_port,omitempty"`
	// Rules lists the policy in force (egress_policy).
	Rules []string `json:"rules,omitempty"`
	// URL and Username come with ready when the daemon has credentials
	// and a health check; the password never appears in an event.
	URL      string `json:"url,omitempty"`
	Username string `json:"username,omitempty"`
	// GuestURL is the daemon's URL inside the guest, given with ready
	// when URL is a forward's address on the host.
	GuestURL string `json:"guest_url,omitempty"`
	// Listen and GuestPort name a forward (forward events).
	Listen    string `json:"listen,omitempty"`
	GuestPort int    `json:"guest_port,omitempty"`
	// Attempt numbers the sandbox's starts in this shim (state events).
	Attempt uint64 `json:"attempt,omitempty"`
	// Restarts counts a process's restarts; RestartInMS is the backoff
	// before the next start (process events with message "restarting").
	Restarts    int   `json:"restarts,omitempty"`
	RestartInMS int64 `json:"restart_in_ms,omitempty"`
	// CorrectionMS is how far a VM guest's clock was stepped (positive:
	// forward, the guest was behind); Trigger what made the check
	// (interval, host_wake, guest_jump). Clock events.
	CorrectionMS int64  `json:"correction_ms,omitempty"`
	Trigger      string `json:"trigger,omitempty"`
	// LostFrom and LostTo are the seqs an events_lost line stands for.
	LostFrom uint64 `json:"lost_from,omitempty"`
	LostTo   uint64 `json:"lost_to,omitempty"`
}

// Sink receives events. Emit must be safe for concurrent use.
type Sink interface{ Emit(Event) }

// JSONLines writes each event as one JSON object per line, numbering
// the lines it writes (Event.Seq, Answer.Seq) from 1.
type JSONLines struct {
	mu  sync.Mutex
	w   io.Writer
	buf bytes.Buffer
	enc *json.Encoder
	seq uint64
	tap func(seq uint64, line []byte)
}

// NewJSONLines returns a sink writing to w.
func NewJSONLines(w io.Writer) *JSONLines {
	j := &JSONLines{w: w}
	j.enc = json.NewEncoder(&j.buf)
	j.enc.SetEscapeHTML(false)
	return j
}

// Tap gives every numbered line, as written, to fn too, in order and
// under the sink's lock (an outliving shim's journal); fn must not block.
func (j *JSONLines) Tap(fn func(seq uint64, line []byte)) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.tap = fn
}

// Emit writes e; a write error is dropped (events must never block or fail
// the sandbox).
func (j *JSONLines) Emit(e Event) {
	if e.SchemaVersion == 0 {
		e.SchemaVersion = SchemaVersion
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.seq++
	e.Seq = j.seq
	_ = j.write(e, e.Seq)
}

// Encode writes any other value as one line, in order with the events;
// an Answer is numbered like an event (its Seq set).
func (j *JSONLines) Encode(v any) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	var seq uint64
	switch a := v.(type) {
	case Answer:
		j.seq++
		a.Seq, seq = j.seq, j.seq
		v = a
	case *Answer:
		j.seq++
		c := *a
		c.Seq, seq = j.seq, j.seq
		v = c
	}
	return j.write(v, seq)
}

// write encodes v as one line and writes it with one Write; a numbered
// line goes to the tap too.
func (j *JSONLines) write(v any, seq uint64) error {
	j.buf.Reset()
	if err := j.enc.Encode(v); err != nil {
		return err
	}
	line := j.buf.Bytes()
	if seq != 0 && j.tap != nil {
		j.tap(seq, line)
	}
	_, err := j.w.Write(line)
	return err
}

// Func adapts a function to Sink.
type Func func(Event)

// Emit calls f.
func (f Func) Emit(e Event) { f(e) }
