package agent

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/internal/safetext"
	"github.com/oac/sandbox-agent/protocol"
)

// The guest's clock watch (protocol.ClockJump): every clockWatchTick it
// compares how far its wall clock and its monotonic clock moved. A wall
// clock that moved more than clockJumpReport apart from the monotonic one
// was set by something; a tick more than clockLateReport late means the
// VM did not run (its host paused it). Either is told to the host, which
// checks the clock soon; it never decides anything here.
const (
	clockWatchTick  = time.Second
	clockJumpReport = 500 * time.Millisecond
	clockLateReport = 2 * time.Second
	// clockSendTimeout bounds one Clock message's write: a host that
	// stops reading cannot hold the agent's stop.
	clockSendTimeout = 2 * time.Second
)

// SetRealtime sets the wall clock with clock_settime(CLOCK_REALTIME): a
// VM guest's Config.SetClock.
func SetRealtime(t time.Time) error {
	ts := unix.NsecToTimespec(t.UnixNano())
	if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
		return fmt.Errorf("clock_settime: %w", err)
	}
	return nil
}

// guestClock answers the host's Clock reads and steps and reports the
// jumps its watch sees.
type guestClock struct {
	set func(time.Time) error
	// now reads the wall clock, mono the monotonic clock.
	now  func() time.Time
	mono func() time.Duration
	send func(protocol.Clock) error
	log  *slog.Logger
	// steps counts the steps made here, so the watch does not report the
	// host's own correction as a jump.
	steps atomic.Uint64
}

// handle answers one Clock frame from the host. A frame that is not a
// valid read or step is an error (the session ends); a step the guest
// will not make (protocol.StepTarget's bounds) or cannot make is answered
// with the reason.
func (g *guestClock) handle(f protocol.Frame) error {
	var c protocol.Clock
	if err := f.Decode(&c); err != nil {
		return fmt.Errorf("host sent a bad Clock: %w", err)
	}
	if err := c.Validate(true); err != nil {
		return fmt.Errorf("host sent a bad Clock: %w", err)
	}
	r := protocol.Clock{Op: protocol.ClockReading, ID: c.ID}
	if c.Op == protocol.ClockStep {
		step := time.Duration(c.StepNS)
		target, err := protocol.StepTarget(g.now(), step)
		if err == nil {
			g.steps.Add(1)
			err = g.set(target)
		}
		if err != nil {
			g.log.Warn("clock: the host's step was not made", "step", step.String(), "err", err)
			r.Error = safetext.Clean(err.Error(), protocol.MaxClockError, ' ')
		} else {
			g.log.Info("clock stepped by the host", "step", step.Round(time.Millisecond).String())
		}
	}
	if r.Error == "" {
		r.TimeUnixNano = g.now().UnixNano()
	}
	return g.send(r)
}

// watch reports the clock jumps it sees until ctx ends; tick drives it,
// one tick every every (clockWatchTick). The host must have listed
// protocol.CapClock.
func (g *guestClock) watch(ctx context.Context, tick <-chan time.Time, every time.Duration) {
	prevMono, prevWall, steps := g.mono(), g.now(), g.steps.Load()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
		}
		mono, wall, s := g.mono(), g.now(), g.steps.Load()
		jump, _ := clockJump(mono-prevMono, wall.Sub(prevWall), every)
		if s != steps {
			jump.StepNS = 0 // the host's own step, not a jump; a late wake still counts
		}
		if jump.StepNS != 0 || jump.LateNS != 0 {
			g.log.Info("clock: saw a jump, telling the host", "step", time.Duration(jump.StepNS).String(), "late", time.Duration(jump.LateNS).String())
			if err := g.send(jump); err != nil {
				g.log.Warn("clock: cannot tell the host about a jump", "err", err)
			}
		}
		prevMono, prevWall, steps = mono, wall, s
	}
}

// clockJump is the jump report for one tick of every, over which the
// monotonic clock moved mono and the wall clock wall, when there is
// something to report.
func clockJump(mono, wall, every time.Duration) (protocol.Clock, bool) {
	jump := wall - mono
	late := mono - every
	c := protocol.Clock{Op: protocol.ClockJump}
	if jump.Abs() > clockJumpReport {
		c.StepNS = int64(jump)
	}
	if late > clockLateReport {
		c.LateNS = int64(late)
	}
	return c, c.StepNS != 0 || c.LateNS != 0
}

// startClock makes the guest's side of clock keeping when Config.SetClock
// is set, and starts its watch when the host takes jump reports. The
// returned func stops the watch and waits for it.
func (a *agent) startClock(ctx context.Context) (stop func()) {
	if a.cfg.SetClock == nil {
		return func() {}
	}
	ctl := a.ctl
	a.clock = &guestClock{set: a.cfg.SetClock, now: wallClock, mono: monoClock, log: a.cfg.Log,
		send: func(c protocol.Clock) error { return ctl.SendWithin(protocol.TypeClock, c, clockSendTimeout) }}
	if !protocol.HasCapability(a.welcome.Capabilities, protocol.CapClock) {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	t := time.NewTicker(clockWatchTick)
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.clock.watch(ctx, t.C, clockWatchTick)
	}()
	return func() { cancel(); <-done; t.Stop() }
}

// clockFrame answers a Clock frame; one this agent did not ask for (it
// listed no "clock") breaks the protocol.
func (a *agent) clockFrame(f protocol.Frame) error {
	if a.clock == nil {
		err := fmt.Errorf("%w: Clock, which this agent did not list", protocol.ErrUnexpectedType)
		_ = a.ctl.Send(protocol.TypeError, protocol.Error{Code: protocol.CodeProtocol, Message: err.Error()})
		return err
	}
	return a.clock.handle(f)
}

// wallClock reads the wall clock without the monotonic reading Go adds.
func wallClock() time.Time { return time.Now().Round(0) }

// monoBase is where monoClock counts from.
var monoBase = time.Now()

// monoClock reads the monotonic clock.
func monoClock() time.Duration { return time.Since(monoBase) }
