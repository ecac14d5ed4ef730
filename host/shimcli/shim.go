package shimcli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/egress"
	"github.com/oac/sandbox-agent/host/apiserver"
	"github.com/oac/sandbox-agent/host/failure"
	"github.com/oac/sandbox-agent/host/forward"
	"github.com/oac/sandbox-agent/host/kept"
	"github.com/oac/sandbox-agent/host/lifecycle"
	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/sandbox"
	"github.com/oac/sandbox-agent/internal/sockfile"
	"github.com/oac/sandbox-agent/internal/systemd"
)

// shim is one running oac-shim: the controller that runs the sandbox's
// attempts, the forwards, the egress broker, the control API and systemd.
type shim struct {
	f      *runFlags
	name   string
	sink   *api.JSONLines
	log    *slog.Logger
	broker *egress.Broker
	fwd    *forward.Manager
	ctrl   *lifecycle.Controller
	notify *systemd.Notifier
	// base is the sandbox configuration each attempt starts from.
	base sandbox.Config
	// kept is the kept sandbox this shim runs (oac-shim start); nil for
	// a throwaway one (oac-shim run).
	kept *kept.Lease
	// passwordOut, when set, receives each attempt's password as a line
	// "ATTEMPT PASSWORD" (--password-fd).
	passwordOut io.Writer

	mu      sync.Mutex
	sess    *sandbox.Session
	results map[uint64]error // each attempt's error (nil: stopped)
	resets  map[uint64]bool  // attempts a reset command started
	stopReq chan error       // the first stop request (signal, command, timeout)
	stopped bool
	// passwordWritten: --password-file holds an earlier attempt's
	// password, which the next one replaces.
	passwordWritten bool
	// claims carries a claim to a warm attempt (warm.go); claimMu makes
	// claims one at a time, claimed says one was taken.
	claims  chan sandbox.Claim
	claimMu sync.Mutex
	claimed bool

	// Answers and the shim's own events on the events output end when run
	// returns: the stdin reader cannot be interrupted and may outlive it.
	answerMu      sync.Mutex
	answersClosed bool
}

var errAnswersClosed = errors.New("the shim has stopped")

// answerOut writes an answer to the events output while run runs.
func (s *shim) answerOut(a api.Answer) error {
	s.answerMu.Lock()
	defer s.answerMu.Unlock()
	if s.answersClosed {
		return errAnswersClosed
	}
	return s.sink.Encode(a)
}

func newShim(f *runFlags, sink *api.JSONLines, log *slog.Logger, broker *egress.Broker) *shim {
	s := &shim{f: f, name: f.name, sink: sink, log: log, broker: broker,
		notify: systemd.NewNotifier(log), results: map[uint64]error{}, resets: map[uint64]bool{}, stopReq: make(chan error, 1),
		claims: make(chan sandbox.Claim)}
	s.fwd = forward.New(forward.Config{MaxStreams: f.forwardMaxStreams, Log: log.With("part", "forward"), Emit: s.emit})
	s.ctrl = lifecycle.New(lifecycle.Config{Name: f.name, Job: s.job, OnChange: s.onChange, Classify: failure.Code})
	return s
}

func (s *shim) emit(e api.Event) {
	if e.Time.IsZero() {
		e.Time = time.Now().UTC()
	}
	e.Sandbox = s.name
	s.answerMu.Lock()
	defer s.answerMu.Unlock()
	if !s.answersClosed {
		s.sink.Emit(e)
	}
}

// onChange turns every accepted lifecycle change into a state event and
// tells systemd.
func (s *shim) onChange(st api.Status) {
	// The first start is reported by the sandbox itself once it creates
	// something ("creating sandbox"): input that fails validation before
	// that yields exactly one event, failed, as it always has.
	if st.Attempt == 1 && st.State == api.StateStarting && st.Message == lifecycle.MsgStartRequested {
		s.notify.Status(statusLine(st))
		return
	}
	s.emit(api.Event{Event: api.KindState, State: st.State, Message: st.Message, Code: st.Code, URL: st.URL,
		GuestURL: st.GuestURL, Username: st.Username, Attempt: st.Attempt})
	switch st.State {
	case api.StateReady:
		s.notify.Ready(statusLine(st))
	default:
		s.notify.Status(statusLine(st))
	}
}

// job runs one attempt: the sandbox, with its state events going through
// the controller (which drops those of a stale attempt) and its session
// handed to the forwards and the control API.
func (s *shim) job(ctx context.Context, attempt uint64, r lifecycle.Reporter) error {
	if err := s.resetFirst(ctx, attempt); err != nil {
		return err
	}
	s.mu.Lock()
	cfg := s.base
	s.mu.Unlock()
	cfg.Events = api.Func(func(e api.Event) {
		e.Attempt = attempt
		if e.Event == api.KindState {
			r.Report(lifecycle.Update{State: e.State, Message: e.Message, Code: e.Code, URL: e.URL, GuestURL: e.GuestURL, Username: e.Username})
			return
		}
		s.sink.Emit(e)
	})
	cfg.Attach = func(sess *sandbox.Session) {
		s.mu.Lock()
		s.sess = sess
		s.mu.Unlock()
		if sess == nil {
			s.fwd.SetOpener(nil)
		} else {
			s.fwd.SetOpener(sess)
		}
	}
	cfg.MapURL = s.fwd.URLFor
	if s.passwordOut != nil || s.f.passwordFile != "" {
		cfg.PasswordOut = func(password string) error { return s.handPassword(attempt, password) }
	}
	err := sandbox.Run(ctx, cfg)
	s.mu.Lock()
	s.results[attempt] = err
	s.mu.Unlock()
	return err
}

// handPassword hands attempt's daemon password to the caller: a line
// "ATTEMPT PASSWORD" on --password-fd, and --password-file's content. The
// file is created exclusively by the first attempt that writes it (the
// caller's path must not exist) and replaced whole by each later one,
// since each attempt may have a password of its own (a generated one is).
func (s *shim) handPassword(attempt uint64, password string) error {
	if s.passwordOut != nil {
		if _, err := fmt.Fprintf(s.passwordOut, "%d %s\n", attempt, password); err != nil {
			return fmt.Errorf("--password-fd %d: attempt %d's password: %w (the descriptor must stay open for a line per attempt)", s.f.passwordFD, attempt, err)
		}
	}
	path := s.f.passwordFile
	if path == "" {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.passwordWritten {
		if err := sandbox.WriteSecret(path, password); err != nil {
			return err
		}
		s.passwordWritten = true
		return nil
	}
	if err := sandbox.ReplaceSecret(path, password); err != nil {
		return fmt.Errorf("attempt %d: %w", attempt, err)
	}
	return nil
}

// resetFirst runs before an attempt a reset command started: the previous
// attempt has ended (the controller runs one job at a time), so what the
// provider left of the sandbox can be removed (provider.Resetter).
func (s *shim) resetFirst(ctx context.Context, attempt uint64) error {
	s.mu.Lock()
	reset := s.resets[attempt]
	delete(s.resets, attempt)
	s.mu.Unlock()
	if !reset {
		return nil
	}
	if s.kept != nil {
		if err := s.kept.Reset(ctx); err != nil {
			return err
		}
		s.emit(api.Event{Event: api.KindKept, Message: "reset: the kept state was discarded; the sandbox starts afresh from its image"})
	}
	r, ok := s.base.Provider.(provider.Resetter)
	if !ok {
		return nil
	}
	if err := r.Reset(ctx, s.name); err != nil {
		return fmt.Errorf("reset %s sandbox: %w", s.base.Provider.Name(), err)
	}
	return nil
}

// requestStop asks for an orderly stop, after which the shim exits.
func (s *shim) requestStop(reason error) {
	select {
	case s.stopReq <- reason:
	default:
	}
}

// run starts the sandbox and the control API and returns when the
// sandbox has ended and no new attempt is in flight: nil after a stop,
// the reason after a failure.
func (s *shim) run(stdin io.Reader) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	defer func() {
		s.answerMu.Lock()
		s.answersClosed = true
		s.answerMu.Unlock()
	}()
	var bg sync.WaitGroup
	defer bg.Wait()
	defer cancel()
	s.watchSignals(ctx)
	bg.Add(1)
	go func() { defer bg.Done(); s.notify.Watchdog(ctx, nil) }()
	if s.f.timeout > 0 {
		t := time.AfterFunc(s.f.timeout, func() { s.requestStop(fmt.Errorf("run time limit of %s reached", s.f.timeout)) })
		defer t.Stop()
	}
	srv := &apiserver.Server{Sandbox: s.name, Handler: s, Log: s.log.With("part", "control")}
	if s.f.controlSocket != "" {
		ln, err := sockfile.Listen(s.f.controlSocket)
		if err != nil {
			err = failure.With(failure.ErrInvalidConfig, fmt.Errorf("nothing created: control socket: %w", err))
			s.emit(api.Event{Event: api.KindState, State: api.StateFailed, Message: err.Error(), Code: failure.Code(err)})
			return err
		}
		bg.Add(1)
		go func() { defer bg.Done(); srv.ServeSocket(ctx, ln) }()
	}
	if s.f.control == "stdin" {
		// Not waited for: a read from stdin cannot be interrupted.
		go func() {
			err := srv.ServeLines(ctx, stdin, s.answerOut)
			if ctx.Err() == nil && !errors.Is(err, errAnswersClosed) {
				if s.f.outlive {
					s.log.Info("control input ended; the sandbox outlives its parent (--outlive-parent): stop it with oac-shim stop, its control socket or SIGTERM", "err", err)
					return
				}
				reason := errors.New("control input closed")
				if err != nil {
					reason = fmt.Errorf("control input failed: %w", err)
				}
				s.requestStop(reason)
			}
		}()
	}
	s.announce() // the control API is served and SIGTERM handled: stop may find it
	if _, err := s.ctrl.Start(); err != nil {
		return err
	}
	for {
		done := s.ctrl.Done()
		select {
		case reason := <-s.stopReq:
			s.mu.Lock()
			s.stopped = true
			s.mu.Unlock()
			s.notify.Stopping("stopping: " + reason.Error())
			_ = s.ctrl.StopBecause(context.Background(), reason)
			// A start that raced the stop is stopped too.
			for s.ctrl.Done() != done {
				done = s.ctrl.Done()
				_ = s.ctrl.StopBecause(context.Background(), reason)
			}
			s.ctrl.Wait()
			return s.result()
		case <-done:
			if s.ctrl.Done() != done {
				continue // a new attempt was started meanwhile
			}
			s.notify.Stopping("stopping: " + string(s.ctrl.Status().State))
			s.ctrl.Wait()
			return s.result()
		}
	}
}

// result is the error of the current attempt (nil when it stopped).
func (s *shim) result() error {
	st := s.ctrl.Status()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.results[st.Attempt]; err != nil {
		return err
	}
	if st.State == api.StateFailed {
		return failure.WithCode(st.Code, errors.New(st.Message))
	}
	return nil
}

// session returns the live guest session, or an error when none is
// connected.
// errNoGuest: a command needs the guest's session and none is live.
var errNoGuest = errors.New("no guest is connected")

func (s *shim) session() (*sandbox.Session, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sess == nil {
		return nil, errNoGuest
	}
	return s.sess, nil
}
