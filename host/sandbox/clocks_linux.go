package sandbox

import (
	"time"

	"golang.org/x/sys/unix"
)

// hostClocks reads the host's clocks. Go's monotonic clock is Linux's
// CLOCK_MONOTONIC, which stops while the host is suspended;
// CLOCK_BOOTTIME does not, so their difference is the time slept.
func hostClocks() clockSample {
	now := time.Now()
	var boot unix.Timespec
	b := time.Duration(-1)
	if unix.ClockGettime(unix.CLOCK_BOOTTIME, &boot) == nil {
		b = time.Duration(boot.Nano())
	}
	return clockSample{mono: now.Sub(clockBase), boot: b, real: now.Round(0)}
}
