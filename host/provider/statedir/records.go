//go:build unix || windows

package statedir

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Records: the holder of a claimed directory may leave owner-only files
// there for others to read while it lives (WriteFile), and others find the
// live holders of a root with Scan and see one let go with Watch. A lock
// held means its holder lives; a record whose lock is free is a dead
// holder's and is never taken for a live one.

// recordTempPrefix names a record WriteFile is still writing.
const recordTempPrefix = ".record-"

// WriteFile writes data as the file name in the claimed directory, mode
// 0600, atomically (a temporary file renamed over it): a reader sees the
// old content or the new, never a part.
func (d *Dir) WriteFile(name string, data []byte) error {
	if d == nil || d.lock == nil {
		return errors.New("write a record: the state directory is not held")
	}
	if name == "" || name == "lock" || strings.ContainsAny(name, `/\`) || strings.HasPrefix(name, ".") {
		return fmt.Errorf("write a record: %q is not a record's name", name)
	}
	tmp, err := os.CreateTemp(d.Path, recordTempPrefix+"*")
	if err != nil {
		return fmt.Errorf("write record %s in %s: %w", name, d.Path, err)
	}
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := tmp.Chmod(0o600); err != nil && !errors.Is(err, errors.ErrUnsupported) {
		return fmt.Errorf("write record %s: %w", name, err)
	}
	if _, err := tmp.Write(data); err != nil {
		return fmt.Errorf("write record %s: %w", name, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write record %s: %w", name, err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(d.Path, name)); err != nil {
		return fmt.Errorf("write record %s: %w", name, err)
	}
	ok = true
	return nil
}

// Found is one directory Scan found under root/sandboxes.
type Found struct {
	// Name is the directory's (the sandbox's) name.
	Name string
	// Held: its lock is held, so its holder lives. A directory whose lock
	// was free was a dead holder's: Scan removed it.
	Held bool
	// Record is the record file's content, when there was one (of a dead
	// holder too, read before the removal).
	Record []byte
	// Err says why the record could not be read (none yet: os.ErrNotExist).
	Err error
}

// recordWait bounds how long Scan waits for the record of a directory
// whose holder has just claimed it and not yet written its record.
const recordWait = time.Second

// Scan lists the directories under root/sandboxes with their record file
// (at most max bytes): those whose lock is held, and those whose lock was
// free (a holder killed before it released them), which it removes as
// Sweep does. Directories a Claim is still building are not listed.
func Scan(root, record string, max int64) ([]Found, error) {
	base := filepath.Join(root, "sandboxes")
	ents, err := os.ReadDir(base)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", base, err)
	}
	var out []Found
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), claimPrefix) {
			continue
		}
		dir := filepath.Join(base, e.Name())
		lockPath := filepath.Join(dir, "lock")
		lock, err := os.OpenFile(lockPath, os.O_RDWR|openFlags, 0)
		if err != nil {
			continue // removed meanwhile, or nothing of a holder's
		}
		f := Found{Name: e.Name()}
		if tryLock(lock) != nil {
			// Held: a live holder. One that has just claimed the name
			// writes its record a moment later.
			f.Held = true
			deadline := time.Now().Add(recordWait)
			for {
				f.Record, f.Err = readRecord(filepath.Join(dir, record), max)
				if !errors.Is(f.Err, os.ErrNotExist) || time.Now().After(deadline) {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			lock.Close()
			out = append(out, f)
			continue
		}
		if !stillAt(lock, lockPath) {
			lock.Close() // released meanwhile
			continue
		}
		f.Record, f.Err = readRecord(filepath.Join(dir, record), max)
		if removeDead(&Dir{Path: dir, lock: lock}) {
			out = append(out, f)
		} // else a reader pins it: neither removed nor reported yet
	}
	return out, nil
}

// readRecord reads path, refusing a symlink and more than max bytes.
func readRecord(path string, max int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|openFlags, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("record %s is larger than %d bytes", path, max)
	}
	return data, nil
}

// Holder watches the holder of one claimed directory.
type Holder struct {
	f    *os.File
	gone bool
}

// Watch opens the lock of root/sandboxes/name to see its present holder
// let go (Gone). It fails with os.ErrNotExist when there is none.
func Watch(root, name string) (*Holder, error) {
	f, err := os.OpenFile(filepath.Join(root, "sandboxes", name, "lock"), os.O_RDWR|openFlags, 0)
	if err != nil {
		return nil, err
	}
	return &Holder{f: f}, nil
}

// Gone reports whether the holder the lock had when Watch opened it has
// let go: released the directory or died. Once gone, always gone: a later
// holder of the name is never taken for that one.
func (h *Holder) Gone() bool {
	if h.gone {
		return true
	}
	if tryLock(h.f) != nil {
		return false
	}
	// Ours for a moment: closing the descriptor drops it again.
	h.Close()
	h.gone = true
	return true
}

// Close closes the watch.
func (h *Holder) Close() {
	if h.f != nil {
		h.f.Close()
		h.f = nil
	}
}

// ReadRecord reads the record file of root/sandboxes/name: at most max
// bytes, never through a symlink.
func ReadRecord(root, name, file string, max int64) ([]byte, error) {
	return readRecord(filepath.Join(root, "sandboxes", name, file), max)
}
