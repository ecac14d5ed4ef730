package sandbox

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/oac/sandbox-agent/internal/safetext"
)

// MaxDiagBytes bounds how much runtime and agent diagnostic output one
// sandbox may write to the shim's stderr.
const MaxDiagBytes = 1 << 20

// diagWriter forwards the runtime's stderr (bwrap's messages and the
// agent's own log) to w line by line with a prefix, stops after
// MaxDiagBytes, and keeps the last lines for failure messages.
type diagWriter struct {
	mu      sync.Mutex
	w       io.Writer
	prefix  string
	partial []byte
	written int
	tail    []string
}

func newDiagWriter(w io.Writer, prefix string) *diagWriter {
	if w == nil {
		w = io.Discard
	}
	return &diagWriter{w: w, prefix: prefix}
}

func (d *diagWriter) Write(p []byte) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.partial = append(d.partial, p...)
	for {
		i := bytes.IndexByte(d.partial, '\n')
		if i < 0 {
			if len(d.partial) > MaxLogLine {
				d.line(string(d.partial[:MaxLogLine]))
				d.partial = append(d.partial[:0], d.partial[MaxLogLine:]...)
				continue
			}
			break
		}
		d.line(string(d.partial[:i]))
		d.partial = d.partial[i+1:]
	}
	return len(p), nil
}

func (d *diagWriter) line(s string) {
	// The runtime's output reaches the shim's stderr: no terminal escape.
	s = safetext.Line(s)
	d.tail = append(d.tail, s)
	if len(d.tail) > 5 {
		d.tail = d.tail[1:]
	}
	if d.written > MaxDiagBytes {
		return
	}
	d.written += len(d.prefix) + len(s) + 1
	if d.written > MaxDiagBytes {
		fmt.Fprintf(d.w, "%sdiagnostic output limit of %d bytes reached; further lines dropped\n", d.prefix, MaxDiagBytes)
		return
	}
	fmt.Fprintf(d.w, "%s%s\n", d.prefix, s)
}

// lastLines returns the last diagnostic lines joined for an error message.
func (d *diagWriter) lastLines() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return strings.Join(d.tail, " | ")
}
