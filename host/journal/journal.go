package journal

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// The bounds: a journal keeps at most Segments files of SegmentBytes each
// (a file passes SegmentBytes by at most its last line), so at most 4 MiB
// of the newest events; a line over MaxLine is not journaled (its seq is
// then a gap to a reader).
const (
	SegmentBytes = 1 << 20
	Segments     = 4
	MaxLine      = 256 << 10
)

const (
	segPrefix = "events-"
	segSuffix = ".jsonl"
	seqDigits = 20
)

// segName is the file name of the segment whose first line has seq first.
func segName(first uint64) string {
	return fmt.Sprintf("%s%0*d%s", segPrefix, seqDigits, first, segSuffix)
}

// parseSegName returns the first seq a segment's file name says, or false
// for a file that is not a segment.
func parseSegName(name string) (uint64, bool) {
	if !strings.HasPrefix(name, segPrefix) || !strings.HasSuffix(name, segSuffix) {
		return 0, false
	}
	digits := strings.TrimSuffix(strings.TrimPrefix(name, segPrefix), segSuffix)
	if len(digits) != seqDigits {
		return 0, false
	}
	n, err := strconv.ParseUint(digits, 10, 64)
	if err != nil || n == 0 {
		return 0, false
	}
	return n, true
}

// segments lists dir's segments by their first seq, oldest first.
func segments(dir string) ([]uint64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var firsts []uint64
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		if n, ok := parseSegName(e.Name()); ok {
			firsts = append(firsts, n)
		}
	}
	slices.Sort(firsts)
	return firsts, nil
}

// Exists reports whether dir holds a journal (at least one segment).
func Exists(dir string) bool {
	s, err := segments(dir)
	return err == nil && len(s) > 0
}

// IsSegment reports whether name is a segment's file name (what a
// directory's owner keeps for a reader when it ends).
func IsSegment(name string) bool {
	_, ok := parseSegName(name)
	return ok
}

// ErrClosed: the writer is closed.
var ErrClosed = errors.New("the journal is closed")

// Writer appends numbered lines to a journal. It is not safe for
// concurrent use: its one caller is the events sink, which serializes.
type Writer struct {
	dir   string
	cur   *os.File
	size  int64
	first []uint64 // the segments, oldest first
	tear  func()
	// SegmentBytes and Segments bound the journal (the package's
	// constants unless a test makes them smaller).
	SegmentBytes int64
	Segments     int
}

// Create starts a journal in dir, which must exist (the registry's
// directory of the shim, 0700), with its first segment, empty. Segments
// left there by an earlier run are removed first. A segment's name is at
// most the seq of its first line.
func Create(dir string) (*Writer, error) {
	old, err := segments(dir)
	if err != nil {
		return nil, fmt.Errorf("start the events journal in %s: %w", dir, err)
	}
	for _, f := range old {
		if err := os.Remove(filepath.Join(dir, segName(f))); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("start the events journal: remove an earlier run's %s: %w", segName(f), err)
		}
	}
	w := &Writer{dir: dir, SegmentBytes: SegmentBytes, Segments: Segments}
	// The first segment exists from the start, so a reader finds a
	// journal before its first line.
	if err := w.rotate(1); err != nil {
		return nil, err
	}
	return w, nil
}

// TearNext makes the next Write stop half way through its line and call
// hit, which must not return (a crash point's kill): a crash test leaves
// a torn final line on purpose.
func (w *Writer) TearNext(hit func()) { w.tear = hit }

// Write appends line (one JSON object and its newline) numbered seq.
// Lines must come in increasing seq order. A line over MaxLine is left
// out. A failed write is undone (the segment truncated to its last whole
// line), so a reader sees the line missing, never a part of it.
func (w *Writer) Write(seq uint64, line []byte) error {
	if w.dir == "" {
		return ErrClosed
	}
	if len(line) > MaxLine {
		return fmt.Errorf("events journal: line %d is %d bytes, over the journal's %d: left out", seq, len(line), MaxLine)
	}
	if w.cur == nil || (w.size > 0 && w.size+int64(len(line)) > w.SegmentBytes) {
		if err := w.rotate(seq); err != nil {
			return err
		}
	}
	if w.tear != nil {
		hit := w.tear
		w.tear = nil
		_, _ = w.cur.Write(line[:len(line)/2])
		hit()
	}
	n, err := w.cur.Write(line)
	if err != nil {
		if n > 0 {
			if terr := w.cur.Truncate(w.size); terr != nil {
				// The part stays: the next line starts on a line of its
				// own, and a reader takes the part for damage.
				_, _ = w.cur.Write([]byte{'\n'})
				w.size += int64(n) + 1
			}
			_, _ = w.cur.Seek(w.size, 0)
		}
		return fmt.Errorf("events journal: line %d: %w", seq, err)
	}
	w.size += int64(n)
	return nil
}

// rotate closes the current segment, starts one whose first line is seq,
// and removes the oldest beyond Segments.
func (w *Writer) rotate(seq uint64) error {
	if w.cur != nil {
		w.cur.Close()
		w.cur = nil
	}
	f, err := os.OpenFile(filepath.Join(w.dir, segName(seq)), os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("events journal: start a segment at line %d: %w", seq, err)
	}
	w.cur, w.size = f, 0
	w.first = append(w.first, seq)
	for len(w.first) > w.Segments {
		_ = os.Remove(filepath.Join(w.dir, segName(w.first[0])))
		w.first = w.first[1:]
	}
	return nil
}

// Close closes the current segment; the files stay for a reader.
func (w *Writer) Close() error {
	w.dir = ""
	if w.cur == nil {
		return nil
	}
	err := w.cur.Close()
	w.cur = nil
	return err
}
