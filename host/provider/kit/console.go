package kit

import (
	"fmt"
	"io"
	"sync"

	"github.com/oac/sandbox-agent/host/provider"
)

// DefaultConsoleLimit bounds how much console output one VM may forward
// to the sandbox's diagnostics.
const DefaultConsoleLimit = 1 << 20

// Console forwards a VM's console to the sandbox's diagnostics: without
// carriage returns and terminal escape sequences (UEFI firmware clears
// the screen), up to a limit; then it says so once and drops the rest. It
// keeps accepting, so the VM never blocks on a full pipe, and is safe for
// concurrent writers.
type Console struct {
	mu      sync.Mutex
	w       io.Writer
	limit   int64
	written int64
	capped  bool
	// esc is 1 after ESC, 2 inside a control sequence (ESC [ ...).
	esc int
}

// NewConsole returns a Console writing to w (nothing when w is nil), at
// most limit bytes (DefaultConsoleLimit when limit <= 0).
func NewConsole(w io.Writer, limit int64) *Console {
	if limit <= 0 {
		limit = DefaultConsoleLimit
	}
	return &Console{w: provider.Output(w), limit: limit}
}

func (c *Console) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(p)
	if c.capped {
		return n, nil
	}
	out := make([]byte, 0, len(p))
	for _, b := range p {
		switch {
		case c.esc == 1:
			c.esc = 0
			if b == '[' {
				c.esc = 2
			}
		case c.esc == 2:
			if b >= 0x40 && b <= 0x7e {
				c.esc = 0
			}
		case b == 0x1b:
			c.esc = 1
		case b != '\r':
			out = append(out, b)
		}
	}
	if c.written+int64(len(out)) > c.limit {
		out = out[:c.limit-c.written]
		c.capped = true
	}
	c.written += int64(len(out))
	_, _ = c.w.Write(out)
	if c.capped {
		fmt.Fprintf(c.w, "\nconsole output limit of %d bytes reached; further console output dropped\n", c.limit)
	}
	return n, nil
}
