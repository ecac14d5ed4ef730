package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/oac/sandbox-agent/api"
)

// MsgStartRequested is the message of the starting state Start sets.
const MsgStartRequested = "start requested"

// ErrDestroyed is returned by Start and Reset after Destroy.
var ErrDestroyed = errors.New("sandbox destroyed")

// Update is what a job reports: a state and its details.
type Update struct {
	State   api.State
	Message string
	// Code is the failure code of a failed state.
	Code     string
	URL      string
	GuestURL string
	Username string
	// Password is kept for Status callers and never serialized.
	Password string
}

// Reporter is handed to a job: Report passes an update of the job's
// attempt and returns whether it was accepted (false: the attempt is no
// longer current, or the transition is not allowed).
type Reporter interface {
	Report(Update) bool
}

// Job runs one attempt until ctx is cancelled (then it stops in order and
// returns nil) or the attempt fails (it returns why). It reports its
// progress through r. A nil return without cancellation counts as
// stopped; an error, at any time (after ready too), as failed.
type Job func(ctx context.Context, attempt uint64, r Reporter) error

// Config configures a Controller.
type Config struct {
	Name string
	Job  Job
	// Destroy removes what persists of the sandbox (reset, destroy); nil
	// when nothing does.
	Destroy func(ctx context.Context) error
	// OnChange sees every accepted change, in order. It must not call back
	// into the controller's Start, Stop, Reset or Destroy.
	OnChange func(api.Status)
	// Classify gives the failure code of a job's error when the job did
	// not report its failure itself; nil leaves the code empty.
	Classify func(error) string
}

// Controller runs the jobs of one sandbox.
type Controller struct {
	cfg Config

	mu        sync.Mutex
	status    api.Status
	cancel    context.CancelCauseFunc
	done      chan struct{} // closed when the current attempt's job ended
	destroyed bool
	dropped   uint64

	emitMu sync.Mutex
	wg     sync.WaitGroup
}

// New returns a controller in state stopped at attempt 0.
func New(cfg Config) *Controller {
	done := make(chan struct{})
	close(done)
	return &Controller{
		cfg:    cfg,
		status: api.Status{ServerID: api.ServerID(cfg.Name), State: api.StateStopped},
		cancel: func(error) {},
		done:   done,
	}
}

// Status returns the current state.
func (c *Controller) Status() api.Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.status
}

// Dropped counts reports dropped because their attempt was stale or their
// transition not allowed.
func (c *Controller) Dropped() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dropped
}

// Done returns a channel closed when the current attempt's job has ended
// (already closed when nothing runs).
func (c *Controller) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.done
}

// set applies st and hands it to OnChange in order; c.mu is held and is
// released here.
func (c *Controller) setLocked(st api.Status) {
	c.status = st
	c.emitMu.Lock()
	c.mu.Unlock()
	defer c.emitMu.Unlock()
	if c.cfg.OnChange != nil {
		c.cfg.OnChange(st)
	}
}

// Start aborts the attempt in flight (if any) and starts a new one, which
// runs once the previous job has ended. It returns the new attempt.
func (c *Controller) Start() (uint64, error) {
	c.mu.Lock()
	if c.destroyed {
		c.mu.Unlock()
		return 0, ErrDestroyed
	}
	attempt := c.status.Attempt + 1
	c.cancel(fmt.Errorf("superseded by attempt %d", attempt))
	prev := c.done
	ctx, cancel := context.WithCancelCause(context.Background())
	done := make(chan struct{})
	c.cancel, c.done = cancel, done
	msg := MsgStartRequested
	if attempt > 1 {
		msg = fmt.Sprintf("%s (attempt %d)", MsgStartRequested, attempt)
	}
	c.wg.Add(1)
	c.setLocked(api.Status{ServerID: c.status.ServerID, State: api.StateStarting, Message: msg, Attempt: attempt})
	go c.run(ctx, cancel, attempt, prev, done)
	return attempt, nil
}

func (c *Controller) run(ctx context.Context, cancel context.CancelCauseFunc, attempt uint64, prev <-chan struct{}, done chan struct{}) {
	defer c.wg.Done()
	defer close(done)
	defer cancel(nil)
	<-prev // single flight: the previous job has fully ended
	r := reporter{c: c, attempt: attempt}
	if ctx.Err() != nil {
		r.Report(Update{State: api.StateStopped, Message: "stopped before it started: " + cause(ctx)})
		return
	}
	err := c.cfg.Job(ctx, attempt, r)
	switch {
	case err != nil:
		u := Update{State: api.StateFailed, Message: err.Error()}
		if c.cfg.Classify != nil {
			u.Code = c.cfg.Classify(err)
		}
		r.Report(u)
	case ctx.Err() != nil:
		r.Report(Update{State: api.StateStopped, Message: "stopped: " + cause(ctx)})
	default:
		r.Report(Update{State: api.StateStopped, Message: "stopped on its own"})
	}
}

func cause(ctx context.Context) string {
	if c := context.Cause(ctx); c != nil && c != context.Canceled {
		return c.Error()
	}
	return "stop requested"
}

type reporter struct {
	c       *Controller
	attempt uint64
}

// Report applies u if its attempt is current and the transition allowed.
func (r reporter) Report(u Update) bool { return r.c.report(r.attempt, u) }

// allowed reports whether from -> to is a transition within one attempt.
func allowed(from, to api.State) bool {
	switch from {
	case api.StateStarting:
		return to == api.StateStarting || to == api.StateWarm || to == api.StateReady || to == api.StateFailed || to == api.StateStopped
	case api.StateWarm:
		// Claimed (starting again), or ended while warm.
		return to == api.StateStarting || to == api.StateFailed || to == api.StateStopped
	case api.StateReady:
		return to == api.StateFailed || to == api.StateStopped
	}
	return false // failed and stopped end an attempt
}

func (c *Controller) report(attempt uint64, u Update) bool {
	c.mu.Lock()
	if attempt != c.status.Attempt || !allowed(c.status.State, u.State) {
		c.dropped++
		c.mu.Unlock()
		return false
	}
	st := api.Status{ServerID: c.status.ServerID, State: u.State, Message: u.Message, Attempt: attempt}
	if u.State == api.StateFailed {
		st.Code = u.Code
	}
	if u.State == api.StateReady {
		st.URL, st.GuestURL, st.Username, st.Password = u.URL, u.GuestURL, u.Username, u.Password
	}
	c.setLocked(st)
	return true
}

// Stop aborts the current attempt and waits until its job has ended (or
// ctx ends). Stopping a sandbox that is not running does nothing.
func (c *Controller) Stop(ctx context.Context) error {
	return c.stop(ctx, errors.New("stop requested"))
}

// StopBecause is Stop with the reason the job sees as its context's cause
// (and reports in its stopped message).
func (c *Controller) StopBecause(ctx context.Context, reason error) error {
	return c.stop(ctx, reason)
}

func (c *Controller) stop(ctx context.Context, why error) error {
	c.mu.Lock()
	c.cancel(why)
	done := c.done
	c.mu.Unlock()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stop: %w", context.Cause(ctx))
	}
}

// Reset stops the sandbox, removes what persists and starts it afresh.
func (c *Controller) Reset(ctx context.Context) (uint64, error) {
	c.mu.Lock()
	destroyed := c.destroyed
	c.mu.Unlock()
	if destroyed {
		return 0, ErrDestroyed
	}
	if err := c.stop(ctx, errors.New("reset requested")); err != nil {
		return 0, err
	}
	if c.cfg.Destroy != nil {
		if err := c.cfg.Destroy(ctx); err != nil {
			return 0, fmt.Errorf("reset: %w", err)
		}
	}
	return c.Start()
}

// Destroy stops the sandbox, removes what persists, and refuses every
// later start.
func (c *Controller) Destroy(ctx context.Context) error {
	c.mu.Lock()
	c.destroyed = true
	c.mu.Unlock()
	if err := c.stop(ctx, errors.New("destroy requested")); err != nil {
		return err
	}
	if c.cfg.Destroy != nil {
		if err := c.cfg.Destroy(ctx); err != nil {
			return fmt.Errorf("destroy: %w", err)
		}
	}
	c.mu.Lock()
	c.setLocked(api.Status{ServerID: c.status.ServerID, State: api.StateStopped, Message: "destroyed", Attempt: c.status.Attempt})
	return nil
}

// Wait waits for every job goroutine to end (tests, shutdown).
func (c *Controller) Wait() { c.wg.Wait() }
