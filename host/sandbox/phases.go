package sandbox

import (
	"fmt"
	"strings"
	"time"
)

// phases records how long each part of a boot took, for the debug log:
// where the time from start to ready goes.
type phases struct {
	last  time.Time
	parts []string
}

// mark ends the phase named what (the first mark, with what empty,
// starts the clock).
func (p *phases) mark(what string) {
	now := time.Now()
	if what != "" && !p.last.IsZero() {
		p.parts = append(p.parts, fmt.Sprintf("%s %s", what, now.Sub(p.last).Round(10*time.Microsecond)))
	}
	p.last = now
}

func (p *phases) String() string { return strings.Join(p.parts, ", ") }
