package protocol

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestClockValidateTakesEachOpOnlyFromItsSenderWithItsFields(t *testing.T) {
	const host, guest = true, false
	for _, tc := range []struct {
		name     string
		c        Clock
		fromHost bool
		errMsg   string // empty: valid
	}{
		{"a read", Clock{Op: ClockRead, ID: 1}, host, ""},
		{"a step forward", Clock{Op: ClockStep, ID: 2, StepNS: int64(3 * time.Hour)}, host, ""},
		{"a step back", Clock{Op: ClockStep, ID: 2, StepNS: -int64(time.Second)}, host, ""},
		{"a step of the bound", Clock{Op: ClockStep, ID: 2, StepNS: int64(MaxClockStep)}, host, ""},
		{"a reading", Clock{Op: ClockReading, ID: 1, TimeUnixNano: 1_800_000_000_000_000_000}, guest, ""},
		{"a refused step's reading", Clock{Op: ClockReading, ID: 1, Error: "operation not permitted"}, guest, ""},
		{"a jump", Clock{Op: ClockJump, StepNS: -int64(time.Minute)}, guest, ""},
		{"a late wake", Clock{Op: ClockJump, LateNS: int64(5 * time.Second)}, guest, ""},

		{"a read from the guest", Clock{Op: ClockRead, ID: 1}, guest, "only the host sends it"},
		{"a step from the guest", Clock{Op: ClockStep, ID: 1, StepNS: 1}, guest, "only the host sends it"},
		{"a reading from the host", Clock{Op: ClockReading, ID: 1, TimeUnixNano: 1}, host, "only the guest sends it"},
		{"a jump from the host", Clock{Op: ClockJump, StepNS: 1}, host, "only the guest sends it"},
		{"no op", Clock{ID: 1}, host, "unknown clock op"},
		{"an op in another case", Clock{Op: "Read", ID: 1}, host, "unknown clock op"},
		{"a read without id", Clock{Op: ClockRead}, host, "a jump has no id"},
		{"a jump with an id", Clock{Op: ClockJump, ID: 4, StepNS: 1}, guest, "a jump has no id"},
		{"a read that steps", Clock{Op: ClockRead, ID: 1, StepNS: 5}, host, "a read steps nothing"},
		{"a read with a time", Clock{Op: ClockRead, ID: 1, TimeUnixNano: 5}, host, "belong to a reading"},
		{"a step of nothing", Clock{Op: ClockStep, ID: 1}, host, "non-zero"},
		{"a step over the bound", Clock{Op: ClockStep, ID: 1, StepNS: int64(MaxClockStep) + 1}, host, "within"},
		{"a step back over the bound", Clock{Op: ClockStep, ID: 1, StepNS: -int64(MaxClockStep) - 1}, host, "within"},
		{"a step with late_ns", Clock{Op: ClockStep, ID: 1, StepNS: 1, LateNS: 1}, host, "late_ns belongs to a jump"},
		{"a reading without time or error", Clock{Op: ClockReading, ID: 1}, guest, "either"},
		{"a reading with a negative time", Clock{Op: ClockReading, ID: 1, TimeUnixNano: -1}, guest, "either"},
		{"a reading with time and error", Clock{Op: ClockReading, ID: 1, TimeUnixNano: 1, Error: "x"}, guest, "either"},
		{"a reading with a step", Clock{Op: ClockReading, ID: 1, TimeUnixNano: 1, StepNS: 1}, guest, "step_ns belongs"},
		{"a reading's error over the bound", Clock{Op: ClockReading, ID: 1, Error: strings.Repeat("e", MaxClockError+1)}, guest, "error over"},
		{"a reading's error with an escape", Clock{Op: ClockReading, ID: 1, Error: "\x1b[2J"}, guest, "control characters"},
		{"a reading's error not UTF-8", Clock{Op: ClockReading, ID: 1, Error: "\xff"}, guest, "not UTF-8"},
		{"a jump of nothing", Clock{Op: ClockJump}, guest, "how far"},
		{"a jump late by a negative span", Clock{Op: ClockJump, StepNS: 1, LateNS: -1}, guest, "how far"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.c.Validate(tc.fromHost)
			if tc.errMsg == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrBadBody)
			assert.Contains(t, err.Error(), tc.errMsg)
		})
	}
}

func TestStepTargetRefusesStepsOverTheBoundAndTimesOutsideTheRange(t *testing.T) {
	now := time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)
	got, err := StepTarget(now, 9*time.Second)
	require.NoError(t, err)
	assert.Equal(t, now.Add(9*time.Second), got)

	_, err = StepTarget(now, MaxClockStep+time.Nanosecond)
	assert.ErrorContains(t, err, "over the bound")
	_, err = StepTarget(now, -MaxClockStep-time.Nanosecond)
	assert.ErrorContains(t, err, "over the bound")

	_, err = StepTarget(ClockFloor.Add(time.Hour), -2*time.Hour)
	assert.ErrorContains(t, err, "outside 2000..2200", "a clock is never stepped before 2000")
	_, err = StepTarget(ClockCeiling.Add(-time.Hour), time.Hour)
	assert.ErrorContains(t, err, "outside 2000..2200", "nor to 2200 or later")
	got, err = StepTarget(ClockFloor.Add(time.Hour), -time.Hour)
	require.NoError(t, err, "the floor itself is a time")
	assert.True(t, got.Equal(ClockFloor))
}

func TestClockTravelsAsItsOwnFrameType(t *testing.T) {
	var buf bytes.Buffer
	require.NoError(t, WriteMessage(&buf, TypeClock, Clock{Op: ClockStep, ID: 7, StepNS: -int64(time.Second)}))
	f, err := ReadFrame(&buf, MaxControlFrame)
	require.NoError(t, err)
	assert.Equal(t, TypeClock, f.Type)
	assert.Equal(t, "Clock", f.Type.String())
	assert.JSONEq(t, `{"op":"step","id":7,"step_ns":-1000000000}`, string(f.Body))
	var c Clock
	require.NoError(t, f.Decode(&c))
	assert.NoError(t, c.Validate(true))
}

// FuzzClock decodes arbitrary bodies of a Clock frame as either side
// does. Whatever Validate accepts keeps its op's shape: the step within
// its bound, a reading with exactly one of time and a clean error.
func FuzzClock(f *testing.F) {
	f.Add([]byte(`{"op":"read","id":1}`), true)
	f.Add([]byte(`{"op":"step","id":2,"step_ns":-9000000000}`), true)
	f.Add([]byte(`{"op":"reading","id":2,"time_unix_nano":1800000000000000000}`), false)
	f.Add([]byte(`{"op":"reading","id":3,"error":"refused a clock step"}`), false)
	f.Add([]byte(`{"op":"jump","step_ns":-3600000000000,"late_ns":5000000000}`), false)
	f.Add([]byte(`{"op":"step","id":1,"step_ns":9223372036854775807}`), true)
	f.Add([]byte(`{"op":"reading","id":1,"error":"\u001b[2J"}`), false)
	f.Add([]byte(`{"op":"read","id":18446744073709551616}`), true)
	f.Fuzz(func(t *testing.T, body []byte, fromHost bool) {
		var c Clock
		if err := (Frame{Type: TypeClock, Body: body}).Decode(&c); err != nil {
			require.ErrorIs(t, err, ErrBadBody)
			return
		}
		if err := c.Validate(fromHost); err != nil {
			require.ErrorIs(t, err, ErrBadBody)
			return
		}
		switch c.Op {
		case ClockRead, ClockStep:
			require.True(t, fromHost)
			require.NotZero(t, c.ID)
			require.LessOrEqual(t, max(c.StepNS, -c.StepNS), int64(MaxClockStep))
		case ClockReading:
			require.False(t, fromHost)
			require.True(t, (c.Error == "") != (c.TimeUnixNano <= 0))
			require.LessOrEqual(t, len(c.Error), MaxClockError)
			require.False(t, strings.ContainsFunc(c.Error, isControl))
		case ClockJump:
			require.False(t, fromHost)
			require.Zero(t, c.ID)
			require.GreaterOrEqual(t, c.LateNS, int64(0))
		default:
			t.Fatalf("accepted op %q", c.Op)
		}
		enc, err := json.Marshal(c)
		require.NoError(t, err)
		var again Clock
		require.NoError(t, Frame{Type: TypeClock, Body: enc}.Decode(&again))
		require.Equal(t, c, again)
	})
}
