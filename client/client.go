package client

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/oac/sandbox-agent/api"
)

// Shim is one running oac-shim process: `run` or `start` launched by
// Start, or `attach` launched by Attach.
type Shim struct {
	name     string
	password string
	attached bool
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	wmu      sync.Mutex // serializes what goes to stdin
	stderr   *tail

	mu      sync.Mutex
	ring    []api.Event // the history: event n is ring[n%len(ring)]
	next    uint64      // the number of the next event (all events so far)
	notify  chan struct{}
	eof     bool
	pending map[string]chan answer
	nextID  uint64
	// idPrefix makes this Shim's command ids its own: an attach replays
	// the answers to another parent's commands too.
	idPrefix string
	// mismatch is set when the shim's first line is of another schema
	// version than this client's.
	mismatch *SchemaError

	done    chan struct{} // closed when the process has exited
	waitErr error
}

type answer struct {
	ID     string          `json:"id"`
	OK     bool            `json:"ok"`
	Error  string          `json:"error"`
	Code   string          `json:"code"`
	Result json.RawMessage `json:"result"`
}

// Start launches `oac-shim run --name NAME --control stdin
// --password-stdin ...` (`start` with Options.Kept) and hands it the
// password and the bootstrap on stdin. ctx bounds only the launch; use
// StartReady to wait for ready, Stop or Kill to end the shim.
func Start(ctx context.Context, o Options) (*Shim, error) {
	args, err := o.args()
	if err != nil {
		return nil, err
	}
	prelude, password, err := o.stdinPrelude()
	if err != nil {
		return nil, err
	}
	s, err := launch(ctx, launchSpec{shim: o.Shim, args: args, env: o.Env, stderr: o.Stderr, onEvent: o.OnEvent, history: o.History, prelude: prelude})
	if err != nil {
		return nil, err
	}
	s.name, s.password = o.Name, password
	return s, nil
}

// StartReady starts the sandbox and waits until it is ready: it returns
// the shim and the ready event (URL, Username; the password is
// s.Password()). When the sandbox fails first, the shim exits or ctx
// ends, it leaves nothing running (the sandbox is stopped in order, the
// shim killed when it does not exit within 30 s) and returns the
// *FailedError, *ExitedError or ctx's error.
func StartReady(ctx context.Context, o Options) (*Shim, api.Event, error) {
	s, err := Start(ctx, o)
	if err != nil {
		return nil, api.Event{}, err
	}
	ready, err := s.WaitState(ctx, api.StateReady)
	if err != nil {
		s.abandon()
		return nil, api.Event{}, err
	}
	return s, ready, nil
}

// abandonGrace bounds how long StartReady waits for a shim it gives up
// on to stop in order before it kills it.
const abandonGrace = 30 * time.Second

// abandon stops a shim nobody will use, in order when it can: a failed
// sandbox's shim exits by itself once everything of it ended; one that
// is still starting is sent the stop command (which an outliving one
// needs too). Either is killed after abandonGrace.
func (s *Shim) abandon() {
	c, cancel := context.WithTimeout(context.Background(), abandonGrace)
	defer cancel()
	_ = s.Stop(c)
}

type launchSpec struct {
	shim    string
	args    []string
	env     []string
	stderr  io.Writer
	onEvent func(api.Event)
	history int
	prelude []byte // written to stdin before any command
}

func launch(ctx context.Context, l launchSpec) (*Shim, error) {
	shim := shimPath(l.shim)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	cmd := exec.Command(shim, l.args...)
	cmd.Env = l.env
	t := &tail{}
	cmd.Stderr = t
	if l.stderr != nil {
		cmd.Stderr = io.MultiWriter(l.stderr, t)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("client: a pipe for oac-shim's stdin: %w", err)
	}
	// Not StdoutPipe: Wait would close it as soon as the process exits
	// and the last events could be lost.
	r, w, err := os.Pipe()
	if err != nil {
		stdin.Close()
		return nil, fmt.Errorf("client: a pipe for oac-shim's events: %w", err)
	}
	cmd.Stdout = w
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		stdin.Close()
		return nil, fmt.Errorf("client: start %s (give Options.Shim, set OAC_SHIM or put oac-shim in PATH): %w", shim, err)
	}
	w.Close()
	n := l.history
	if n <= 0 {
		n = DefaultHistory
	}
	var id [6]byte
	_, _ = rand.Read(id[:])
	s := &Shim{cmd: cmd, stdin: stdin, stderr: t, ring: make([]api.Event, n), notify: make(chan struct{}),
		pending: map[string]chan answer{}, idPrefix: "c" + hex.EncodeToString(id[:]) + "-", done: make(chan struct{})}
	if len(l.prelude) > 0 {
		// Commands wait for it: the shim reads the password and the
		// bootstrap before any command line. A shim that exits early makes
		// the write fail, and its exit says why.
		s.wmu.Lock()
		go func() {
			defer s.wmu.Unlock()
			_, _ = stdin.Write(l.prelude)
			clear(l.prelude)
		}()
	}
	readerDone := make(chan struct{})
	go func() { defer close(readerDone); s.read(r, l.onEvent) }()
	go func() {
		err := cmd.Wait()
		<-readerDone
		s.mu.Lock()
		s.waitErr = err
		s.mu.Unlock()
		close(s.done)
	}()
	return s, nil
}

// shimPath is the oac-shim to run: the caller's, else $OAC_SHIM, else
// oac-shim from PATH.
func shimPath(s string) string {
	if s != "" {
		return s
	}
	if v := os.Getenv("OAC_SHIM"); v != "" {
		return v
	}
	return "oac-shim"
}

// maxLine bounds one line of the shim's output: a log event carries at
// most 4 KiB of guest output, an answer at most a status.
const maxLine = 4 << 20

// read turns stdout lines into events and answers until the shim closes it.
func (s *Shim) read(r io.ReadCloser, onEvent func(api.Event)) {
	defer r.Close()
	defer func() {
		s.mu.Lock()
		s.eof = true
		close(s.notify)
		for id, ch := range s.pending {
			close(ch)
			delete(s.pending, id)
		}
		s.mu.Unlock()
	}()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLine)
	first := true
	for sc.Scan() {
		var kind struct {
			Event         string `json:"event"`
			SchemaVersion int    `json:"schema_version"`
		}
		if json.Unmarshal(sc.Bytes(), &kind) != nil {
			continue
		}
		if first {
			first = false
			if kind.SchemaVersion != api.SchemaVersion {
				s.mu.Lock()
				s.mismatch = &SchemaError{Shim: kind.SchemaVersion, Client: api.SchemaVersion}
				s.mu.Unlock()
			}
		}
		if kind.Event == api.KindAnswer {
			var a answer
			if json.Unmarshal(sc.Bytes(), &a) != nil {
				continue
			}
			s.mu.Lock()
			ch, ok := s.pending[a.ID]
			delete(s.pending, a.ID)
			s.mu.Unlock()
			if ok {
				ch <- a
			}
			continue
		}
		var e api.Event
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue
		}
		if onEvent != nil {
			onEvent(e)
		}
		s.mu.Lock()
		s.ring[s.next%uint64(len(s.ring))] = e
		s.next++
		close(s.notify)
		s.notify = make(chan struct{})
		s.mu.Unlock()
	}
	// A line over maxLine ends the reading: drain so the shim is not
	// blocked on a full pipe, and let its exit say the rest.
	_, _ = io.Copy(io.Discard, r)
}

// Name is the sandbox's name.
func (s *Shim) Name() string { return s.name }

// PID is the oac-shim process's id.
func (s *Shim) PID() int { return s.cmd.Process.Pid }

// Password is the daemon's password: Options.Password, or the one
// generated for this shim. Empty for an attached shim (its parent made
// it). Never in an event, argv or the environment.
func (s *Shim) Password() string { return s.password }

// oldest is the number of the oldest event kept; s.mu is held.
func (s *Shim) oldest() uint64 {
	if s.next < uint64(len(s.ring)) {
		return 0
	}
	return s.next - uint64(len(s.ring))
}

// History returns the events kept so far, oldest first (at most
// Options.History).
func (s *Shim) History() []api.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]api.Event, 0, s.next-s.oldest())
	for i := s.oldest(); i < s.next; i++ {
		out = append(out, s.ring[i%uint64(len(s.ring))])
	}
	return out
}

// From says where Events begins: the zero From is the oldest event kept.
type From struct {
	now bool
	seq uint64
}

// FromNow begins with the next event to arrive after Events is called.
func FromNow() From { return From{now: true} }

// FromSeq begins with the event of seq n (api.Event.Seq), or the first
// after it: to go on from where a reader stopped, give its last seq + 1.
func FromSeq(n uint64) From { return From{seq: n} }

// MissedError is yielded by Events when the iteration fell behind the
// bounded history: Missed events were dropped before it read them (with
// FromSeq, Missed counts seqs, which answers take too). The iteration
// goes on with the oldest event kept.
type MissedError struct{ Missed uint64 }

func (e *MissedError) Error() string {
	return fmt.Sprintf("client: %d events were dropped from the history before they were read (raise Options.History or read faster)", e.Missed)
}

// Events iterates over the events, in order, from the oldest kept (or
// FromNow, FromSeq), then each new one until the shim's output ends. It yields a
// non-nil error, with a zero event, when ctx ends (and stops) or when it
// fell behind the history (a *MissedError; it goes on). Each call
// iterates on its own.
func (s *Shim) Events(ctx context.Context, from From) iter.Seq2[api.Event, error] {
	s.mu.Lock()
	start := s.oldest()
	if from.now {
		start = s.next
	}
	s.mu.Unlock()
	return func(yield func(api.Event, error) bool) {
		i := start
		skip := from.seq > 0 // until the event of that seq
		for {
			s.mu.Lock()
			if old := s.oldest(); i < old {
				missed := old - i
				i = old
				s.mu.Unlock()
				if !yield(api.Event{}, &MissedError{Missed: missed}) {
					return
				}
				continue
			}
			if i < s.next {
				e := s.ring[i%uint64(len(s.ring))]
				i++
				s.mu.Unlock()
				if skip && e.Seq < from.seq {
					continue
				}
				if skip && i-1 == start && e.Seq > from.seq && i-1 > 0 {
					// Dropped from the history before Events was called.
					if !yield(api.Event{}, &MissedError{Missed: e.Seq - from.seq}) {
						return
					}
				}
				skip = false
				if !yield(e, nil) {
					return
				}
				continue
			}
			eof, notify := s.eof, s.notify
			s.mu.Unlock()
			if eof {
				return
			}
			select {
			case <-notify:
			case <-ctx.Done():
				yield(api.Event{}, ctx.Err())
				return
			}
		}
	}
}

// WaitEvent returns the first event, from the oldest kept, that matches
// pred, waiting until ctx ends or the shim exits (an *ExitedError).
func (s *Shim) WaitEvent(ctx context.Context, pred func(api.Event) bool) (api.Event, error) {
	return s.waitEvent(ctx, "the event", pred)
}

func (s *Shim) waitEvent(ctx context.Context, what string, pred func(api.Event) bool) (api.Event, error) {
	for e, err := range s.Events(ctx, From{}) {
		if err := s.schemaErr(); err != nil {
			return api.Event{}, err
		}
		var missed *MissedError
		if errors.As(err, &missed) {
			continue
		}
		if err != nil {
			return api.Event{}, err
		}
		if pred(e) {
			return e, nil
		}
	}
	return api.Event{}, s.exitedError(ctx, what)
}

func (s *Shim) schemaErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mismatch != nil {
		return s.mismatch
	}
	return nil
}

// exitedError says how the shim ended, once its process has (or ctx ended).
func (s *Shim) exitedError(ctx context.Context, what string) error {
	select {
	case <-s.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	return &ExitedError{Status: s.exitStatus(), Stderr: s.stderr.String(), What: what}
}

func (s *Shim) exitStatus() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.waitErr == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(s.waitErr, &ee) {
		return ee.ExitCode()
	}
	return -1
}

// WaitState waits for a state event in one of states and returns it. A
// failed state that was not asked for is returned as a *FailedError.
func (s *Shim) WaitState(ctx context.Context, states ...api.State) (api.Event, error) {
	names := make([]string, len(states))
	for i, st := range states {
		names[i] = string(st)
	}
	e, err := s.waitEvent(ctx, "state "+strings.Join(names, " or "), func(e api.Event) bool {
		if e.Event != api.KindState {
			return false
		}
		if e.State == api.StateFailed {
			return true
		}
		for _, st := range states {
			if e.State == st {
				return true
			}
		}
		return false
	})
	if err != nil {
		return e, err
	}
	for _, st := range states {
		if e.State == st {
			return e, nil
		}
	}
	return e, &FailedError{Code: e.Code, Message: e.Message, Event: e}
}

// Do sends one command and waits for its answer; result, when non-nil,
// receives the answer's result. The id is set here. A refused or failed
// command is a *CommandError with its answer code.
func (s *Shim) Do(ctx context.Context, c api.Command, result any) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	if s.eof {
		s.mu.Unlock()
		return s.exitedError(ctx, "the answer to "+c.Cmd)
	}
	s.nextID++
	c.ID = s.idPrefix + strconv.FormatUint(s.nextID, 10)
	ch := make(chan answer, 1)
	s.pending[c.ID] = ch
	s.mu.Unlock()
	forget := func() {
		s.mu.Lock()
		delete(s.pending, c.ID)
		s.mu.Unlock()
	}
	line, err := json.Marshal(c)
	if err != nil {
		forget()
		return fmt.Errorf("client: encode %s: %w", c.Cmd, err)
	}
	if err := s.write(ctx, append(line, '\n')); err != nil {
		forget()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return s.exitedError(ctx, "the answer to "+c.Cmd)
	}
	select {
	case a, ok := <-ch:
		if !ok {
			return s.exitedError(ctx, "the answer to "+c.Cmd)
		}
		if !a.OK {
			return &CommandError{Command: c.Cmd, Code: a.Code, Message: a.Error}
		}
		if result != nil && len(a.Result) > 0 {
			if err := json.Unmarshal(a.Result, result); err != nil {
				return fmt.Errorf("client: the answer to %s: %w", c.Cmd, err)
			}
		}
		return nil
	case <-ctx.Done():
		forget()
		return ctx.Err()
	}
}

// write writes one line to stdin once the password and bootstrap are
// out, giving up when ctx ends first.
func (s *Shim) write(ctx context.Context, line []byte) error {
	got := make(chan struct{})
	go func() { s.wmu.Lock(); close(got) }()
	select {
	case <-got:
	case <-ctx.Done():
		go func() { <-got; s.wmu.Unlock() }()
		return ctx.Err()
	}
	defer s.wmu.Unlock()
	_, err := s.stdin.Write(line)
	return err
}

// Status returns the sandbox's state, forwards and egress policy.
func (s *Shim) Status(ctx context.Context) (api.StatusResult, error) {
	var r api.StatusResult
	err := s.Do(ctx, api.Command{Cmd: api.CmdStatus}, &r)
	return r, err
}

// AddForward listens on listen (127.0.0.1:PORT, 127.0.0.1:0 for a free
// port, or a unix socket path) and carries connections to guestPort.
func (s *Shim) AddForward(ctx context.Context, listen string, guestPort int) (api.ForwardResult, error) {
	var r api.ForwardResult
	err := s.Do(ctx, api.Command{Cmd: api.CmdAddForward, Listen: listen, GuestPort: guestPort}, &r)
	return r, err
}

// RemoveForward closes the forward listening at listen.
func (s *Shim) RemoveForward(ctx context.Context, listen string) error {
	return s.Do(ctx, api.Command{Cmd: api.CmdRemoveForward, Listen: listen}, nil)
}

// SetPolicy replaces the egress policy.
func (s *Shim) SetPolicy(ctx context.Context, allow, upstreams []string) (api.PolicyResult, error) {
	var r api.PolicyResult
	err := s.Do(ctx, api.Command{Cmd: api.CmdSetPolicy, Allow: allow, Upstreams: upstreams}, &r)
	return r, err
}

// Restart aborts the attempt in flight and starts a new one.
func (s *Shim) Restart(ctx context.Context) (uint64, error) {
	var r api.StartResult
	err := s.Do(ctx, api.Command{Cmd: api.CmdStart}, &r)
	return r.Attempt, err
}

// Reset is Restart, after which what the sandbox kept is made afresh
// (the control API's reset).
func (s *Shim) Reset(ctx context.Context) (uint64, error) {
	var r api.StartResult
	err := s.Do(ctx, api.Command{Cmd: api.CmdReset}, &r)
	return r.Attempt, err
}

// ClaimRequest is what a claim hands a warm sandbox: the tenant's
// bootstrap and the egress policy and forwards it starts with.
type ClaimRequest struct {
	// Bootstrap is the bootstrap document, one JSON object as
	// Options.Bootstrap holds it (at most what fits in a 64 KiB command
	// line).
	Bootstrap json.RawMessage
	// Allow and Upstreams are the egress policy, as SetPolicy takes it.
	Allow, Upstreams []string
	// Forwards are opened as AddForward opens each, at most 64.
	Forwards []api.ForwardSpec
	// Volumes are host directories mounted at the guest's /home or
	// /environment (at most one each) before the bootstrap reaches the
	// guest, as oac-shim run --volume binds them. A relative host
	// directory is made absolute against this process's working
	// directory (the shim may run in another). Only providers that share
	// the host's kernel, under a root shim, can: the others refuse the
	// claim with unsupported and the sandbox stays warm.
	Volumes []api.VolumeSpec
}

// Claim makes a warm sandbox (oac-shim run --warm, waiting in state
// warm) the tenant's: its policy set, its forwards opened, its bootstrap
// sent. The result has the attempt it runs as, the forwards bound and the
// policy in force; its state then goes starting, then ready (WaitState).
// Bad input is a *CommandError coded invalid_argument, volumes its
// provider cannot mount one coded unsupported, and either way the sandbox
// stays warm; a sandbox that is not warm refuses with conflict.
func (s *Shim) Claim(ctx context.Context, r ClaimRequest) (api.ClaimResult, error) {
	var res api.ClaimResult
	vols, err := absVolumes(r.Volumes)
	if err != nil {
		return res, err
	}
	err = s.Do(ctx, api.Command{Cmd: api.CmdClaim, Bootstrap: r.Bootstrap, Allow: r.Allow, Upstreams: r.Upstreams, Forwards: r.Forwards, Volumes: vols}, &res)
	return res, err
}

// absVolumes is vs with each host directory absolute, in a new slice (the
// caller's is left as given).
func absVolumes(vs []api.VolumeSpec) ([]api.VolumeSpec, error) {
	if len(vs) == 0 {
		return nil, nil
	}
	out := make([]api.VolumeSpec, len(vs))
	for i, v := range vs {
		out[i] = v
		if v.Host == "" || filepath.IsAbs(v.Host) {
			continue // an empty one is refused by the shim, as invalid_argument
		}
		abs, err := filepath.Abs(v.Host)
		if err != nil {
			return nil, fmt.Errorf("client: claim: volume %s: %w", v.Guest, err)
		}
		out[i].Host = abs
	}
	return out, nil
}

// PushTime sends the host's clock to a VM guest.
func (s *Shim) PushTime(ctx context.Context) error {
	return s.Do(ctx, api.Command{Cmd: api.CmdPushTime}, nil)
}

// Stop asks for an orderly stop and waits for the shim to exit; it
// returns nil when the sandbox stopped cleanly. When ctx ends first the
// shim is killed (an attached one only detached) and ctx's error returned.
func (s *Shim) Stop(ctx context.Context) error {
	err := s.Do(ctx, api.Command{Cmd: api.CmdStop}, nil)
	if err != nil && !errors.Is(err, ErrExited) && ctx.Err() == nil && !s.attached {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
	}
	select {
	case <-s.done:
		return s.Wait()
	case <-ctx.Done():
		s.Kill()
		return ctx.Err()
	}
}

// Wait waits for the shim to exit and returns its exit error: nil after
// a clean stop, a *FailedError when the last state was failed, an
// *ExitedError for any other exit that is not 0.
func (s *Shim) Wait() error {
	<-s.done
	st := s.exitStatus()
	s.mu.Lock()
	var last api.Event
	for i := s.next; i > s.oldest(); i-- {
		if e := s.ring[(i-1)%uint64(len(s.ring))]; e.Event == api.KindState {
			last = e
			break
		}
	}
	s.mu.Unlock()
	if last.State == api.StateFailed {
		return &FailedError{Code: last.Code, Message: last.Message, Event: last}
	}
	if st != 0 {
		return &ExitedError{Status: st, Stderr: s.stderr.String()}
	}
	return nil
}

// Done is closed when the shim has exited.
func (s *Shim) Done() <-chan struct{} { return s.done }

// Kill kills the shim at once and waits for it: its runtime dies with it
// (for an attached shim, only the attach process dies).
func (s *Shim) Kill() {
	_ = s.cmd.Process.Kill()
	s.stdin.Close()
	<-s.done
}

// Close ends the shim's stdin and waits up to d for it to exit before
// killing it. For a shim Start launched without Outlive, the end of stdin
// stops the sandbox in order; with Outlive, or for an attached shim, it
// only lets this process go (the sandbox runs on).
func (s *Shim) Close(d time.Duration) error {
	s.stdin.Close() // a write in flight fails with it
	select {
	case <-s.done:
		return s.Wait()
	case <-time.After(d):
		s.Kill()
		return errors.New("client: oac-shim did not exit in time and was killed")
	}
}

// tail keeps the first and the last bytes written to it: what the shim
// said first (a usage error's line, before the flags it lists) and last.
type tail struct {
	mu    sync.Mutex
	head  []byte
	buf   []byte
	wrote int
}

const (
	headMax = 1 << 10
	tailMax = 3 << 10
)

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(p)
	t.wrote += n
	if room := headMax - len(t.head); room > 0 {
		k := min(room, len(p))
		t.head = append(t.head, p[:k]...)
		p = p[k:]
	}
	t.buf = append(t.buf, p...)
	if len(t.buf) > tailMax {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-tailMax:]...)
	}
	return n, nil
}

// String is the text kept, in whole lines, trimmed: the head, and the
// tail when more was written than both hold.
func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.wrote <= headMax+tailMax {
		return strings.TrimSpace(string(t.head) + string(t.buf))
	}
	head, rest := t.head, t.buf
	if i := bytes.LastIndexByte(head, '\n'); i >= 0 {
		head = head[:i]
	}
	if i := bytes.IndexByte(rest, '\n'); i >= 0 {
		rest = rest[i+1:]
	}
	return strings.TrimSpace(string(head)) + "\n...\n" + strings.TrimSpace(string(rest))
}
