package shimcli

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/host/failure"
	"github.com/oac/sandbox-agent/host/journal"
	"github.com/oac/sandbox-agent/host/kept"
	"github.com/oac/sandbox-agent/internal/crashpoint"
	"github.com/oac/sandbox-agent/internal/sockfile"
)

// A shim run with --outlive-parent keeps its sandbox when its parent goes:
// the end of stdin ends only the stdin control API, a write to a parent
// that is gone fails instead of killing the shim (SIGPIPE), its events go
// to a journal in its running-registry entry (oac-shim attach replays and
// follows them), and it serves a control socket there when the caller
// named none. It stops as every shim does: the stop command, oac-shim
// stop, SIGTERM or SIGINT.

// controlSocketName is the outliving shim's control socket in its entry.
const controlSocketName = "control.sock"

// startOutliving claims the shim's entry in the keep root's registry,
// starts the journal on sink and picks the control socket. Nothing of the
// sandbox exists yet; the caller closes f.journal, then f.announced, at
// the end (what attach reads stays until the next claim, listing or stop
// under the keep root).
func startOutliving(f *runFlags, sink *api.JSONLines, log *slog.Logger) error {
	a, err := kept.OpenRegistry(f.keepRoot).Claim(f.name)
	if err != nil {
		return failure.With(failure.ErrInvalidConfig, fmt.Errorf("--outlive-parent: nothing created: %w", err))
	}
	if f.controlSocket == "" {
		p := filepath.Join(a.Dir(), controlSocketName)
		if len(p) > sockfile.MaxPath {
			a.Close()
			return failure.With(failure.ErrInvalidConfig, fmt.Errorf(
				"--outlive-parent: nothing created: its control socket %s would be longer than a socket path may be (%d bytes): give --control-socket PATH, or a shorter --keep-root or name", p, sockfile.MaxPath))
		}
		f.controlSocket = p
	}
	jw, err := journal.Create(a.Dir())
	if err != nil {
		a.Close()
		return failure.With(failure.ErrInvalidConfig, fmt.Errorf("--outlive-parent: nothing created: %w", err))
	}
	a.KeepOnClose(journal.IsSegment)
	f.announced, f.journal = a, jw
	var warned bool
	sink.Tap(func(seq uint64, line []byte) {
		if crashpoint.Armed(crashpoint.OutliveTornLine) && bytes.Contains(line, []byte(`"event":"state"`)) &&
			bytes.Contains(line, []byte(`"state":"ready"`)) {
			jw.TearNext(func() { crashpoint.Hit(crashpoint.OutliveTornLine) })
		}
		if err := jw.Write(seq, line); err != nil {
			// The journal misses the line (attach reports its seq as
			// lost); said once, the sandbox runs on.
			if !warned {
				log.Warn("the events journal misses a line: oac-shim attach will report it lost", "err", err)
				warned = true
			}
		}
	})
	// A parent that is gone must not take the shim with it: a write to
	// its closed stdout or stderr fails (EPIPE) instead of raising
	// SIGPIPE, which kills a Go program writing to descriptor 1 or 2.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	return nil
}

// endOutliving closes the journal after the shim's last event.
func endOutliving(f *runFlags, sink *api.JSONLines) {
	if f.journal == nil {
		return
	}
	sink.Tap(nil)
	_ = f.journal.Close()
}

// maxParentQueue bounds the events waiting for a slow parent.
const maxParentQueue = 1 << 20

// parentOut writes an outliving shim's events to its parent's stdout
// without ever holding the shim up: lines wait in a queue (at most
// maxParentQueue bytes) for one writer; a full queue drops lines (the
// journal has them: the parent sees a gap in seq, and attach gives them),
// and a failed write (the parent is gone) ends the writing for good.
type parentOut struct {
	w      io.Writer
	mu     sync.Mutex
	cond   *sync.Cond
	queue  [][]byte
	bytes  int
	dead   bool
	closed bool
	done   chan struct{}
}

func newParentOut(w io.Writer) *parentOut {
	p := &parentOut{w: w, done: make(chan struct{})}
	p.cond = sync.NewCond(&p.mu)
	go p.loop()
	return p
}

// Write queues one line; it never blocks on the parent and never fails.
func (p *parentOut) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dead || p.closed || p.bytes+len(b) > maxParentQueue {
		return len(b), nil
	}
	p.queue = append(p.queue, bytes.Clone(b))
	p.bytes += len(b)
	p.cond.Signal()
	return len(b), nil
}

func (p *parentOut) loop() {
	defer close(p.done)
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		for len(p.queue) == 0 && !p.closed {
			p.cond.Wait()
		}
		if len(p.queue) == 0 {
			return
		}
		b := p.queue[0]
		p.queue = p.queue[1:]
		p.bytes -= len(b)
		p.mu.Unlock()
		_, err := p.w.Write(b)
		p.mu.Lock()
		if err != nil {
			p.dead, p.queue, p.bytes = true, nil, 0
		}
	}
}

// parentDrain bounds how long the shim's exit waits for a parent that
// does not read its last events (they are in the journal).
const parentDrain = 5 * time.Second

// Close writes what is queued (for at most parentDrain) and stops.
func (p *parentOut) Close() {
	p.mu.Lock()
	p.closed = true
	p.cond.Signal()
	p.mu.Unlock()
	select {
	case <-p.done:
	case <-time.After(parentDrain):
	}
}
