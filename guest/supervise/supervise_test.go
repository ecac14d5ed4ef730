package supervise

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func fixed(v float64) func() float64 { return func() float64 { return v } }

func TestBackoffDoublesWithJitterUpTo30s(t *testing.T) {
	for _, r := range []float64{0, 0.5, 0.999} {
		b := &Backoff{Rand: fixed(r)}
		var prev time.Duration
		base := 100 * time.Millisecond
		for i := range 20 {
			d := b.Next(0)
			lo, hi := min(base, 30*time.Second), min(base+base/2, 30*time.Second)
			assert.GreaterOrEqual(t, d, lo, "delay %d", i)
			assert.LessOrEqual(t, d, hi, "delay %d", i)
			assert.GreaterOrEqual(t, d, prev, "delays of a crash loop never decrease")
			prev = d
			base *= 2
		}
		assert.Equal(t, 30*time.Second, prev, "capped at the maximum")
	}
	b := &Backoff{Rand: fixed(0)}
	assert.Equal(t, 100*time.Millisecond, b.Next(0), "the first delay is the minimum")
}

func TestBackoffResetsAfterARunThatStayedUp(t *testing.T) {
	b := &Backoff{Rand: fixed(0)}
	for range 5 {
		b.Next(time.Second)
	}
	assert.Equal(t, 3200*time.Millisecond, b.Next(9*time.Second), "a short run keeps growing")
	assert.Equal(t, 100*time.Millisecond, b.Next(10*time.Second), "a run of 10s resets")
	assert.Equal(t, 200*time.Millisecond, b.Next(0))
}

// fakeClock fires After channels when the test advances it.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []chan time.Time
	asked   chan time.Duration
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Unix(1000, 0), asked: make(chan time.Duration, 100)}
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	c.mu.Lock()
	c.waiters = append(c.waiters, ch)
	c.mu.Unlock()
	c.asked <- d
	return ch
}

// fire advances the clock by d and releases every pending After.
func (c *fakeClock) fire(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	for _, w := range c.waiters {
		w <- c.now
	}
	c.waiters = nil
}

// script hands out runs whose exits the test controls.
type script struct {
	mu     sync.Mutex
	starts int
	exits  []chan Exit
}

func (s *script) start(int) (Run, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := make(chan Exit, 1)
	s.exits = append(s.exits, ch)
	s.starts++
	return Run{PID: 100 + s.starts, Exited: ch}, nil
}

func (s *script) exit(e Exit) {
	s.mu.Lock()
	ch := s.exits[len(s.exits)-1]
	s.mu.Unlock()
	ch <- e
}

func (s *script) count() int { s.mu.Lock(); defer s.mu.Unlock(); return s.starts }

func TestCrashLoopRestartsWithGrowingDelaysAndReportsEach(t *testing.T) {
	clock, sc := newFakeClock(), &script{}
	var mu sync.Mutex
	var restarts []Restart
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	s := &Supervisor{
		Name: "oac-sandbox-io", Start: sc.start, Clock: clock,
		Fatal:      func(e Exit) bool { return e.Code == 2 },
		Backoff:    &Backoff{Rand: fixed(0.5)},
		Restarting: func(r Restart) { mu.Lock(); restarts = append(restarts, r); mu.Unlock() },
	}
	go func() { done <- s.Run(ctx) }()
	want := []time.Duration{125 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond}
	for i, w := range want {
		require.Eventually(t, func() bool { return sc.count() == i+1 }, 5*time.Second, time.Millisecond)
		sc.exit(Exit{Code: 1})
		assert.Equal(t, w, <-clock.asked)
		clock.fire(w)
	}
	require.Eventually(t, func() bool { return sc.count() == 4 }, 5*time.Second, time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, restarts, 3)
	for i, r := range restarts {
		assert.Equal(t, i+1, r.Restarts)
		assert.Equal(t, want[i], r.In)
		assert.Equal(t, "exit status 1", r.Exit.String())
	}
}

func TestFatalExitIsNotRestarted(t *testing.T) {
	clock, sc := newFakeClock(), &script{}
	done := make(chan error, 1)
	s := &Supervisor{Name: "oac-sandbox-io", Start: sc.start, Clock: clock, Fatal: func(e Exit) bool { return e.Code == 2 }}
	go func() { done <- s.Run(context.Background()) }()
	require.Eventually(t, func() bool { return sc.count() == 1 }, 5*time.Second, time.Millisecond)
	sc.exit(Exit{Code: 2})
	err := <-done
	require.ErrorIs(t, err, ErrFatal)
	assert.EqualError(t, err, "oac-sandbox-io exit status 2: not restarted")
	assert.Equal(t, 1, sc.count())
}

func TestAStopDuringTheDelayStartsNothingMore(t *testing.T) {
	clock, sc := newFakeClock(), &script{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	s := &Supervisor{Name: "p", Start: sc.start, Clock: clock}
	go func() { done <- s.Run(ctx) }()
	require.Eventually(t, func() bool { return sc.count() == 1 }, 5*time.Second, time.Millisecond)
	sc.exit(Exit{Signal: "killed"})
	<-clock.asked
	cancel()
	require.NoError(t, <-done)
	assert.Equal(t, 1, sc.count())
}

func TestAnExitCausedByTheStopIsNotRestarted(t *testing.T) {
	clock, sc := newFakeClock(), &script{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	s := &Supervisor{Name: "p", Start: sc.start, Clock: clock}
	go func() { done <- s.Run(ctx) }()
	require.Eventually(t, func() bool { return sc.count() == 1 }, 5*time.Second, time.Millisecond)
	cancel()
	sc.exit(Exit{Code: 0})
	require.NoError(t, <-done)
	assert.Equal(t, 1, sc.count())
}

func TestStartFailureEndsSupervision(t *testing.T) {
	s := &Supervisor{Name: "oac-sandbox-io", Start: func(int) (Run, error) { return Run{}, errors.New("no such file") }}
	assert.EqualError(t, s.Run(context.Background()), "start oac-sandbox-io: no such file")
}
