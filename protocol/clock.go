package protocol

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// CapClock: in Hello, the guest answers Clock reads and steps (VM guests,
// whose clock stops while the host sleeps); in Welcome, the host takes a
// guest's Clock jump reports. A host sends Clock only to a guest that
// listed it, a guest sends a jump only to a host that listed it.
const CapClock = "clock"

// Clock operations (Clock.Op).
const (
	// ClockRead (host -> guest, ID): answer at once with a reading.
	ClockRead = "read"
	// ClockStep (host -> guest, ID, StepNS): move the wall clock by StepNS
	// (positive: forward) and answer with a reading taken after the step,
	// or with Error when the step was refused or failed.
	ClockStep = "step"
	// ClockReading (guest -> host, ID, TimeUnixNano or Error): the answer
	// to the read or step with that ID.
	ClockReading = "reading"
	// ClockJump (guest -> host, StepNS and/or LateNS): the guest saw its
	// clock jump (its wall clock moved StepNS more than its monotonic
	// clock) or ran LateNS late (it was not scheduled: the host paused
	// it). The host checks the clock soon; it trusts nothing else of it.
	ClockJump = "jump"
)

// Clock bounds, checked on read by both sides.
const (
	// MaxClockStep bounds a step either way: a host that slept for
	// longer than this is not correcting a clock but setting a wrong one.
	MaxClockStep = 20 * 365 * 24 * time.Hour
	// MaxClockError bounds Clock.Error in bytes.
	MaxClockError = 256
	// ClockAnswerTimeout is how long the host waits for the reading that
	// answers a read or a step; a later one is ignored.
	ClockAnswerTimeout = 5 * time.Second
)

// ClockFloor and ClockCeiling bound a wall clock the guest may be stepped
// to: anything outside is not a time the host can mean.
var (
	ClockFloor   = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	ClockCeiling = time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)
)

// Clock is the body of a TypeClock frame: the host reads and steps a VM
// guest's wall clock, the guest answers and reports jumps it saw. Which
// fields an Op carries is checked by Validate.
type Clock struct {
	Op string `json:"op"`
	// ID pairs a read or step with its reading: 1..2^64-1, never reused
	// within a session.
	ID uint64 `json:"id,omitempty"`
	// TimeUnixNano is the guest's wall clock when it wrote the reading.
	TimeUnixNano int64 `json:"time_unix_nano,omitempty"`
	// StepNS is how far a step moves the clock (step), or how far the
	// guest saw its clock jump (jump).
	StepNS int64 `json:"step_ns,omitempty"`
	// LateNS is how late the guest's own clock watch woke up (jump).
	LateNS int64 `json:"late_ns,omitempty"`
	// Error says why a step was not made (reading).
	Error string `json:"error,omitempty"`
}

// Validate checks that c is a Clock the sender may send: fromHost says
// who sent it (a guest never sends read or step, a host never sends a
// reading or a jump) and the fields match the op.
func (c Clock) Validate(fromHost bool) error {
	bad := func(why string) error { return fmt.Errorf("%w: clock %s: %s", ErrBadBody, truncate(c.Op, 16), why) }
	onlyHost := c.Op == ClockRead || c.Op == ClockStep
	onlyGuest := c.Op == ClockReading || c.Op == ClockJump
	switch {
	case !onlyHost && !onlyGuest:
		return fmt.Errorf("%w: unknown clock op %q", ErrBadBody, truncate(c.Op, 16))
	case fromHost && !onlyHost:
		return bad("only the guest sends it")
	case !fromHost && !onlyGuest:
		return bad("only the host sends it")
	}
	if (c.Op == ClockJump) != (c.ID == 0) {
		return bad("a jump has no id; every other op has one")
	}
	if c.Op != ClockReading && (c.TimeUnixNano != 0 || c.Error != "") {
		return bad("time_unix_nano and error belong to a reading")
	}
	if c.Op != ClockJump && c.LateNS != 0 {
		return bad("late_ns belongs to a jump")
	}
	switch c.Op {
	case ClockRead:
		if c.StepNS != 0 {
			return bad("a read steps nothing")
		}
	case ClockStep:
		if c.StepNS == 0 || c.StepNS < -int64(MaxClockStep) || c.StepNS > int64(MaxClockStep) {
			return bad(fmt.Sprintf("step_ns must be non-zero and within %s either way", MaxClockStep))
		}
	case ClockReading:
		if c.StepNS != 0 {
			return bad("step_ns belongs to a step or a jump")
		}
		if (c.Error == "") == (c.TimeUnixNano <= 0) {
			return bad("a reading has either a positive time_unix_nano or an error")
		}
		if len(c.Error) > MaxClockError || !utf8.ValidString(c.Error) || strings.ContainsFunc(c.Error, isControl) {
			return bad(fmt.Sprintf("error over %d bytes, not UTF-8 or with control characters", MaxClockError))
		}
	case ClockJump:
		if c.LateNS < 0 || (c.StepNS == 0 && c.LateNS == 0) {
			return bad("a jump says how far the clock jumped (step_ns) or how late the guest woke (late_ns >= 0)")
		}
	}
	return nil
}

// StepTarget is the wall clock a step of d from now lands on, or an error
// when d is over MaxClockStep or the result is outside ClockFloor and
// ClockCeiling: the guest's check before it sets its clock.
func StepTarget(now time.Time, d time.Duration) (time.Time, error) {
	if d < -MaxClockStep || d > MaxClockStep {
		return time.Time{}, fmt.Errorf("refused a clock step of %s: over the bound of %s either way", d, MaxClockStep)
	}
	t := now.Add(d)
	if t.Before(ClockFloor) || !t.Before(ClockCeiling) {
		return time.Time{}, fmt.Errorf("refused a clock step of %s: it lands on %s, outside %d..%d", d, t.UTC().Format(time.RFC3339), ClockFloor.Year(), ClockCeiling.Year())
	}
	return t, nil
}

func isControl(r rune) bool { return r < 0x20 || (r >= 0x7f && r < 0xa0) }
