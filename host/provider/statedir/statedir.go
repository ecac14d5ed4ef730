//go:build unix || windows

package statedir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/oac/sandbox-agent/host/provider"
)

// Dir is a claimed state directory.
type Dir struct {
	// Path is the directory.
	Path string
	lock *os.File
}

// Claim creates and locks root/sandboxes/name. It fails with an error
// wrapping provider.ErrExists when another process holds it.
//
// A new directory is built under a temporary name with its lock already
// held and renamed into place, so a named directory never exists without a
// lock a Sweep could mistake for a dead shim's. An existing directory (a
// dead shim's) is taken over once its lock is ours and still the one at
// the path (a Sweep may have removed it meanwhile: then Claim starts over).
func Claim(root, name string) (*Dir, error) {
	if !provider.ValidName(name) {
		// The name becomes a path: nothing but a valid name gets this far.
		return nil, fmt.Errorf("%w: sandbox name %q", provider.ErrInvalidSpec, name)
	}
	Sweep(root, name)
	base := filepath.Join(root, "sandboxes")
	if err := os.MkdirAll(base, 0o711); err != nil {
		return nil, fmt.Errorf("create state directory %s: %w", base, err)
	}
	dir := filepath.Join(base, name)
	for range 8 {
		tmp, err := os.MkdirTemp(base, claimPrefix)
		if err != nil {
			return nil, fmt.Errorf("create state directory in %s: %w", base, err)
		}
		lock, err := os.OpenFile(filepath.Join(tmp, "lock"), os.O_RDWR|os.O_CREATE|os.O_EXCL|openFlags, 0o600)
		if err == nil {
			err = tryLock(lock)
		}
		if err == nil {
			err = newPins(tmp, nil)
		}
		if err != nil {
			if lock != nil {
				lock.Close()
			}
			os.RemoveAll(tmp)
			return nil, fmt.Errorf("create lock in %s: %w", tmp, err)
		}
		if err := os.Chmod(tmp, 0o700); err == nil {
			if err := os.Rename(tmp, dir); err == nil {
				return &Dir{Path: dir, lock: lock}, nil
			}
		}
		lock.Close()
		os.RemoveAll(tmp)
		// The name exists: a running sandbox, or a dead shim's leftovers.
		// (On Windows a directory with an open file cannot be renamed:
		// there it is made in place.)
		if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("create state directory %s: %w", dir, err)
		}
		lock, err = os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE|openFlags, 0o600)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // removed meanwhile
			}
			return nil, fmt.Errorf("open lock in %s: %w", dir, err)
		}
		if err := lockWithin(lock, heldWait); err != nil {
			lock.Close()
			return nil, fmt.Errorf("%w: %q is held by another oac-shim (lock %s)", provider.ErrExists, name, lock.Name())
		}
		if !stillAt(lock, filepath.Join(dir, "lock")) {
			lock.Close()
			continue
		}
		// A reader may pin what the last holder left (its journal): wait
		// for it as for a holder, then take the pins over with the rest.
		var pins *os.File
		if err := within(func() error {
			var ok bool
			if pins, ok = unpinned(dir); !ok {
				return errPinned
			}
			return nil
		}, heldWait); err != nil {
			lock.Close()
			return nil, fmt.Errorf("%w: %q is still being read (oac-shim attach, pins %s)", provider.ErrExists, name, filepath.Join(dir, pinFile))
		}
		d := &Dir{Path: dir, lock: lock}
		d.clear() // stale content from a sandbox that died without cleaning up
		if err := newPins(dir, pins); err != nil {
			lock.Close()
			return nil, fmt.Errorf("claim state directory %s: %w", dir, err)
		}
		return d, nil
	}
	return nil, fmt.Errorf("claim state directory %s: it kept changing under us; retry", dir)
}

// heldWait bounds the wait for a lock another process holds. A shim
// killed just after it forked a child leaves its descriptors, the lock's
// too, with that child until the child execs; on a loaded machine that
// outlives the shim's exit by milliseconds. The shim of a running sandbox
// holds the lock for good: the claim then fails after heldWait.
const heldWait = time.Second

// lockWithin retries the lock of f for at most d, backing off from 2 ms
// to 100 ms; it returns the last error.
func lockWithin(f *os.File, d time.Duration) error {
	return within(func() error { return tryLock(f) }, d)
}

// errPinned says a reader pins a directory.
var errPinned = errors.New("pinned by a reader")

// claimPrefix names directories a Claim is still building.
const claimPrefix = ".claim-"

// stillAt reports whether f is the file at path (not one unlinked since
// f was opened).
func stillAt(f *os.File, path string) bool {
	a, err1 := f.Stat()
	b, err2 := os.Stat(path)
	return err1 == nil && err2 == nil && os.SameFile(a, b)
}

// Sweep removes the state directories under root/sandboxes (but skip)
// whose lock is free: what a shim killed with SIGKILL left behind (its
// transport socket, runtime files, the lock). Every Claim sweeps, so a
// leftover lasts until the next sandbox starts on the host. A directory
// whose lock is held belongs to a running shim and is not touched, nor is
// one a Claim is still building.
func Sweep(root, skip string) {
	base := filepath.Join(root, "sandboxes")
	ents, err := os.ReadDir(base)
	if err != nil {
		return
	}
	for _, e := range ents {
		if !e.IsDir() || e.Name() == skip || strings.HasPrefix(e.Name(), claimPrefix) {
			continue
		}
		sweepDir(filepath.Join(base, e.Name()))
	}
}

// SweepName removes root/sandboxes/name as Sweep would: only when its
// lock is free. It reports whether the directory is gone.
func SweepName(root, name string) bool {
	if !provider.ValidName(name) {
		return false
	}
	dir := filepath.Join(root, "sandboxes", name)
	sweepDir(dir)
	_, err := os.Lstat(dir)
	return errors.Is(err, os.ErrNotExist)
}

func sweepDir(dir string) {
	lockPath := filepath.Join(dir, "lock")
	lock, err := os.OpenFile(lockPath, os.O_RDWR|openFlags, 0)
	if err != nil {
		return // no lock: nothing of ours to judge
	}
	if tryLock(lock) != nil || !stillAt(lock, lockPath) {
		lock.Close() // held (a running sandbox) or already gone
		return
	}
	// Ours while the lock is held: a Claim of this name fails with
	// ErrExists or starts over, so only the empty directory is
	// removed last.
	removeDead(&Dir{Path: dir, lock: lock})
}

// removeDead removes d, whose lock is held and whose holder is gone,
// unless a reader pins it, and says whether it did; it drops the lock
// either way.
func removeDead(d *Dir) bool {
	defer d.lock.Close()
	pins, ok := unpinned(d.Path)
	if !ok {
		return false
	}
	d.clear()
	if pins != nil {
		removeLocked(pins, filepath.Join(d.Path, pinFile))
	}
	os.Remove(filepath.Join(d.Path, "lock"))
	os.Remove(d.Path)
	return true
}

func (d *Dir) clear() {
	ents, _ := os.ReadDir(d.Path)
	for _, e := range ents {
		if e.Name() != "lock" && e.Name() != pinFile {
			os.RemoveAll(filepath.Join(d.Path, e.Name()))
		}
	}
}

// Release removes the directory and drops the lock. It is safe to call on
// a nil Dir and more than once.
func (d *Dir) Release() {
	if d == nil || d.lock == nil {
		return
	}
	d.clear()
	os.Remove(filepath.Join(d.Path, pinFile))
	removeLocked(d.lock, filepath.Join(d.Path, "lock"))
	os.Remove(d.Path)
	d.lock = nil
}

// ReleaseKeeping removes what keep does not name and drops the lock, but
// leaves the lock file and the directory: a reader of what was kept finds
// it with the lock free (its holder ended), and the next Claim, Scan or
// Sweep removes it all, as it does a dead holder's directory.
func (d *Dir) ReleaseKeeping(keep func(name string) bool) {
	if d == nil || d.lock == nil {
		return
	}
	ents, _ := os.ReadDir(d.Path)
	for _, e := range ents {
		if e.Name() != "lock" && e.Name() != pinFile && !keep(e.Name()) {
			os.RemoveAll(filepath.Join(d.Path, e.Name()))
		}
	}
	d.lock.Close()
	d.lock = nil
}

// ClaimSlot takes the lowest free numbered slot in dir (0..slots-1), each
// a lock file held for as long as the returned file stays open: a host-wide
// allocator for resources such as id ranges or vsock CIDs. what names the
// resource in errors.
func ClaimSlot(dir string, slots int, what string) (int, *os.File, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, nil, fmt.Errorf("create %s slot directory: %w", what, err)
	}
	for slot := range slots {
		f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(slot)), os.O_RDWR|os.O_CREATE|openFlags, 0o600)
		if err != nil {
			return 0, nil, fmt.Errorf("open %s slot %d: %w", what, slot, err)
		}
		if err := tryLock(f); err != nil {
			f.Close()
			continue
		}
		return slot, f, nil
	}
	return 0, nil, fmt.Errorf("all %d %s slots are in use: stop some sandboxes", slots, what)
}

// ClaimSlotAt takes slot n in dir if it is free (see ClaimSlot): a kept
// sandbox asks for the slot its earlier runs had, so that what it wrote
// stays owned by the same host ids. It fails when another holds it.
func ClaimSlotAt(dir string, n, slots int, what string) (*os.File, error) {
	if n < 0 || n >= slots {
		return nil, fmt.Errorf("%s slot %d is out of range 0..%d", what, n, slots-1)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create %s slot directory: %w", what, err)
	}
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(n)), os.O_RDWR|os.O_CREATE|openFlags, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open %s slot %d: %w", what, n, err)
	}
	if err := tryLock(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s slot %d is in use", what, n)
	}
	return f, nil
}

// Close is Release, so a Dir is an io.Closer (provider.Process.Own).
func (d *Dir) Close() error {
	d.Release()
	return nil
}
