//go:build !linux

package sandbox

import "time"

// hostClocks reads the host's clocks. There is no boot time here: a
// sleep shows as the wall clock moving further than Go's monotonic clock,
// which stops while macOS sleeps (and Windows' does not count suspend).
func hostClocks() clockSample {
	now := time.Now()
	return clockSample{mono: now.Sub(clockBase), boot: -1, real: now.Round(0)}
}
