//go:build unix || windows

package statedir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

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
	dir := filepath.Join(root, "sandboxes", name)
	if err := os.MkdirAll(filepath.Dir(dir), 0o711); err != nil {
		return nil, fmt.Errorf("create state directory %s: %w", filepath.Dir(dir), err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("create state directory %s: %w", dir, err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE|openFlags, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock in %s: %w", dir, err)
	}
	if err := tryLock(lock); err != nil {
		lock.Close()
		return nil, fmt.Errorf("%w: %q is held by another oac-shim (lock %s)", provider.ErrExists, name, lock.Name())
	}
	d := &Dir{Path: dir, lock: lock}
	d.clear() // stale content from a sandbox that died without cleaning up
	return d, nil
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
	removeLocked(d.lock, filepath.Join(d.Path, "lock"))
	os.Remove(d.Path)
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
