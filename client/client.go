package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/oac/sandbox-agent/api"
)

// Options say how to launch oac-shim.
type Options struct {
	// Shim is the oac-shim binary (default "oac-shim", found in PATH).
	Shim string
	// Name is the sandbox's name (--name).
	Name string
	// Args are more flags of `oac-shim run` (--provider, --bootstrap,
	// --forward, --password-file, ...). --name and --control are set here.
	Args []string
	// Env is the shim's environment (nil: this process's).
	Env []string
	// Stderr receives the shim's diagnostics (nil: discarded).
	Stderr io.Writer
	// OnEvent, when set, sees every event in order (not answers). It runs
	// on the reader goroutine and must not block.
	OnEvent func(api.Event)
}

// ErrExited is returned for a request to a shim that has exited.
var ErrExited = errors.New("oac-shim has exited")

// Shim is one running oac-shim process.
type Shim struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	wmu   sync.Mutex // serializes command lines

	mu      sync.Mutex
	all     []api.Event
	notify  chan struct{} // closed and replaced on each event and at EOF
	eof     bool
	pending map[string]chan answer
	nextID  uint64

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

// Start launches `oac-shim run --name NAME --control stdin ARGS...`.
// ctx bounds only the launch; use Stop or Kill to end the shim.
func Start(ctx context.Context, o Options) (*Shim, error) {
	if o.Name == "" {
		return nil, errors.New("client: a sandbox name is required")
	}
	shim := o.Shim
	if shim == "" {
		shim = "oac-shim"
	}
	args := append([]string{"run", "--name", o.Name, "--control", "stdin"}, o.Args...)
	cmd := exec.Command(shim, args...)
	cmd.Env = o.Env
	cmd.Stderr = o.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	// Not StdoutPipe: Wait would close it as soon as the process exits
	// and the last events could be lost.
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout = w
	if err := ctx.Err(); err != nil {
		r.Close()
		w.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("client: start %s: %w", shim, err)
	}
	w.Close()
	s := &Shim{cmd: cmd, stdin: stdin, notify: make(chan struct{}), pending: map[string]chan answer{}, done: make(chan struct{})}
	readerDone := make(chan struct{})
	go func() { defer close(readerDone); s.read(r, o.OnEvent) }()
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
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		var kind struct {
			Event string `json:"event"`
		}
		if json.Unmarshal(sc.Bytes(), &kind) != nil {
			continue
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
		s.all = append(s.all, e)
		close(s.notify)
		s.notify = make(chan struct{})
		s.mu.Unlock()
	}
}

// Events returns every event received so far.
func (s *Shim) Events() []api.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]api.Event(nil), s.all...)
}

// WaitEvent returns the first event since the start that matches pred,
// waiting until ctx ends or the shim exits.
func (s *Shim) WaitEvent(ctx context.Context, pred func(api.Event) bool) (api.Event, error) {
	i := 0
	for {
		s.mu.Lock()
		for ; i < len(s.all); i++ {
			if pred(s.all[i]) {
				e := s.all[i]
				s.mu.Unlock()
				return e, nil
			}
		}
		eof, notify := s.eof, s.notify
		s.mu.Unlock()
		if eof {
			return api.Event{}, ErrExited
		}
		select {
		case <-notify:
		case <-ctx.Done():
			return api.Event{}, ctx.Err()
		}
	}
}

// WaitState waits for a state event in one of states and returns it. A
// failed state that was not asked for is returned as a *FailedError.
func (s *Shim) WaitState(ctx context.Context, states ...api.State) (api.Event, error) {
	e, err := s.WaitEvent(ctx, func(e api.Event) bool {
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

// FailedError is a failed state a caller did not wait for: Code is its
// failure code (api.Failures says what to do about each).
type FailedError struct {
	Code    string
	Message string
	Event   api.Event
}

func (e *FailedError) Error() string {
	return fmt.Sprintf("sandbox failed (%s): %s", e.Code, e.Message)
}

// Do sends one command and waits for its answer; result, when non-nil,
// receives the answer's result. The id is set here. A refused or failed
// command's error carries its answer code: api.AnswerCode(err).
func (s *Shim) Do(ctx context.Context, c api.Command, result any) error {
	s.mu.Lock()
	if s.eof {
		s.mu.Unlock()
		return ErrExited
	}
	s.nextID++
	c.ID = "c" + strconv.FormatUint(s.nextID, 10)
	ch := make(chan answer, 1)
	s.pending[c.ID] = ch
	s.mu.Unlock()
	line, err := json.Marshal(c)
	if err != nil {
		return err
	}
	s.wmu.Lock()
	_, err = s.stdin.Write(append(line, '\n'))
	s.wmu.Unlock()
	if err != nil {
		s.mu.Lock()
		delete(s.pending, c.ID)
		s.mu.Unlock()
		return fmt.Errorf("%s: %w (%v)", c.Cmd, ErrExited, err)
	}
	select {
	case a, ok := <-ch:
		if !ok {
			return fmt.Errorf("%s: %w", c.Cmd, ErrExited)
		}
		if !a.OK {
			// The answer's code travels with the error: api.AnswerCode(err).
			return fmt.Errorf("%s: %w", c.Cmd, api.Refuse(a.Code, errors.New(a.Error)))
		}
		if result != nil && len(a.Result) > 0 {
			return json.Unmarshal(a.Result, result)
		}
		return nil
	case <-ctx.Done():
		s.mu.Lock()
		delete(s.pending, c.ID)
		s.mu.Unlock()
		return ctx.Err()
	}
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

// PushTime sends the host's clock to a VM guest.
func (s *Shim) PushTime(ctx context.Context) error {
	return s.Do(ctx, api.Command{Cmd: api.CmdPushTime}, nil)
}

// Stop asks for an orderly stop and waits for the shim to exit; it
// returns nil when the sandbox stopped cleanly. When ctx ends first the
// shim is killed.
func (s *Shim) Stop(ctx context.Context) error {
	err := s.Do(ctx, api.Command{Cmd: api.CmdStop}, nil)
	if err != nil && !errors.Is(err, ErrExited) {
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

// Wait waits for the shim to exit and returns its exit error (nil after a
// clean stop; *exec.ExitError with the status of the failure code's class
// after a failure, api.FailureOf(code).Exit).
func (s *Shim) Wait() error {
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waitErr
}

// Done is closed when the shim has exited.
func (s *Shim) Done() <-chan struct{} { return s.done }

// Kill kills the shim at once (its runtime dies with it) and waits.
func (s *Shim) Kill() {
	_ = s.cmd.Process.Kill()
	s.stdin.Close()
	<-s.done
}

// Close ends the shim's control input, which stops the sandbox in order,
// and waits up to d for the shim to exit before killing it.
func (s *Shim) Close(d time.Duration) error {
	s.stdin.Close()
	select {
	case <-s.done:
		return s.Wait()
	case <-time.After(d):
		s.Kill()
		return errors.New("client: oac-shim did not exit in time and was killed")
	}
}
