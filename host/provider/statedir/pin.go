//go:build unix || windows

package statedir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/oac/sandbox-agent/host/provider"
)

// Pins: a reader of what a holder leaves (an outliving shim's journal,
// read by oac-shim attach after the shim ended) pins the directory, and
// nobody removes or takes over a pinned directory: Sweep, SweepName, Scan
// and Claim need the pins file alone (an exclusive lock on NAME/pins),
// each pin holds it shared. Any number of readers pin at once; the last
// to unpin may remove the directory (SweepName). A pin held while the
// holder lives keeps nothing from the holder itself. (On Windows a file
// is removed only once closed, so a pin taken in that moment keeps the
// pins file, and with it the emptied directory, until the next Claim.)

// pinFile is the file pins lock shared. Claim creates it beside the lock,
// and replaces it on taking a directory over, so a pin of the earlier
// holder's directory is never taken for one of the new holder's.
const pinFile = "pins"

// pinOpened, when set (tests), runs in Pin between opening the files and
// taking the pin: the point where a sweep or a takeover may come first.
var pinOpened func()

// Pinned is one pin of a directory; Close unpins it.
type Pinned struct{ f *os.File }

// Pin pins root/sandboxes/name (see above). It fails with os.ErrNotExist
// when there is no such directory, or it was removed or taken over while
// the pin was being taken.
func Pin(root, name string) (*Pinned, error) {
	if !provider.ValidName(name) {
		return nil, fmt.Errorf("%w: sandbox name %q", provider.ErrInvalidSpec, name)
	}
	dir := filepath.Join(root, "sandboxes", name)
	lockPath, pinPath := filepath.Join(dir, "lock"), filepath.Join(dir, pinFile)
	lock, err := os.OpenFile(lockPath, os.O_RDONLY|openFlags, 0)
	if err != nil {
		return nil, err
	}
	defer lock.Close()
	f, err := os.OpenFile(pinPath, os.O_RDWR|openFlags, 0)
	if err != nil {
		return nil, err
	}
	if pinOpened != nil {
		pinOpened()
	}
	// An exclusive holder (a sweep, a claim taking over) holds it only
	// while it removes or replaces the file: wait that out, then see
	// whether what was pinned is still there.
	if err := within(func() error { return tryLockShared(f) }, heldWait); err != nil {
		f.Close()
		return nil, fmt.Errorf("pin %s: %w", dir, err)
	}
	if !stillAt(f, pinPath) || !stillAt(lock, lockPath) {
		f.Close()
		return nil, os.ErrNotExist
	}
	return &Pinned{f: f}, nil
}

// Close unpins; safe on nil and more than once.
func (p *Pinned) Close() {
	if p != nil && p.f != nil {
		p.f.Close()
		p.f = nil
	}
}

// unpinned takes dir's pins file alone, so that dir may be removed or
// taken over: ok is false while a reader pins it. f (nil when dir has no
// pins file: one a Claim is still making, or an older shim's) is the
// file, to be removed (removeLocked) or replaced while it is held.
func unpinned(dir string) (f *os.File, ok bool) {
	f, err := os.OpenFile(filepath.Join(dir, pinFile), os.O_RDWR|openFlags, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, true
	}
	if err != nil {
		return nil, false
	}
	if tryLock(f) != nil {
		f.Close()
		return nil, false
	}
	return f, true
}

// newPins creates dir's pins file, replacing old (held alone, or nil):
// a pin of the old file fails from now on.
func newPins(dir string, old *os.File) error {
	path := filepath.Join(dir, pinFile)
	if old != nil {
		removeLocked(old, path)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL|openFlags, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	return f.Close()
}

// within retries try for at most d, backing off from 2 ms to 100 ms; it
// returns the last error.
func within(try func() error, d time.Duration) error {
	deadline := time.Now().Add(d)
	backoff := 2 * time.Millisecond
	for {
		err := try()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(backoff)
		backoff = min(2*backoff, 100*time.Millisecond)
	}
}
