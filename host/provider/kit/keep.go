//go:build unix || windows

package kit

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/oac/sandbox-agent/host/provider/statedir"
)

// A kept sandbox of the bwrap and OCI providers (provider.Spec.Keep) keeps
// three host directories under Keep.Dir, bound read-write in the guest:
//
//	home/         /home, owned by guest root (the agent makes /home/runtime)
//	environment/  /environment, likewise
//	usr-local/    /usr/local, owned by guest uid 1000: the workload's
//	              installed packages; its bin/ and sbin/ stay guest root's
//	              and are mount points of their own (the workload can
//	              neither replace the binaries the shim runs from there nor
//	              rename the directories), where the shim's installs are
//	              bound read-only as in a throwaway sandbox
//	ids           the host id guest root was mapped to (see ClaimKeptIDs)
//
// The rest of the root stays read-only: bubblewrap 0.8 (the one packaged
// here) has no overlay option and the OCI default root binds the host's
// directories, so a whole-root writable layer is left out; these three
// directories are what a sandbox writes (docs/kept.md).
const (
	keptHome     = "home"
	keptEnv      = "environment"
	keptLocal    = "usr-local"
	keptIDsFile  = "ids"
	keptNewLocal = "usr-local.new"
)

// Kept is the kept state's host directories.
type Kept struct {
	Home, Environment, UsrLocal string
}

// Bin and Sbin are UsrLocal's bin and sbin.
func (k Kept) Bin() string  { return filepath.Join(k.UsrLocal, "bin") }
func (k Kept) Sbin() string { return filepath.Join(k.UsrLocal, "sbin") }

// HostIDFunc maps a guest id to the host uid and gid (-1: unmapped).
type HostIDFunc func(id int) (int, int)

// PrepareKept lays out the kept state in dir (a first create: it seeds
// usr-local from rootfs's /usr/local when there is one, so the image's
// own files are there) and returns it. Existing state is left as it is.
// installs are the names bound over usr-local/bin/NAME; their mount
// points are made here. hostID maps guest ids (files copied from the
// image get the guest's view of their owner). As root every ownership is
// set; otherwise what the user cannot chown is left the user's.
func PrepareKept(dir, rootfs string, installs []string, hostID HostIDFunc) (Kept, error) {
	k := Kept{Home: filepath.Join(dir, keptHome), Environment: filepath.Join(dir, keptEnv), UsrLocal: filepath.Join(dir, keptLocal)}
	// The guest's root (an unprivileged host id as root) reaches the
	// kept directories through dir.
	if err := os.Chmod(dir, 0o711); err != nil {
		return k, fmt.Errorf("kept state %s: %w", dir, err)
	}
	rootUID, rootGID := hostID(0)
	if rootUID < 0 {
		rootUID, rootGID = hostID(1000) // one uid: no guest root
	}
	userUID, userGID := hostID(1000)
	for _, d := range []string{k.Home, k.Environment} {
		if err := mkdirOwned(d, 0o755, rootUID, rootGID); err != nil {
			return k, err
		}
	}
	if _, err := os.Lstat(k.UsrLocal); errors.Is(err, os.ErrNotExist) {
		if err := seedLocal(dir, rootfs, hostID); err != nil {
			return k, err
		}
		tmp := filepath.Join(dir, keptNewLocal)
		if err := lchown(tmp, userUID, userGID); err != nil {
			return k, err
		}
		if err := os.Chmod(tmp, 0o755); err != nil {
			return k, err
		}
		for _, sub := range []string{"bin", "sbin", "lib", "share", "include", "etc", "src"} {
			uid, gid := userUID, userGID
			if sub == "bin" || sub == "sbin" {
				uid, gid = rootUID, rootGID
			}
			p := filepath.Join(tmp, sub)
			if err := mkdirOwned(p, 0o755, uid, gid); err != nil {
				return k, err
			}
			if err := lchown(p, uid, gid); err != nil {
				return k, err
			}
		}
		if err := os.Rename(tmp, k.UsrLocal); err != nil {
			return k, fmt.Errorf("kept state: %w", err)
		}
	} else if err != nil {
		return k, fmt.Errorf("kept state: %w", err)
	}
	for _, n := range installs {
		p := filepath.Join(k.Bin(), n)
		st, err := os.Lstat(p)
		switch {
		case errors.Is(err, os.ErrNotExist):
			if err := os.WriteFile(p, nil, 0o644); err != nil {
				return k, fmt.Errorf("kept state: install mount point: %w", err)
			}
			if err := lchown(p, rootUID, rootGID); err != nil {
				return k, err
			}
		case err != nil:
			return k, fmt.Errorf("kept state: %w", err)
		case !st.Mode().IsRegular():
			return k, fmt.Errorf("kept state: %s is not a regular file to bind install %s over (oac-shim reset the sandbox)", p, n)
		}
	}
	return k, nil
}

// seedLocal makes dir/usr-local.new: a copy of rootfs's /usr/local when
// it has one (ownership shifted to the guest's view), else empty.
func seedLocal(dir, rootfs string, hostID HostIDFunc) error {
	tmp := filepath.Join(dir, keptNewLocal)
	if err := os.RemoveAll(tmp); err != nil { // a create killed while seeding
		return fmt.Errorf("kept state: %w", err)
	}
	src := ""
	if rootfs != "" {
		if st, err := os.Stat(filepath.Join(rootfs, "usr", "local")); err == nil && st.IsDir() {
			src = filepath.Join(rootfs, "usr", "local")
		}
	}
	if src == "" {
		if err := os.Mkdir(tmp, 0o755); err != nil {
			return fmt.Errorf("kept state: %w", err)
		}
		return nil
	}
	// cp keeps modes, links and times; --reflink shares blocks where the
	// filesystem can.
	if out, err := exec.Command("cp", "-a", "--reflink=auto", src, tmp).CombinedOutput(); err != nil {
		return fmt.Errorf("kept state: copy the image's /usr/local: %v: %s", err, strings.TrimSpace(string(out)))
	}
	if os.Geteuid() != 0 {
		return nil
	}
	return filepath.WalkDir(tmp, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		uid, gid := ownerOf(info)
		nu, _ := hostID(uid)
		_, ng := hostID(gid)
		if nu < 0 || ng < 0 {
			nu, ng = hostID(0)
		}
		if nu < 0 {
			return nil
		}
		return os.Lchown(p, nu, ng)
	})
}

func mkdirOwned(p string, mode os.FileMode, uid, gid int) error {
	if err := os.Mkdir(p, mode); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil
		}
		return fmt.Errorf("kept state: %w", err)
	}
	return lchown(p, uid, gid)
}

// lchown sets an owner; without root, failing to is not an error (the
// file stays the user's, which the guest sees as its root or uid 1000).
func lchown(p string, uid, gid int) error {
	if uid < 0 {
		return nil
	}
	if err := os.Lchown(p, uid, gid); err != nil && os.Geteuid() == 0 {
		return fmt.Errorf("kept state: chown %s: %w", p, err)
	}
	return nil
}

// ClaimKeptIDs claims the id slot a kept sandbox's earlier runs had (its
// guest root's host id is recorded in dir/ids), or, when another sandbox
// holds it now, the first free one and then moves what the sandbox wrote
// to the new range (every file owned by an id of the old range gets the
// same id of the new): files stay owned by the same guest ids across
// runs. A first run records its slot.
func ClaimKeptIDs(stateRoot string, base int, dir string) (*IDs, error) {
	if base == 0 {
		base = DefaultIDBase
	}
	want := -1
	if b, err := os.ReadFile(filepath.Join(dir, keptIDsFile)); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			want = n
		}
	}
	var ids *IDs
	if want >= base && (want-base)%IDRange == 0 {
		if f, err := statedir.ClaimSlotAt(filepath.Join(stateRoot, "ids"), (want-base)/IDRange, IDSlots, "id"); err == nil {
			ids = &IDs{Base: want, lock: f}
		}
	}
	if ids == nil {
		var err error
		if ids, err = ClaimIDs(stateRoot, base); err != nil {
			return nil, err
		}
	}
	if want >= 0 && want != ids.Base {
		if err := shiftIDs(dir, want, ids.Base); err != nil {
			ids.Close()
			return nil, err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, keptIDsFile), []byte(strconv.Itoa(ids.Base)+"\n"), 0o600); err != nil {
		ids.Close()
		return nil, fmt.Errorf("kept state: %w", err)
	}
	return ids, nil
}

// shiftIDs moves the owners in dir from the range at from to the range
// at to.
func shiftIDs(dir string, from, to int) error {
	move := func(id int) int {
		if id >= from && id < from+IDRange {
			return to + id - from
		}
		return id
	}
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		uid, gid := ownerOf(info)
		nu, ng := move(uid), move(gid)
		if nu == uid && ng == gid {
			return nil
		}
		// Lchown clears set-id bits; put them back.
		mode := info.Mode()
		if err := os.Lchown(p, nu, ng); err != nil {
			return fmt.Errorf("kept state: move %s to the new id range: %w", p, err)
		}
		if mode&(os.ModeSetuid|os.ModeSetgid) != 0 && mode&os.ModeSymlink == 0 {
			_ = os.Chmod(p, mode)
		}
		return nil
	})
}

// DiscardKept removes everything under dir (what PrepareKept and the
// guest wrote), dir itself staying. Directories the guest made
// unreadable are opened up first.
func DiscardKept(dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("discard %s: %w", dir, err)
	}
	var errs []error
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		if err := os.RemoveAll(p); err != nil {
			_ = filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
				if d != nil && d.IsDir() {
					_ = os.Chmod(q, 0o700)
				}
				return nil
			})
			if err := os.RemoveAll(p); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("discard %s: %w", dir, errors.Join(errs...))
	}
	return nil
}
