package sandbox

import (
	"bufio"
	"errors"
	"io"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/oac/sandbox-agent/internal/yamux"
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
// MaxLogLine and replacing invalid UTF-8; no emitted line is longer than
// MaxLogLine bytes, and a split never cuts a valid character in half. It
// never buffers more than MaxLogLine bytes (plus a partial character).
func readLines(r io.Reader, emit func(string)) error {
	br := bufio.NewReaderSize(r, MaxLogLine)
	var carry []byte // the start of a character cut by the last split
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 || len(carry) > 0 {
			b := append(carry, line...)
			carry = nil
			if errors.Is(err, bufio.ErrBufferFull) {
				// Keep an incomplete last character for the next piece.
				if i := lastRuneStart(b); i >= 0 && !utf8.FullRune(b[i:]) {
					carry = append([]byte(nil), b[i:]...)
					b = b[:i]
				}
			}
			s := strings.TrimSuffix(string(b), "\n")
			s = strings.TrimSuffix(s, "\r")
			if !utf8.ValidString(s) {
				s = strings.ToValidUTF8(s, "\uFFFD")
			}
			emitBounded(s, emit)
		}
		switch {
		case err == nil, errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF), errors.Is(err, yamux.ErrSessionShutdown):
			// The guest ended its stream, or the session ended under it:
			// a last line without its newline is still a line.
			if len(carry) > 0 {
				emitBounded(strings.ToValidUTF8(string(carry), "\uFFFD"), emit)
			}
			return nil
		default:
			return err
		}
	}
}

// lastRuneStart returns the index of the start of the last character in b
// (at most utf8.UTFMax-1 bytes back), or -1.
func lastRuneStart(b []byte) int {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			return i
		}
	}
	return -1
}

// emitBounded emits s in pieces of at most MaxLogLine bytes, cut at
// character boundaries (replacement characters may have made it longer).
func emitBounded(s string, emit func(string)) {
	for len(s) > MaxLogLine {
		cut := MaxLogLine
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		emit(s[:cut])
		s = s[cut:]
	}
	emit(s)
}
