package supervise

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// Defaults of the restart policy: 100 ms to 30 s, the bounds oac-sandbox-io
// uses for its own reconnects (docs/contract.md).
const (
	DefaultMin = 100 * time.Millisecond
	DefaultMax = 30 * time.Second
	// DefaultResetAfter is how long a run must stay up for the next
	// failure to start again from DefaultMin.
	DefaultResetAfter = 10 * time.Second
)

// Backoff computes restart delays. Delay n (from 0) is drawn from
// [b, b*1.5) with b = Min*2^n, capped at Max, so consecutive delays of a
// crash loop never decrease. The zero value uses the defaults.
type Backoff struct {
	Min, Max, ResetAfter time.Duration
	// Rand returns a number in [0, 1); default math/rand/v2.
	Rand func() float64
	n    int
}

func (b *Backoff) defaults() {
	if b.Min <= 0 {
		b.Min = DefaultMin
	}
	if b.Max <= 0 {
		b.Max = DefaultMax
	}
	if b.ResetAfter <= 0 {
		b.ResetAfter = DefaultResetAfter
	}
	if b.Rand == nil {
		b.Rand = rand.Float64
	}
}

// Next returns the delay before the next start, given how long the run
// that just ended stayed up.
func (b *Backoff) Next(upFor time.Duration) time.Duration {
	b.defaults()
	if upFor >= b.ResetAfter {
		b.n = 0
	}
	base := b.Min
	for i := 0; i < b.n && base < b.Max; i++ {
		base *= 2
	}
	if base >= b.Max {
		return b.Max
	}
	b.n++
	d := base + time.Duration(b.Rand()*float64(base/2))
	return min(d, b.Max)
}

// Exit is how a run ended.
type Exit struct {
	// Code is the exit status, or -1 when Signal is set.
	Code   int
	Signal string
}

func (e Exit) String() string {
	if e.Signal != "" {
		return "killed by signal " + e.Signal
	}
	return fmt.Sprintf("exit status %d", e.Code)
}

// Run is one started process: Exited receives its exit once.
type Run struct {
	PID    int
	Exited <-chan Exit
}

// Clock is time as the supervisor sees it.
type Clock interface {
	Now() time.Time
	After(time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// ErrFatal wraps the error Run returns for an exit that is not restarted.
var ErrFatal = errors.New("not restarted")

// Restart describes one decision to start again.
type Restart struct {
	// Restarts counts restarts so far, this one included.
	Restarts int
	// In is the delay before the start.
	In   time.Duration
	Exit Exit
}

// Supervisor keeps one process running.
type Supervisor struct {
	// Name appears in errors.
	Name string
	// Start starts the process; restarts counts earlier restarts.
	Start func(restarts int) (Run, error)
	// Fatal reports whether an exit ends supervision as a failure.
	Fatal func(Exit) bool
	// Restarting is called before each delay.
	Restarting func(Restart)
	Backoff    *Backoff
	Clock      Clock
}

// Run starts the process and starts it again after every exit until ctx is
// done (it returns nil without waiting for the current process: the caller
// stops it), an exit is fatal (an error wrapping ErrFatal) or a start fails.
func (s *Supervisor) Run(ctx context.Context) error {
	if s.Clock == nil {
		s.Clock = realClock{}
	}
	if s.Backoff == nil {
		s.Backoff = &Backoff{}
	}
	restarts := 0
	for {
		started := s.Clock.Now()
		r, err := s.Start(restarts)
		if err != nil {
			return fmt.Errorf("start %s: %w", s.Name, err)
		}
		var e Exit
		select {
		case e = <-r.Exited:
		case <-ctx.Done():
			return nil
		}
		if ctx.Err() != nil {
			return nil // the exit the stop caused
		}
		if s.Fatal != nil && s.Fatal(e) {
			return fmt.Errorf("%s %s: %w", s.Name, e, ErrFatal)
		}
		d := s.Backoff.Next(s.Clock.Now().Sub(started))
		restarts++
		if s.Restarting != nil {
			s.Restarting(Restart{Restarts: restarts, In: d, Exit: e})
		}
		select {
		case <-s.Clock.After(d):
		case <-ctx.Done():
			return nil
		}
	}
}
