package agent

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/protocol"
)

// fakeGuestClock is a guestClock whose clock and answers the test holds.
type fakeGuestClock struct {
	*guestClock
	clock  time.Time
	setErr error
	sets   []time.Time
	sent   []protocol.Clock
}

func newFakeGuestClock() *fakeGuestClock {
	f := &fakeGuestClock{clock: time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)}
	f.guestClock = &guestClock{
		now: func() time.Time { return f.clock },
		set: func(t time.Time) error {
			if f.setErr != nil {
				return f.setErr
			}
			f.sets = append(f.sets, t)
			f.clock = t
			return nil
		},
		send: func(c protocol.Clock) error { f.sent = append(f.sent, c); return nil },
		log:  slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	return f
}

func clockFrame(t *testing.T, c protocol.Clock) protocol.Frame {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, protocol.WriteMessage(&buf, protocol.TypeClock, c))
	f, err := protocol.ReadFrame(&buf, protocol.MaxControlFrame)
	require.NoError(t, err)
	return f
}

func TestGuestClockAnswersAReadWithItsTime(t *testing.T) {
	g := newFakeGuestClock()
	require.NoError(t, g.handle(clockFrame(t, protocol.Clock{Op: protocol.ClockRead, ID: 3})))
	assert.Equal(t, []protocol.Clock{{Op: protocol.ClockReading, ID: 3, TimeUnixNano: g.clock.UnixNano()}}, g.sent)
	assert.Empty(t, g.sets)
}

func TestGuestClockStepsByWhatTheHostSaysAndAnswersWithTheNewTime(t *testing.T) {
	g := newFakeGuestClock()
	before := g.clock
	require.NoError(t, g.handle(clockFrame(t, protocol.Clock{Op: protocol.ClockStep, ID: 4, StepNS: int64(9 * time.Second)})))
	require.Len(t, g.sets, 1)
	assert.Equal(t, before.Add(9*time.Second), g.sets[0])
	assert.Equal(t, []protocol.Clock{{Op: protocol.ClockReading, ID: 4, TimeUnixNano: before.Add(9 * time.Second).UnixNano()}}, g.sent)
	assert.Equal(t, uint64(1), g.steps.Load(), "the watch will not report this step as a jump")
}

func TestGuestClockRefusesAStepOutsideTheBoundsAndSaysWhy(t *testing.T) {
	g := newFakeGuestClock()
	g.clock = time.Date(2010, 1, 1, 0, 0, 0, 0, time.UTC)
	require.NoError(t, g.handle(clockFrame(t, protocol.Clock{Op: protocol.ClockStep, ID: 5, StepNS: -int64(15 * 365 * 24 * time.Hour)})))
	assert.Empty(t, g.sets, "the clock was not touched")
	require.Len(t, g.sent, 1)
	assert.Equal(t, uint64(5), g.sent[0].ID)
	assert.Zero(t, g.sent[0].TimeUnixNano)
	assert.Contains(t, g.sent[0].Error, "outside 2000..2200")
	assert.NoError(t, g.sent[0].Validate(false), "the refusal is a valid reading")
}

func TestGuestClockSaysWhyTheKernelRefusedAStep(t *testing.T) {
	g := newFakeGuestClock()
	g.setErr = errors.New("clock_settime: operation not permitted\n\x1b[2J")
	require.NoError(t, g.handle(clockFrame(t, protocol.Clock{Op: protocol.ClockStep, ID: 6, StepNS: int64(time.Hour)})))
	require.Len(t, g.sent, 1)
	assert.Equal(t, "clock_settime: operation not permitted  [2J", g.sent[0].Error, "control characters never travel")
	assert.NoError(t, g.sent[0].Validate(false))
}

func TestGuestClockEndsTheSessionOnAClockNoHostSends(t *testing.T) {
	g := newFakeGuestClock()
	err := g.handle(clockFrame(t, protocol.Clock{Op: protocol.ClockReading, ID: 1, TimeUnixNano: 1}))
	require.ErrorIs(t, err, protocol.ErrBadBody)
	err = g.handle(protocol.Frame{Type: protocol.TypeClock, Body: []byte(`{"op":"step","id":1,"step_ns":"x"}`)})
	require.ErrorIs(t, err, protocol.ErrBadBody)
	assert.Empty(t, g.sent)
	assert.Empty(t, g.sets)
}

func TestClockJumpReportsASetWallClockOrALateTickOnly(t *testing.T) {
	for _, tc := range []struct {
		name       string
		mono, wall time.Duration
		want       protocol.Clock
		report     bool
	}{
		{"a tick", time.Second, time.Second, protocol.Clock{Op: protocol.ClockJump}, false},
		{"a tick a bit late", 2 * time.Second, 2 * time.Second, protocol.Clock{Op: protocol.ClockJump}, false},
		{"a small drift", time.Second, time.Second + 400*time.Millisecond, protocol.Clock{Op: protocol.ClockJump}, false},
		{"the wall clock set back an hour", time.Second, time.Second - time.Hour, protocol.Clock{Op: protocol.ClockJump, StepNS: -int64(time.Hour)}, true},
		{"the wall clock set forward", time.Second, 3 * time.Second, protocol.Clock{Op: protocol.ClockJump, StepNS: int64(2 * time.Second)}, true},
		{"the VM did not run for 5 s", 6 * time.Second, 6 * time.Second, protocol.Clock{Op: protocol.ClockJump, LateNS: int64(5 * time.Second)}, true},
		{"both", 6 * time.Second, time.Second, protocol.Clock{Op: protocol.ClockJump, StepNS: -int64(5 * time.Second), LateNS: int64(5 * time.Second)}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, report := clockJump(tc.mono, tc.wall, time.Second)
			assert.Equal(t, tc.report, report)
			assert.Equal(t, tc.want, got)
			if report {
				assert.NoError(t, got.Validate(false))
			}
		})
	}
}

// watchRig runs a guest clock's watch in a synctest bubble with clocks
// the test moves.
type watchRig struct {
	mu   sync.Mutex
	mono time.Duration
	wall time.Time
	g    *fakeGuestClock
	tick chan time.Time
	sent chan protocol.Clock
}

func newWatchRig(t *testing.T) *watchRig {
	r := &watchRig{wall: time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC), g: newFakeGuestClock(),
		tick: make(chan time.Time), sent: make(chan protocol.Clock, 8)}
	r.g.now = func() time.Time { r.mu.Lock(); defer r.mu.Unlock(); return r.wall }
	r.g.mono = func() time.Duration { r.mu.Lock(); defer r.mu.Unlock(); return r.mono }
	r.g.send = func(c protocol.Clock) error { r.sent <- c; return nil }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.g.watch(ctx, r.tick, time.Second) }()
	t.Cleanup(func() { cancel(); <-done })
	synctest.Wait()
	return r
}

// pass moves the monotonic clock by mono and the wall clock by wall,
// then ticks and waits until the watch handled the tick.
func (r *watchRig) pass(mono, wall time.Duration) {
	r.mu.Lock()
	r.mono, r.wall = r.mono+mono, r.wall.Add(wall)
	r.mu.Unlock()
	r.tick <- time.Time{}
	synctest.Wait()
}

func (r *watchRig) reports() []protocol.Clock {
	var out []protocol.Clock
	for {
		select {
		case c := <-r.sent:
			out = append(out, c)
		default:
			return out
		}
	}
}

func TestGuestClockWatchReportsAJumpOrAPauseOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newWatchRig(t)
		r.pass(time.Second, time.Second)
		assert.Empty(t, r.reports(), "a plain tick")
		r.pass(time.Second, time.Second-time.Minute)
		assert.Equal(t, []protocol.Clock{{Op: protocol.ClockJump, StepNS: -int64(time.Minute)}}, r.reports(), "something set the clock back")
		r.pass(time.Second, time.Second)
		assert.Empty(t, r.reports(), "reported once")
		r.pass(6*time.Second, 6*time.Second)
		assert.Equal(t, []protocol.Clock{{Op: protocol.ClockJump, LateNS: int64(5 * time.Second)}}, r.reports(), "the VM did not run")
	})
}

func TestGuestClockWatchStaysQuietOverTheHostsStep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newWatchRig(t)
		r.g.steps.Add(1) // the host stepped the clock an hour forward
		r.pass(time.Second, time.Second+time.Hour)
		assert.Empty(t, r.reports())
		r.pass(time.Second, time.Second-time.Hour)
		assert.Len(t, r.reports(), 1, "a jump after the step is reported")

		// The VM paused across the host's step: the step is not a jump,
		// the late wake still is.
		r.g.steps.Add(1)
		r.pass(5*time.Second, 5*time.Second+3*time.Second)
		assert.Equal(t, []protocol.Clock{{Op: protocol.ClockJump, LateNS: int64(4 * time.Second)}}, r.reports())
	})
}
