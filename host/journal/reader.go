package journal

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Gap is a run of seqs a reader cannot give: From to To, both included.
type Gap struct {
	From, To uint64
}

// Item is what Next gives: a whole line, or a gap before the next one.
type Item struct {
	// Gap, when To is not zero: these seqs are not in the journal (an
	// old segment was dropped, or a line was never written whole). The
	// line after the gap comes with the next call.
	Gap Gap
	// Seq and Line (the JSON object and its newline, as written).
	Seq  uint64
	Line []byte
	// Event, State and Code are the line's own (what a follower
	// needs to see a final state).
	Event, State, Code string
}

// Reader replays a journal from a seq and follows its writer.
type Reader struct {
	dir   string
	from  uint64
	f     *os.File
	first uint64 // the open segment's first seq
	// complete: a newer segment exists, so the open one is whole once
	// read to its end.
	complete bool
	pending  []byte // read, not yet a whole line
	skipping bool   // inside a line over MaxLine, dropped to its newline
	last     uint64 // the last seq seen (given or before from)
	held     *Item  // a line that comes after the gap just given
	damaged  int
	chunk    []byte
	// state and code are those of the last state event read.
	state, code string
}

// Open reads the journal in dir from seq from (0: from the oldest line it
// keeps). Nothing is read until Next.
func Open(dir string, from uint64) *Reader {
	return &Reader{dir: dir, from: from, chunk: make([]byte, 64<<10)}
}

// OpenAtEnd reads the journal from the line after the last whole one it
// holds now (oac-shim attach --from now).
func OpenAtEnd(dir string) (*Reader, error) {
	r := Open(dir, 0)
	for {
		_, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			r.Close()
			return nil, err
		}
	}
	r.from = r.last + 1
	return r, nil
}

// Damaged counts the lines skipped as damage: not one JSON object with a
// positive seq above the one before, or over MaxLine.
func (r *Reader) Damaged() int { return r.damaged }

// Torn is the length of what follows the last whole line: after the
// writer is gone, a line it died writing.
func (r *Reader) Torn() int { return len(r.pending) }

// Last is the seq of the last line read.
func (r *Reader) Last() uint64 { return r.last }

// LastState is the state (and failure code) of the last state event read,
// those before the reader's seq included: a follower's outcome.
func (r *Reader) LastState() (state, code string) { return r.state, r.code }

// Close closes the open segment.
func (r *Reader) Close() {
	if r.f != nil {
		r.f.Close()
		r.f = nil
	}
}

// Next returns the next line at or after the reader's seq, or the gap
// before it. It returns io.EOF when the journal holds nothing more now;
// a later call sees what the writer adds meanwhile.
func (r *Reader) Next() (Item, error) {
	if r.held != nil {
		it := *r.held
		r.held = nil
		return it, nil
	}
	for {
		if r.f == nil {
			ok, err := r.openNext()
			if err != nil || !ok {
				return Item{}, err
			}
		}
		line, err := r.readLine()
		if errors.Is(err, io.EOF) {
			if r.complete {
				// The open segment is whole and read: on to the next.
				if len(r.pending) > 0 {
					r.damaged++
					r.pending = r.pending[:0]
				}
				r.skipping = false
				r.Close()
				continue
			}
			newer, lerr := r.newerExists()
			if lerr != nil {
				return Item{}, lerr
			}
			if !newer {
				return Item{}, io.EOF
			}
			// Read the open segment to its end once more: its writer
			// finished with it before it started the newer one.
			r.complete = true
			continue
		}
		if err != nil {
			return Item{}, err
		}
		it, ok := r.parse(line)
		if !ok {
			r.damaged++
			continue
		}
		if it.Event == "state" {
			r.state, r.code = it.State, it.Code
		}
		want := r.last + 1
		if r.last == 0 && r.from == 0 {
			want = it.Seq
		}
		want = max(want, r.from)
		r.last = it.Seq
		if it.Seq < r.from {
			continue
		}
		if it.Seq > want {
			r.held = &it
			return Item{Gap: Gap{From: want, To: it.Seq - 1}}, nil
		}
		return it, nil
	}
}

// openNext opens the first segment to read (the newest holding r.from),
// or the one after the open one; false when there is none yet.
func (r *Reader) openNext() (bool, error) {
	segs, err := segments(r.dir)
	if err != nil {
		return false, fmt.Errorf("read the events journal: %w", err)
	}
	var pick uint64
	if r.first == 0 {
		for _, s := range segs {
			if pick == 0 || s <= r.from {
				pick = s
			}
		}
	} else {
		for _, s := range segs {
			if s > r.first {
				pick = s
				break
			}
		}
	}
	if pick == 0 {
		return false, io.EOF
	}
	f, err := openShared(filepath.Join(r.dir, segName(pick)))
	if errors.Is(err, os.ErrNotExist) {
		// Dropped since the listing: the next listing has a newer one.
		return r.openNext()
	}
	if err != nil {
		return false, fmt.Errorf("read the events journal: %w", err)
	}
	r.f, r.first, r.complete = f, pick, false
	return true, nil
}

// newerExists reports whether a segment after the open one exists.
func (r *Reader) newerExists() (bool, error) {
	segs, err := segments(r.dir)
	if err != nil {
		return false, fmt.Errorf("read the events journal: %w", err)
	}
	return len(segs) > 0 && segs[len(segs)-1] > r.first, nil
}

// readLine returns the next whole line of the open segment, or io.EOF.
func (r *Reader) readLine() ([]byte, error) {
	for {
		if i := bytes.IndexByte(r.pending, '\n'); i >= 0 {
			line := bytes.Clone(r.pending[:i+1])
			r.pending = append(r.pending[:0], r.pending[i+1:]...)
			if r.skipping {
				r.skipping = false
				r.damaged++
				continue
			}
			return line, nil
		}
		if len(r.pending) > MaxLine {
			r.skipping = true
			r.pending = r.pending[:0]
		}
		n, err := r.f.Read(r.chunk)
		r.pending = append(r.pending, r.chunk[:n]...)
		if n > 0 {
			continue
		}
		if err == nil || errors.Is(err, io.EOF) {
			return nil, io.EOF
		}
		return nil, fmt.Errorf("read the events journal: %w", err)
	}
}

// parse takes a whole line strictly: one JSON object, at most MaxLine
// bytes with its newline, with a positive seq above the last one seen.
func (r *Reader) parse(line []byte) (Item, bool) {
	body := line[:len(line)-1]
	if len(line) > MaxLine || len(body) == 0 || body[0] != '{' || !json.Valid(body) {
		return Item{}, false
	}
	var v struct {
		Seq   *uint64 `json:"seq"`
		Event string  `json:"event"`
		State string  `json:"state"`
		Code  string  `json:"code"`
	}
	if err := json.Unmarshal(body, &v); err != nil || v.Seq == nil || *v.Seq == 0 || *v.Seq <= r.last {
		return Item{}, false
	}
	return Item{Seq: *v.Seq, Line: line, Event: v.Event, State: v.State, Code: v.Code}, true
}
