//go:build unix

package statedir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

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
func Claim(root, name string) (*Dir, error) {
	Sweep(root, name)
	dir := filepath.Join(root, "sandboxes", name)
	if err := os.MkdirAll(filepath.Dir(dir), 0o711); err != nil {
		return nil, fmt.Errorf("create state directory %s: %w", filepath.Dir(dir), err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("create state directory %s: %w", dir, err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock in %s: %w", dir, err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lock.Close()
		return nil, fmt.Errorf("%w: %q is held by another oac-shim (lock %s)", provider.ErrExists, name, lock.Name())
	}
	d := &Dir{Path: dir, lock: lock}
	d.clear() // stale content from a sandbox that died without cleaning up
	return d, nil
}

// Sweep removes the state directories under root/sandboxes (but skip)
// whose lock is free: what a shim killed with SIGKILL left behind (its
// transport socket, runtime files, the lock). Every Claim sweeps, so a
// leftover lasts until the next sandbox starts on the host. A directory
// whose lock is held belongs to a running shim and is not touched.
func Sweep(root, skip string) {
	base := filepath.Join(root, "sandboxes")
	ents, err := os.ReadDir(base)
	if err != nil {
		return
	}
	for _, e := range ents {
		if !e.IsDir() || e.Name() == skip {
			continue
		}
		dir := filepath.Join(base, e.Name())
		lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			// No lock (yet): a Claim may be between its Mkdir and
			// creating the lock. Left alone.
			continue
		}
		if unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
			lock.Close() // held: a running sandbox
			continue
		}
		// Ours while the lock is held: a Claim of this name fails with
		// ErrExists until then, and after the lock file is gone it makes
		// a new one, so only the empty directory is removed last.
		d := &Dir{Path: dir, lock: lock}
		d.clear()
		os.Remove(filepath.Join(dir, "lock"))
		os.Remove(dir)
		lock.Close()
	}
}

func (d *Dir) clear() {
	ents, _ := os.ReadDir(d.Path)
	for _, e := range ents {
		if e.Name() != "lock" {
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
	os.Remove(filepath.Join(d.Path, "lock"))
	os.Remove(d.Path)
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
		f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(slot)), os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return 0, nil, fmt.Errorf("open %s slot %d: %w", what, slot, err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			continue
		}
		return slot, f, nil
	}
	return 0, nil, fmt.Errorf("all %d %s slots are in use: stop some sandboxes", slots, what)
}
