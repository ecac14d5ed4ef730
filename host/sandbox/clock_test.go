package sandbox

import (
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

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/internal/yamux"
	"github.com/oac/sandbox-agent/protocol"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

var epoch = time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)

func sample(mono, boot time.Duration, real time.Time) clockSample {
	return clockSample{mono: mono, boot: boot, real: real}
}

func TestHostJumpSeesASuspendOrASetClockButNotTicksThatAgree(t *testing.T) {
	prev := sample(10*time.Second, 10*time.Second, epoch)
	for _, tc := range []struct {
		name   string
		next   clockSample
		jumped bool
		jump   time.Duration
	}{
		{"a tick", sample(11*time.Second, 11*time.Second, epoch.Add(time.Second)), false, 0},
		{"a late tick (the host was busy)", sample(40*time.Second, 40*time.Second, epoch.Add(30*time.Second)), false, 0},
		{"drift under the slack", sample(11*time.Second, 11*time.Second+400*time.Millisecond, epoch.Add(time.Second+400*time.Millisecond)), false, 400 * time.Millisecond},
		{"a suspend: boot time and wall clock ran on, monotonic stopped",
			sample(11*time.Second, 11*time.Second+time.Hour, epoch.Add(time.Second+time.Hour)), true, time.Hour},
		{"a suspend whose wall clock the host has not fixed yet", sample(11*time.Second, 11*time.Second+time.Hour, epoch.Add(time.Second)), true, time.Hour},
		{"the wall clock set back", sample(11*time.Second, 11*time.Second, epoch.Add(-time.Minute)), true, -time.Minute - time.Second},
		{"no boot time (macOS): the wall clock alone", sample(11*time.Second, -1, epoch.Add(2*time.Hour)), true, 2*time.Hour - time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := prev
			if tc.next.boot < 0 {
				p.boot = -1
			}
			jump, jumped := hostJump(p, tc.next)
			assert.Equal(t, tc.jumped, jumped)
			assert.Equal(t, tc.jump, jump)
		})
	}
}

func TestJudgeClockStepsOnlyWhatIsOffBeyondTheThresholdAndTheRoundTrip(t *testing.T) {
	sent := sample(time.Minute, time.Minute, epoch)
	after := func(rtt time.Duration) clockSample { return sample(time.Minute+rtt, time.Minute+rtt, epoch.Add(rtt)) }
	// The host's time at the reading is the middle of the round trip.
	v := judgeClock(sent, after(20*time.Millisecond), epoch.Add(10*time.Millisecond).Add(-9*time.Second))
	assert.Equal(t, clockVerdict{offset: -9 * time.Second, rtt: 20 * time.Millisecond, step: 9 * time.Second}, v, "9 s behind: stepped forward 9 s")

	v = judgeClock(sent, after(20*time.Millisecond), epoch.Add(10*time.Millisecond).Add(2*time.Hour))
	assert.Equal(t, -2*time.Hour, v.step, "ahead: stepped back")

	v = judgeClock(sent, after(20*time.Millisecond), epoch.Add(10*time.Millisecond).Add(ClockThreshold))
	assert.Zero(t, v.step, "within the threshold (and its 10 ms of uncertainty)")
	v = judgeClock(sent, after(20*time.Millisecond), epoch.Add(10*time.Millisecond).Add(ClockThreshold+11*time.Millisecond))
	assert.Equal(t, -ClockThreshold-11*time.Millisecond, v.step, "beyond both")

	v = judgeClock(sent, after(600*time.Millisecond), epoch.Add(300*time.Millisecond).Add(-350*time.Millisecond))
	assert.Zero(t, v.step, "a slow answer (600 ms) cannot tell 350 ms off from in step")

	// The wall clock jumping while the question was out changes nothing:
	// the round trip is measured on the monotonic clock.
	got := sample(time.Minute+20*time.Millisecond, time.Minute+time.Hour, epoch.Add(time.Hour))
	v = judgeClock(sent, got, epoch.Add(10*time.Millisecond))
	assert.Equal(t, clockVerdict{rtt: 20 * time.Millisecond}, v)
}

// fakeClocks are the host's clocks and a guest's, moved by the test. The
// guest's clock is the host's wall clock plus off, which its steps move.
type fakeClocks struct {
	mu         sync.Mutex
	mono, boot time.Duration
	real       time.Time
	off        time.Duration
	rtt        time.Duration // how long each answer takes
	// paused are spans the VM does not run, one per answer, before the
	// guest reads its clock: the host's clocks run on, the guest's not.
	paused         []time.Duration
	silent, refuse bool
	sent           chan protocol.Clock
}

func newFakeClocks() *fakeClocks {
	return &fakeClocks{mono: time.Minute, boot: time.Minute, real: epoch, sent: make(chan protocol.Clock, 64)}
}

func (f *fakeClocks) now() clockSample {
	f.mu.Lock()
	defer f.mu.Unlock()
	return clockSample{mono: f.mono, boot: f.boot, real: f.real}
}

// pass moves every host clock by d; the guest's runs with them.
func (f *fakeClocks) pass(d time.Duration) {
	f.mu.Lock()
	f.mono, f.boot, f.real = f.mono+d, f.boot+d, f.real.Add(d)
	f.mu.Unlock()
}

// sleep is a host suspend of d: the monotonic clock stops, the guest's
// with it (its offset falls back by d).
func (f *fakeClocks) sleep(d time.Duration) {
	f.mu.Lock()
	f.boot, f.real, f.off = f.boot+d, f.real.Add(d), f.off-d
	f.mu.Unlock()
}

func (f *fakeClocks) setOff(d time.Duration) { f.mu.Lock(); f.off = d; f.mu.Unlock() }
func (f *fakeClocks) offset() time.Duration  { f.mu.Lock(); defer f.mu.Unlock(); return f.off }

// guest answers the keeper's message as a guest agent would, the round
// trip taking rtt (half of it before the guest reads its clock).
func (f *fakeClocks) guest(k *clockKeeper) func(protocol.Clock) error {
	return func(c protocol.Clock) error {
		if err := c.Validate(true); err != nil {
			return err
		}
		f.sent <- c
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.silent {
			return nil
		}
		f.mono, f.boot, f.real = f.mono+f.rtt/2, f.boot+f.rtt/2, f.real.Add(f.rtt/2)
		if len(f.paused) > 0 {
			d := f.paused[0]
			f.paused = f.paused[1:]
			f.mono, f.boot, f.real, f.off = f.mono+d, f.boot+d, f.real.Add(d), f.off-d
		}
		r := protocol.Clock{Op: protocol.ClockReading, ID: c.ID}
		switch {
		case c.Op == protocol.ClockStep && f.refuse:
			r.Error = "operation not permitted"
		case c.Op == protocol.ClockStep:
			f.off += time.Duration(c.StepNS)
		}
		if r.Error == "" {
			r.TimeUnixNano = f.real.Add(f.off).UnixNano()
		}
		f.mono, f.boot, f.real = f.mono+f.rtt/2, f.boot+f.rtt/2, f.real.Add(f.rtt/2)
		k.deliver(r)
		return nil
	}
}

type keeperRig struct {
	t      *testing.T
	c      *fakeClocks
	k      *clockKeeper
	tick   chan time.Time
	expire chan time.Time
	events chan api.Event
	stop   chan struct{}
	done   chan struct{}
}

func newKeeperRig(t *testing.T, interval time.Duration) *keeperRig {
	r := &keeperRig{t: t, c: newFakeClocks(), tick: make(chan time.Time), expire: make(chan time.Time),
		events: make(chan api.Event, 16), stop: make(chan struct{}), done: make(chan struct{})}
	r.c.rtt = 4 * time.Millisecond
	r.k = newClockKeeper(interval, r.c.now, nil, func(e api.Event) { r.events <- e },
		slog.New(slog.NewTextHandler(io.Discard, nil)), r.tick, func(time.Duration) <-chan time.Time { return r.expire })
	r.k.send = r.c.guest(r.k)
	go func() { defer close(r.done); r.k.run(r.stop) }()
	t.Cleanup(r.close)
	r.step() // the keeper has read its clocks' start and waits for ticks
	return r
}

func (r *keeperRig) close() {
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	<-r.done
}

// step sends one tick and returns once the keeper has handled it and
// waits again (the rig runs in a synctest bubble).
func (r *keeperRig) step() {
	r.tick <- time.Time{}
	synctest.Wait()
}

// sent returns the ops the keeper sent so far.
func (r *keeperRig) sent() []string {
	var ops []string
	for {
		select {
		case c := <-r.c.sent:
			ops = append(ops, c.Op)
		default:
			return ops
		}
	}
}

func (r *keeperRig) noEvent() {
	select {
	case e := <-r.events:
		r.t.Fatalf("unexpected event %+v", e)
	default:
	}
}

func TestKeeperChecksEveryIntervalAndStepsAGuestOffByMoreThanTheThreshold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newKeeperRig(t, 10*time.Second)
		r.c.setOff(-9 * time.Second)
		r.c.pass(9 * time.Second)
		r.step()
		assert.Empty(t, r.sent(), "nothing before the interval")

		r.c.pass(time.Second)
		r.step()
		assert.Equal(t, []string{protocol.ClockRead, protocol.ClockStep}, r.sent())
		assert.InDelta(t, 0, r.c.offset(), float64(time.Millisecond), "the guest's clock is the host's again")
		e := <-r.events
		assert.Equal(t, api.KindClock, e.Event)
		assert.Equal(t, int64(9000), e.CorrectionMS, "stepped 9 s forward")
		assert.Equal(t, ClockTriggerInterval, e.Trigger)
		assert.Equal(t, "the guest's clock was 9s behind the host's (periodic check): stepped; now off by 0s", e.Message)

		r.c.pass(10 * time.Second)
		r.step()
		assert.Equal(t, []string{protocol.ClockRead}, r.sent(), "in step: read, not stepped")
		r.noEvent()
	})
}

func TestKeeperStepsSmallOffsetsWithoutAnEventAndLeavesTinyOnesAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newKeeperRig(t, time.Second)
		r.c.setOff(60 * time.Millisecond)
		r.c.pass(time.Second)
		r.step()
		assert.Equal(t, []string{protocol.ClockRead}, r.sent(), "60 ms: within the threshold")
		assert.Equal(t, 60*time.Millisecond, r.c.offset())

		r.c.setOff(700 * time.Millisecond)
		r.c.pass(time.Second)
		r.step()
		assert.Equal(t, []string{protocol.ClockRead, protocol.ClockStep}, r.sent())
		assert.InDelta(t, 0, r.c.offset(), float64(time.Millisecond))
		r.noEvent()
	})
}

func TestKeeperChecksAtOnceWhenTheHostWakesFromSleep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newKeeperRig(t, time.Hour)
		r.c.pass(time.Second)
		r.step()
		r.c.sleep(3 * time.Hour)
		r.c.pass(time.Second)
		r.step()
		assert.Equal(t, []string{protocol.ClockRead, protocol.ClockStep}, r.sent(), "checked long before the hour's interval")
		e := <-r.events
		assert.Equal(t, ClockTriggerHostWake, e.Trigger)
		assert.Equal(t, (3 * time.Hour).Milliseconds(), e.CorrectionMS)
		assert.InDelta(t, 0, r.c.offset(), float64(time.Millisecond))
	})
}

func TestKeeperChecksWhenTheGuestReportsAJumpAtMostOnceAGap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newKeeperRig(t, time.Hour)
		r.c.setOff(-time.Minute)
		r.k.reportJump()
		r.step()
		assert.Equal(t, []string{protocol.ClockRead, protocol.ClockStep}, r.sent())
		e := <-r.events
		assert.Equal(t, ClockTriggerGuestJump, e.Trigger)

		// A flood of reports within the gap makes no second check until the
		// gap has passed; then one.
		for range 5 {
			r.k.reportJump()
			r.step()
		}
		assert.Empty(t, r.sent())
		r.c.pass(guestJumpGap)
		r.step()
		assert.Equal(t, []string{protocol.ClockRead}, r.sent())
		r.step()
		assert.Empty(t, r.sent(), "the reports were one")
	})
}

func TestKeeperReadsAgainWhenAnAnswerTookLongAndTheFastestReadingDecides(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newKeeperRig(t, time.Second)
		// The VM is paused for 3 s while the first question is out: its
		// answer comes 3 s late with a clock 3 s behind, which the middle
		// of that round trip would take for 1.5 s behind.
		r.c.mu.Lock()
		r.c.paused = []time.Duration{3 * time.Second}
		r.c.mu.Unlock()
		r.c.pass(time.Second)
		r.step()
		assert.Equal(t, []string{protocol.ClockRead, protocol.ClockRead, protocol.ClockStep}, r.sent())
		e := <-r.events
		assert.Equal(t, int64(3000), e.CorrectionMS, "stepped by what the fast reading says")
		assert.InDelta(t, 0, r.c.offset(), float64(time.Millisecond))
	})
}

func TestKeeperGivesUpOnAnOverdueAnswerAndIgnoresItWhenItComesLate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newKeeperRig(t, time.Second)
		r.c.setOff(-time.Minute)
		r.c.mu.Lock()
		r.c.silent = true
		r.c.mu.Unlock()
		r.c.pass(time.Second)
		r.tick <- time.Time{}
		read := <-r.c.sent
		r.expire <- time.Time{} // the answer's deadline passes
		synctest.Wait()
		assert.Equal(t, protocol.ClockRead, read.Op)

		// The late answer is 1 minute behind but answers nothing asked now.
		r.k.deliver(protocol.Clock{Op: protocol.ClockReading, ID: read.ID, TimeUnixNano: epoch.UnixNano()})
		r.c.mu.Lock()
		r.c.silent = false
		r.c.mu.Unlock()
		r.c.pass(time.Second)
		r.step()
		assert.Equal(t, []string{protocol.ClockRead, protocol.ClockStep}, r.sent(), "the next check asks again, with a new id")
		e := <-r.events
		assert.Equal(t, int64(60000), e.CorrectionMS)
	})
}

func TestKeeperReportsNothingForAStepTheGuestRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newKeeperRig(t, time.Second)
		r.c.setOff(-time.Hour)
		r.c.mu.Lock()
		r.c.refuse = true
		r.c.mu.Unlock()
		r.c.pass(time.Second)
		r.step()
		assert.Equal(t, []string{protocol.ClockRead, protocol.ClockStep}, r.sent())
		r.noEvent()
		assert.Equal(t, -time.Hour, r.c.offset())
	})
}

func TestKeeperStopWinsOverAnAnswerItWaitsFor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newKeeperRig(t, time.Second)
		r.c.mu.Lock()
		r.c.silent = true
		r.c.mu.Unlock()
		r.c.pass(time.Second)
		r.tick <- time.Time{}
		<-r.c.sent // the keeper waits for the answer now, and no deadline comes
		close(r.stop)
		<-r.done
	})
}

// clockProvider is the fake provider with a VM's clock of its own.
type clockProvider struct{ *fakeProvider }

func (clockProvider) Capabilities() provider.Capabilities {
	return provider.Capabilities{OwnClock: true}
}

// connectClockGuest connects a guest listing caps and returns it with
// the host's Welcome.
func connectClockGuest(t *testing.T, p *fakeProvider, caps ...string) (*fakeGuest, protocol.Welcome) {
	t.Helper()
	conn := <-p.guest
	sess, err := yamux.Client(conn, protocol.MuxConfig(nil))
	require.NoError(t, err)
	t.Cleanup(func() { sess.Close() })
	ctl, w, err := protocol.GuestHandshake(sess, protocol.Hello{MinVersion: 1, MaxVersion: 1, AgentVersion: "fake", PID: 1, Capabilities: caps}, 5*time.Second)
	require.NoError(t, err)
	g := &fakeGuest{p: p, sess: sess, ctl: ctl}
	require.NoError(t, ctl.RecvMessage(protocol.TypeBootstrap, &g.boot))
	return g, w
}

func TestAVMGuestHoursBehindIsSteppedAndTheStepIsAnEvent(t *testing.T) {
	p, rec := newFakeProvider(), newRecorder()
	cancel, done := runSandbox(t, Config{Provider: clockProvider{p}, Events: rec, Bootstrap: &bootstrap.Bootstrap{Version: 1},
		ClockInterval: 10 * time.Millisecond})
	g, w := connectClockGuest(t, p, protocol.CapTime, protocol.CapClock)
	assert.Contains(t, w.Capabilities, protocol.CapClock, "the host keeps a VM guest's clock")
	g.send(t, protocol.State{State: protocol.StateReady})
	rec.waitState(t, api.StateReady)

	// The guest answers as one whose clock stopped for two hours.
	off := -2 * time.Hour
	var stepped time.Duration
	for stepped == 0 {
		f, err := g.ctl.Recv()
		require.NoError(t, err)
		require.Equal(t, protocol.TypeClock, f.Type)
		var c protocol.Clock
		require.NoError(t, f.Decode(&c))
		require.NoError(t, c.Validate(true))
		if c.Op == protocol.ClockStep {
			stepped = time.Duration(c.StepNS)
			off += stepped
		}
		require.NoError(t, g.ctl.Send(protocol.TypeClock, protocol.Clock{Op: protocol.ClockReading, ID: c.ID, TimeUnixNano: time.Now().Add(off).UnixNano()}))
	}
	assert.InDelta(t, float64(2*time.Hour), float64(stepped), float64(time.Second))
	e := waitEvent(t, rec, api.KindClock)
	assert.Equal(t, ClockTriggerInterval, e.Trigger)
	assert.InDelta(t, (2 * time.Hour).Milliseconds(), e.CorrectionMS, 1000)
	assert.Contains(t, e.Message, "behind the host's")

	cancel(errors.New("done"))
	var sd protocol.Shutdown
	for {
		f, err := g.ctl.Recv()
		require.NoError(t, err)
		if f.Type == protocol.TypeShutdown {
			break
		}
	}
	_ = g.ctl.Send(protocol.TypeState, protocol.State{State: protocol.StateStopped, Message: sd.Reason})
	g.exit()
	require.NoError(t, wait(t, done))
}

func TestAGuestSharingTheHostsKernelIsNeverOfferedClockKeeping(t *testing.T) {
	p, rec := newFakeProvider(), newRecorder()
	_, done := runSandbox(t, Config{Provider: p, Events: rec, Bootstrap: quickStop(), ClockInterval: time.Millisecond})
	g, w := connectClockGuest(t, p, protocol.CapClock)
	assert.NotContains(t, w.Capabilities, protocol.CapClock)
	// A guest that sends Clock anyway breaks the protocol.
	require.NoError(t, g.ctl.Send(protocol.TypeClock, protocol.Clock{Op: protocol.ClockJump, StepNS: 1}))
	err := wait(t, done)
	require.ErrorIs(t, err, protocol.ErrUnexpectedType)
	assert.Contains(t, err.Error(), "guest sent Clock, which this host did not offer")
}

func TestAGuestSendingAClockOpOfTheHostsFails(t *testing.T) {
	p, rec := newFakeProvider(), newRecorder()
	_, done := runSandbox(t, Config{Provider: clockProvider{p}, Events: rec, Bootstrap: quickStop(), ClockInterval: time.Hour})
	g, _ := connectClockGuest(t, p, protocol.CapClock)
	require.NoError(t, g.ctl.Send(protocol.TypeClock, protocol.Clock{Op: protocol.ClockStep, ID: 1, StepNS: 1}))
	err := wait(t, done)
	require.ErrorIs(t, err, protocol.ErrBadBody)
	assert.Contains(t, err.Error(), "guest sent a bad Clock")
}

// quickStop is a bootstrap whose stop grace does not hold up a test
// whose guest never answers Shutdown.
func quickStop() *bootstrap.Bootstrap {
	g := bootstrap.Duration(10 * time.Millisecond)
	return &bootstrap.Bootstrap{Version: 1, StopGrace: &g}
}

func waitEvent(t *testing.T, rec *recorder, kind string) api.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		select {
		case e := <-rec.ch:
			if e.Event == kind {
				return e
			}
		case <-ctx.Done():
			t.Fatalf("no %s event", kind)
		}
	}
}
