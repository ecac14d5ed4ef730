//go:build unix || windows

package kit

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/provider/statedir"
)

// Guest id ranges: a sandbox run as root maps guest ids 0..IDRange-1 to a
// host range of its own, slot n starting at DefaultIDBase+n*IDRange. The
// slots are host-wide (one allocator under the state root), so the bwrap
// and OCI providers never hand out one range twice.
const (
	IDRange       = 65536
	DefaultIDBase = 1_000_000_000
	IDSlots       = 4096
)

// IDs is a claimed host id range.
type IDs struct {
	// Base is the host id guest id 0 maps to.
	Base int
	lock *os.File
}

// ClaimIDs takes the first free id slot under stateRoot; base is the
// first host id of slot 0 (0: DefaultIDBase).
func ClaimIDs(stateRoot string, base int) (*IDs, error) {
	if base == 0 {
		base = DefaultIDBase
	}
	slot, f, err := statedir.ClaimSlot(filepath.Join(stateRoot, "ids"), IDSlots, "id")
	if err != nil {
		return nil, err
	}
	return &IDs{Base: base + slot*IDRange, lock: f}, nil
}

// HostID returns the host uid and gid guest id maps to; -1 when it is
// not mapped.
func (ids *IDs) HostID(id int) (int, int) {
	if id < 0 || id >= IDRange {
		return -1, -1
	}
	return ids.Base + id, ids.Base + id
}

// Close frees the slot.
func (ids *IDs) Close() error { return ids.lock.Close() }

// ClaimState claims the sandbox's state directory under root (see
// statedir.Claim) for an instance, whose Destroy releases it.
func ClaimState(in *provider.Process, root, name string) (*statedir.Dir, error) {
	d, err := statedir.Claim(root, name)
	if err != nil {
		return nil, err
	}
	in.Own(d)
	return d, nil
}

// DiscardRuntime is the runtime half of every provider's Discard: it
// removes what dead shims left in the state root (each directory whose
// lock is free), then, holding name's state directory as a Create does,
// calls remove for the provider's own objects of the name (a container,
// a distribution) that a killed shim left. Whoever holds a name's state
// directory owns its runtime objects: a sandbox of the name that runs now
// is refused with provider.ErrExists and nothing of it is touched.
func DiscardRuntime(root, name string, remove func() error) error {
	statedir.Sweep(root, "")
	d, err := statedir.Claim(root, name)
	switch {
	case errors.Is(err, fs.ErrPermission):
		// A state root this user cannot write: none of its sandboxes
		// ever ran there (a provider that needs root, asked by a user).
		return nil
	case err != nil:
		return fmt.Errorf("discard the runtime state of %s: %w (stop the sandbox of that name first)", name, err)
	}
	defer d.Release()
	if remove == nil {
		return nil
	}
	return remove()
}
