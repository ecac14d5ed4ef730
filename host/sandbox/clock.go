package sandbox

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/protocol"
)

// Keeping a VM guest's clock (docs/vm.md#the-guests-clock). A VM's clock
// stops while the host sleeps, and a guest hours behind fails TLS, git
// and package managers. The host reads the guest's clock every
// ClockInterval, at once when its own clock jumped (it slept, or was set)
// and soon after the guest reports a jump, and steps the guest's clock
// when it is off by more than ClockThreshold.
const (
	// DefaultClockInterval is how often the host reads the guest's clock.
	DefaultClockInterval = 10 * time.Second
	// ClockThreshold: a guest off by more, beyond the reading's own
	// uncertainty (half the round trip), is stepped.
	ClockThreshold = 100 * time.Millisecond
	// ClockReportOver: a step larger than this is a clock event.
	ClockReportOver = time.Second
	// clockWatchTick is how often the host compares its own clocks
	// (wake detection) and looks whether a check is due.
	clockWatchTick = time.Second
	// hostJumpSlack: the host's wall clock or boot time moving this much
	// more than its monotonic clock between two ticks means it slept
	// (Linux's CLOCK_MONOTONIC stops in suspend, CLOCK_BOOTTIME does not)
	// or its clock was set.
	hostJumpSlack = 500 * time.Millisecond
	// guestJumpGap bounds the checks a guest's jump reports cause: at
	// most one in this span, however many it sends.
	guestJumpGap = 2 * time.Second
	// clockSendTimeout bounds writing one Clock message.
	clockSendTimeout = 2 * time.Second
	// clockReadings bounds the reads of one check; a reading whose
	// round trip is within clockGoodRTT ends it.
	clockReadings = 3
	clockGoodRTT  = 50 * time.Millisecond
)

// What made a check (the trigger of a clock event).
const (
	ClockTriggerInterval  = api.ClockTriggerInterval
	ClockTriggerHostWake  = api.ClockTriggerHostWake
	ClockTriggerGuestJump = api.ClockTriggerGuestJump
)

// clockSample is the host's three clocks read at one moment. mono is the
// monotonic clock (stops in suspend on Linux), boot the boot time (does
// not; negative where the OS has none), real the wall clock.
type clockSample struct {
	mono, boot time.Duration
	real       time.Time
}

// hostJump returns how much further the host's boot time or wall clock
// moved than its monotonic clock from prev to s, when that is over
// hostJumpSlack: the host slept (or its wall clock was set).
func hostJump(prev, s clockSample) (time.Duration, bool) {
	dMono := s.mono - prev.mono
	var jump time.Duration
	if prev.boot >= 0 && s.boot >= 0 {
		jump = (s.boot - prev.boot) - dMono
	}
	if d := s.real.Sub(prev.real) - dMono; d.Abs() > jump.Abs() {
		jump = d
	}
	return jump, jump.Abs() > hostJumpSlack
}

// clockVerdict is what one reading of the guest's clock says.
type clockVerdict struct {
	// offset is how far the guest's clock is ahead of the host's
	// (negative: behind), rtt the round trip the reading took.
	offset, rtt time.Duration
	// step is how far to move the guest's clock, zero when it is within
	// ClockThreshold beyond the reading's uncertainty.
	step time.Duration
}

// judgeClock compares a guest's reading with the host's clock: sent is
// the host's sample when it asked, got when the answer arrived. The host's
// time at the reading is taken as the middle of the round trip, measured
// on the monotonic clock (the wall clock may jump in between); the
// reading is uncertain by half the round trip, so only an offset over
// ClockThreshold plus that is stepped.
func judgeClock(sent, got clockSample, guest time.Time) clockVerdict {
	rtt := max(got.mono-sent.mono, 0)
	hostAt := sent.real.Add(rtt / 2)
	v := clockVerdict{offset: guest.Sub(hostAt), rtt: rtt}
	if v.offset.Abs() > ClockThreshold+rtt/2 {
		v.step = -v.offset
	}
	return v
}

// clockKeeper keeps one VM guest's clock in step with the host's. It is
// driven by ticks and by the readings the control stream delivers; its
// clocks, ticks and deadlines are given, so tests drive it with fakes.
type clockKeeper struct {
	interval time.Duration
	clocks   func() clockSample
	send     func(protocol.Clock) error
	emit     func(api.Event)
	log      *slog.Logger
	// tick drives wake detection and the interval; after makes the
	// deadline of one answer.
	tick  <-chan time.Time
	after func(time.Duration) <-chan time.Time

	// readings receives the guest's readings (deliver), jumps its jump
	// reports (reportJump): both never block the control stream's reader.
	readings chan protocol.Clock
	jumps    chan struct{}

	nextID uint64
	// lastCheck is the monotonic time of the last check, lastGuest of
	// the last one a guest's jump caused; guestPending: a jump was
	// reported within guestJumpGap of that one.
	lastCheck, lastGuest time.Duration
	guestPending         bool
	checkedGuest         bool
}

func newClockKeeper(interval time.Duration, clocks func() clockSample, send func(protocol.Clock) error, emit func(api.Event), log *slog.Logger, tick <-chan time.Time, after func(time.Duration) <-chan time.Time) *clockKeeper {
	return &clockKeeper{
		interval: interval, clocks: clocks, send: send, emit: emit, log: log, tick: tick, after: after,
		readings: make(chan protocol.Clock, 4), jumps: make(chan struct{}, 1),
	}
}

// deliver hands the keeper a reading from the guest; one it has no room
// for is dropped (the keeper waits for one answer at a time, so only a
// guest answering what nobody asked fills it).
func (k *clockKeeper) deliver(c protocol.Clock) {
	select {
	case k.readings <- c:
	default:
	}
}

// reportJump tells the keeper the guest saw its clock jump.
func (k *clockKeeper) reportJump() {
	select {
	case k.jumps <- struct{}{}:
	default:
	}
}

// run keeps the clock until stop is closed; stop wins over every wait.
func (k *clockKeeper) run(stop <-chan struct{}) {
	prev := k.clocks()
	k.lastCheck = prev.mono
	for {
		select {
		case <-stop:
			return
		case <-k.jumps:
			k.guestPending = true
		case <-k.tick:
		}
		select { // a report that came with the tick counts now
		case <-k.jumps:
			k.guestPending = true
		default:
		}
		s := k.clocks()
		jump, jumped := hostJump(prev, s)
		prev = s
		switch {
		case jumped:
			k.log.Info("the host's clock jumped (it slept, or its clock was set): checking the guest's", "jump", jump.Round(time.Millisecond).String())
			k.check(stop, ClockTriggerHostWake)
		case k.guestPending && (!k.checkedGuest || s.mono-k.lastGuest >= guestJumpGap):
			k.guestPending, k.checkedGuest, k.lastGuest = false, true, s.mono
			k.check(stop, ClockTriggerGuestJump)
		case s.mono-k.lastCheck >= k.interval:
			k.check(stop, ClockTriggerInterval)
		default:
			continue
		}
		// The check took time (its deadlines): the host's clocks are
		// compared from its end, not across it.
		prev = k.clocks()
		k.lastCheck = prev.mono
	}
}

// check reads the guest's clock and steps it when it is off. It returns
// when done, when an answer is overdue, or when stop is closed.
func (k *clockKeeper) check(stop <-chan struct{}, trigger string) {
	// The reading with the shortest round trip decides: an answer that
	// took long (the VM was paused while the question was out, as it is
	// right after the host wakes) cannot say when the guest read its
	// clock, so the guest is read again, up to clockReadings times.
	var v clockVerdict
	for i := range clockReadings {
		sent, got, guest, ok := k.ask(stop, protocol.Clock{Op: protocol.ClockRead})
		if !ok {
			return
		}
		if r := judgeClock(sent, got, guest); i == 0 || r.rtt < v.rtt {
			v = r
		}
		if v.rtt <= clockGoodRTT {
			break
		}
	}
	if v.step == 0 {
		k.log.Debug("guest clock in step", "trigger", trigger, "offset", v.offset.String(), "rtt", v.rtt.String())
		return
	}
	sent, got, after, ok := k.ask(stop, protocol.Clock{Op: protocol.ClockStep, StepNS: int64(v.step)})
	if !ok {
		return
	}
	now := judgeClock(sent, got, after)
	k.log.Info("guest clock stepped", "trigger", trigger, "step", v.step.String(), "rtt", v.rtt.String(), "now_off_by", now.offset.String())
	if v.step.Abs() > ClockReportOver {
		k.emit(api.Event{
			Event: api.KindClock, Trigger: trigger, CorrectionMS: v.step.Milliseconds(),
			Message: fmt.Sprintf("the guest's clock was %s %s the host's (%s): stepped; now off by %s",
				v.offset.Abs().Round(time.Millisecond), aheadOrBehind(v.offset), triggerWords(trigger), now.offset.Round(time.Millisecond)),
		})
	}
}

// ask sends a read or a step with a fresh id and waits for its reading:
// the host's samples around it and the guest's time, or false when the
// send failed, the guest refused the step, the answer is overdue or stop
// was closed.
func (k *clockKeeper) ask(stop <-chan struct{}, c protocol.Clock) (sent, got clockSample, guest time.Time, ok bool) {
	k.nextID++
	c.ID = k.nextID
	sent = k.clocks()
	if err := k.send(c); err != nil {
		k.log.Warn("clock: cannot reach the guest's control stream", "err", err)
		return sent, got, guest, false
	}
	deadline := k.after(protocol.ClockAnswerTimeout)
	for {
		select {
		case <-stop:
			return sent, got, guest, false
		case <-deadline:
			k.log.Warn("clock: the guest did not answer in time; the next check tries again", "op", c.Op, "timeout", protocol.ClockAnswerTimeout.String())
			return sent, got, guest, false
		case r := <-k.readings:
			if r.ID != c.ID {
				continue // an answer that came after its deadline
			}
			got = k.clocks()
			if r.Error != "" {
				k.log.Warn("clock: the guest did not step its clock", "err", guestText(r.Error, protocol.MaxClockError))
				return sent, got, guest, false
			}
			return sent, got, time.Unix(0, r.TimeUnixNano), true
		}
	}
}

func aheadOrBehind(offset time.Duration) string {
	if offset > 0 {
		return "ahead of"
	}
	return "behind"
}

func triggerWords(trigger string) string {
	switch trigger {
	case ClockTriggerHostWake:
		return "checked when the host's clock jumped"
	case ClockTriggerGuestJump:
		return "checked when the guest saw its clock jump"
	}
	return "periodic check"
}

// clockBase is where the monotonic readings of hostClocks count from.
var clockBase = time.Now()

// offersClock reports whether this run keeps the guest's clock: the
// provider's guests have a clock of their own (provider.Capabilities'
// OwnClock) and checks are not turned off. Welcome then lists
// protocol.CapClock.
func (s *run) offersClock() bool {
	return s.cfg.Provider.Capabilities().OwnClock && s.cfg.ClockInterval >= 0
}

// startClock starts the clock keeper when the host offered it and the
// guest listed protocol.CapClock. It stops when ctx ends (a stop request:
// the guest is being stopped) or the run ends, whichever is first.
func (s *run) startClock(ctx context.Context, hello protocol.Hello) {
	if !s.offersClock() || !protocol.HasCapability(hello.Capabilities, protocol.CapClock) {
		return
	}
	interval := s.cfg.ClockInterval
	if interval == 0 {
		interval = DefaultClockInterval
	}
	ctl := s.ctl
	ticker := time.NewTicker(min(interval, clockWatchTick))
	s.clock = newClockKeeper(interval, hostClocks,
		func(c protocol.Clock) error { return ctl.SendWithin(protocol.TypeClock, c, clockSendTimeout) },
		s.emit, s.cfg.Log.With("sandbox", s.cfg.Name), ticker.C, time.After)
	stop := make(chan struct{})
	s.stopClock = sync.OnceFunc(func() { close(stop) })
	unhook := context.AfterFunc(ctx, s.stopClock)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer ticker.Stop()
		defer unhook()
		s.clock.run(stop)
	}()
}

// clockFrame takes a Clock frame from the guest: a reading for the
// keeper's question, or a jump the guest saw. A guest the host offered
// no clock keeping must not send one.
func (s *run) clockFrame(f protocol.Frame) error {
	if s.clock == nil {
		return fmt.Errorf("%w: guest sent Clock, which this host did not offer", protocol.ErrUnexpectedType)
	}
	var c protocol.Clock
	if err := f.Decode(&c); err != nil {
		return fmt.Errorf("guest sent a bad Clock: %w", err)
	}
	if err := c.Validate(false); err != nil {
		return fmt.Errorf("guest sent a bad Clock: %w", err)
	}
	if c.Op == protocol.ClockJump {
		s.cfg.Log.Debug("the guest saw its clock jump", "sandbox", s.cfg.Name, "step_ns", c.StepNS, "late_ns", c.LateNS)
		s.clock.reportJump()
		return nil
	}
	s.clock.deliver(c)
	return nil
}
