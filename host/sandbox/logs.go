package sandbox

import (
	"bufio"
	"errors"
	"io"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// Log limits: a line longer than MaxLogLine is split; a sandbox may emit
// LogBurst bytes at once and LogRate bytes per second on average, output
// beyond that is dropped and counted.
const (
	MaxLogLine = 4 << 10
	LogRate    = 256 << 10
	LogBurst   = 1 << 20
)

// logBudget is a token bucket shared by all log streams of a sandbox.
type logBudget struct {
	mu      sync.Mutex
	tokens  float64
	last    time.Time
	dropped int64
	now     func() time.Time
}

func newLogBudget(now func() time.Time) *logBudget {
	return &logBudget{tokens: LogBurst, last: now(), now: now}
}

// take reports whether n bytes may be emitted now; if not they are counted
// as dropped.
func (b *logBudget) take(n int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.now()
	b.tokens = min(LogBurst, b.tokens+t.Sub(b.last).Seconds()*LogRate)
	b.last = t
	if b.tokens < float64(n) {
		b.dropped += int64(n)
		return false
	}
	b.tokens -= float64(n)
	return true
}

// takeDropped returns and resets the dropped byte count.
func (b *logBudget) takeDropped() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	d := b.dropped
	b.dropped = 0
	return d
}

// readLines calls emit for every line of r, splitting lines longer than
// MaxLogLine and replacing invalid UTF-8. It never buffers more than
// MaxLogLine bytes.
func readLines(r io.Reader, emit func(string)) error {
	br := bufio.NewReaderSize(r, MaxLogLine)
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			s := strings.TrimSuffix(string(line), "\n")
			s = strings.TrimSuffix(s, "\r")
			if !utf8.ValidString(s) {
				s = strings.ToValidUTF8(s, "\uFFFD")
			}
			emit(s)
		}
		switch {
		case err == nil, errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF):
			return nil
		default:
			return err
		}
	}
}
