package vminit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/guest/initsys"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
	"github.com/oac/sandbox-agent/protocol/vmparams"
)

// Paths of the switch into the image's root.
const (
	// NewRoot is where the root disk is mounted in the initramfs before
	// the switch.
	NewRoot = "/newroot"
	// rwDir holds the upper and work directories of the writable layers,
	// on the tmpfs of /run; 0700, so the workload cannot reach around the
	// overlay.
	rwDir = "/run/oac/rw"
	// installDir holds the binaries the host installed through the
	// initramfs (its /usr/local/bin), laid over the image's
	// /usr/local/bin.
	installDir = "/run/oac/install"
	// InstallBin is where installed binaries appear.
	InstallBin = "/usr/local/bin"
	// rootWait bounds the wait for the root disk to appear.
	rootWait = 15 * time.Second
)

// WritableDirs get a writable layer (an overlay whose upper layer is on
// tmpfs) over the image's content, unless a share is mounted there; /run
// and /tmp are fresh tmpfs mounts carried over from the initramfs.
var WritableDirs = []string{"/home", "/environment"}

// KeptDirs are the directories a kept guest without a root disk keeps on
// its kept disk (with a root disk the whole root is kept).
var KeptDirs = []string{"/environment", "/home", "/usr/local"}

// KeptLocalDirs are the directories of /usr/local a kept sandbox's
// workload (uid 1000) owns, so it can install packages that outlive the
// run, as on every provider that keeps; bin and sbin stay root's (the
// host's installs are laid there).
var KeptLocalDirs = []string{"/usr/local", "/usr/local/lib", "/usr/local/share", "/usr/local/include", "/usr/local/etc", "/usr/local/src"}

// HandLocalTo1000 gives each of KeptLocalDirs that root has (a directory,
// never a symlink) to 1000:1000. oac-guest --kept calls it too: the
// container of a kept docker sandbox.
func HandLocalTo1000(root string) error {
	for _, d := range KeptLocalDirs {
		var st unix.Stat_t
		if err := unix.Lstat(root+d, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		if st.Uid == bootstrap.DaemonUID && st.Gid == bootstrap.DaemonGID {
			continue
		}
		if err := unix.Lchown(root+d, bootstrap.DaemonUID, bootstrap.DaemonGID); err != nil {
			return fmt.Errorf("kept %s: give it to uid 1000: %w", d, err)
		}
	}
	return nil
}

// Mount points of a kept sandbox's disks in the initramfs (0700; nothing
// reaches them after the switch).
const (
	lowerMount = "/oac/lower"
	keptMount  = "/oac/kept"
)

// movedMounts are the initramfs's mounts carried into the new root.
var movedMounts = []string{"/dev", "/proc", "/sys", "/run", "/tmp"}

// Filesystem superblock magics.
const (
	ext4Magic  = 0xEF53     // le16 at 1024+56
	erofsMagic = 0xE0F5E1E2 // le32 at 1024
)

// DetectFS tells ext4 (ext2 and ext3 too, which the ext4 driver mounts)
// and erofs apart by their superblocks.
func DetectFS(r io.ReaderAt) (string, error) {
	b := make([]byte, 1088)
	if _, err := r.ReadAt(b, 0); err != nil {
		return "", fmt.Errorf("read superblock: %w", err)
	}
	switch {
	case uint32(b[1024])|uint32(b[1025])<<8|uint32(b[1026])<<16|uint32(b[1027])<<24 == erofsMagic:
		return "erofs", nil
	case uint16(b[1080])|uint16(b[1081])<<8 == ext4Magic:
		return "ext4", nil
	}
	return "", errors.New("neither an ext4 nor an erofs filesystem (oac-image build makes disk.ext4 and disk.erofs)")
}

// SwitchRoot mounts the block device dev read-only as the new root, carries
// the initramfs's mounts over, lays the writable layers and the installed
// binaries over it, frees the initramfs and makes the new root the
// process's root. oac-guest stays PID 1 throughout: nothing is executed.
// keep lists the WritableDirs a share replaces (no overlay there).
//
// With kept (a kept sandbox's disk, see vmparams.Keep) the root disk is
// mounted read-only at lowerMount instead and the new root is an overlay
// of it whose upper layer is on the kept disk: every write to the root
// (/home, /environment, /usr/local, /etc, ...) outlives the run, and no
// tmpfs layers are laid.
func SwitchRoot(ctx context.Context, log *slog.Logger, dev, kept string, keep map[string]bool) error {
	start := time.Now()
	devPath := "/dev/" + dev
	fstype, err := detectDevice(ctx, devPath, "root disk")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(NewRoot, 0o755); err != nil {
		return fmt.Errorf("root disk: %w", err)
	}
	target := NewRoot
	if kept != "" {
		target = lowerMount
		if err := os.MkdirAll(lowerMount, 0o700); err != nil {
			return fmt.Errorf("root disk: %w", err)
		}
	}
	if err := unix.Mount(devPath, target, fstype, unix.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("mount the root disk %s (%s) read-only: %w (is %s in the image's module list?)", devPath, fstype, err, fstype)
	}
	if kept != "" {
		if err := mountKept(ctx, kept); err != nil {
			return err
		}
		if err := overlay(lowerMount, NewRoot, keptMount+"/root", 0); err != nil {
			return fmt.Errorf("kept root: %w", err)
		}
		if err := HandLocalTo1000(NewRoot); err != nil {
			return err
		}
	}
	need := append(append([]string{}, movedMounts...), WritableDirs...)
	for _, d := range need {
		if st, err := os.Lstat(NewRoot + d); err != nil || !st.IsDir() {
			return fmt.Errorf("the root disk has no directory %s to mount on (images from oac-image build have every mount point)", d)
		}
	}
	// Which are mount points is read before any moves: /proc goes too.
	mounted := map[string]bool{}
	for _, m := range movedMounts {
		mounted[m], _ = initsys.IsMountPoint(m)
	}
	for _, m := range movedMounts {
		switch {
		case mounted[m]:
			if err := unix.Mount(m, NewRoot+m, "", unix.MS_MOVE, ""); err != nil {
				return fmt.Errorf("move %s into the new root: %w", m, err)
			}
		case m == "/run" || m == "/tmp":
			mode := "mode=0755"
			if m == "/tmp" {
				mode = "mode=1777"
			}
			if err := unix.Mount("tmpfs", NewRoot+m, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, mode); err != nil {
				return fmt.Errorf("mount tmpfs on %s: %w", m, err)
			}
		}
	}
	for _, d := range WritableDirs {
		if keep[d] || kept != "" {
			continue
		}
		if err := writableLayer(d); err != nil {
			return err
		}
	}
	n, err := carryInstalls()
	if err != nil {
		return err
	}
	freed := freeInitramfs()
	if err := os.Chdir(NewRoot); err != nil {
		return fmt.Errorf("switch root: %w", err)
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("switch root: move the new root onto /: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("switch root: chroot: %w", err)
	}
	if err := os.Chdir("/"); err != nil {
		return fmt.Errorf("switch root: %w", err)
	}
	log.Info("switched into the image's root", "device", devPath, "fstype", fstype, "kept", kept, "installed", n,
		"initramfs_freed_kib", freed>>10, "took", time.Since(start).Round(time.Millisecond).String())
	return nil
}

// detectDevice waits for the block device at devPath and tells its
// filesystem.
func detectDevice(ctx context.Context, devPath, what string) (string, error) {
	if err := waitDevice(ctx, devPath, rootWait); err != nil {
		return "", err
	}
	f, err := os.Open(devPath)
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	fstype, err := DetectFS(f)
	f.Close()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", what, devPath, err)
	}
	return fstype, nil
}

// mountKept mounts a kept sandbox's disk (an ext4 filesystem the host
// made) read-write at keptMount, a directory of the initramfs that
// nothing reaches after the switch. noinit_itable: the host made it with
// lazy inode tables, which need no zeroing (their groups are marked
// unused), so the disk's file on the host stays sparse.
func mountKept(ctx context.Context, dev string) error {
	devPath := "/dev/" + dev
	fstype, err := detectDevice(ctx, devPath, "kept disk")
	if err != nil {
		return err
	}
	if fstype != "ext4" {
		return fmt.Errorf("kept disk %s: %s, want the ext4 filesystem the host made", devPath, fstype)
	}
	if err := os.MkdirAll(keptMount, 0o700); err != nil {
		return fmt.Errorf("kept disk: %w", err)
	}
	if err := unix.Mount(devPath, keptMount, "ext4", unix.MS_NOATIME, "noinit_itable"); err != nil {
		return fmt.Errorf("mount the kept disk %s: %w", devPath, err)
	}
	return nil
}

// KeepInitramfs keeps a guest that runs from its initramfs: the kept disk
// dev is mounted and each of KeptDirs (but those a share replaces, in
// keep) gets an overlay whose upper layer is on it.
func KeepInitramfs(ctx context.Context, log *slog.Logger, dev string, keep map[string]bool) error {
	if err := mountKept(ctx, dev); err != nil {
		return err
	}
	for _, d := range KeptDirs {
		if keep[d] {
			continue
		}
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("kept %s: %w", d, err)
		}
		if err := overlay(d, d, keptMount+"/dirs/"+strings.TrimPrefix(strings.ReplaceAll(d, "/", "-"), "-"), unix.MS_NOSUID|unix.MS_NODEV); err != nil {
			return fmt.Errorf("kept %s: %w", d, err)
		}
	}
	if err := HandLocalTo1000(""); err != nil {
		return err
	}
	log.Info("kept directories on the kept disk", "device", "/dev/"+dev, "dirs", strings.Join(KeptDirs, " "))
	return nil
}

// overlay mounts an overlay on target with lower below and base/upper
// above (base/work its work directory), making them when missing. The
// overlay's root takes its owner and mode from the upper directory, so
// they are copied from lower's.
func overlay(lower, target, base string, flags uintptr) error {
	var st unix.Stat_t
	if err := unix.Stat(lower, &st); err != nil {
		return err
	}
	upper, work := base+"/upper", base+"/work"
	if err := os.MkdirAll(base, 0o700); err != nil {
		return err
	}
	for _, p := range []string{upper, work} {
		if err := os.MkdirAll(p, 0o700); err != nil {
			return err
		}
	}
	if err := unix.Chown(upper, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	if err := unix.Chmod(upper, st.Mode&0o7777); err != nil {
		return err
	}
	opts := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work
	if err := unix.Mount("overlay", target, "overlay", flags, opts); err != nil {
		return fmt.Errorf("mount overlay on %s: %w (is overlay in the image's module list?)", target, err)
	}
	return nil
}

// waitDevice waits for a device node devtmpfs creates once the driver
// probed the device.
func waitDevice(ctx context.Context, p string, d time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for {
		if _, err := os.Stat(p); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("root disk %s did not appear within %s (is virtio_blk in the image's module list, and is a disk attached?)", p, d)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// writableLayer mounts an overlay on NewRoot+d: the image's directory
// below, a fresh tmpfs directory above.
func writableLayer(d string) error {
	if err := os.MkdirAll(NewRoot+rwDir, 0o700); err != nil {
		return fmt.Errorf("writable layer on %s: %w", d, err)
	}
	base := NewRoot + rwDir + "/" + strings.TrimPrefix(d, "/")
	if err := overlay(NewRoot+d, NewRoot+d, base, unix.MS_NOSUID|unix.MS_NODEV); err != nil {
		return fmt.Errorf("writable layer on %s: %w", d, err)
	}
	return nil
}

// carryInstalls lays the initramfs's /usr/local/bin (what the host
// installed for this start) over the image's: the files are copied to a
// root-owned directory on /run and a read-only overlay puts them in front
// of the image's own. It returns how many files it carried.
func carryInstalls() (int, error) {
	ents, err := os.ReadDir(InstallBin)
	if errors.Is(err, os.ErrNotExist) || (err == nil && len(ents) == 0) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("installed binaries: %w", err)
	}
	if st, err := os.Stat(NewRoot + InstallBin); err != nil || !st.IsDir() {
		return 0, fmt.Errorf("installed binaries: the root disk has no %s to lay them over", InstallBin)
	}
	dst := NewRoot + installDir
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return 0, fmt.Errorf("installed binaries: %w", err)
	}
	n := 0
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		if err := copyFile(filepath.Join(InstallBin, e.Name()), filepath.Join(dst, e.Name()), 0o755); err != nil {
			return 0, fmt.Errorf("installed binaries: %w", err)
		}
		n++
	}
	opts := "lowerdir=" + dst + ":" + NewRoot + InstallBin
	if err := unix.Mount("overlay", NewRoot+InstallBin, "overlay", unix.MS_RDONLY|unix.MS_NODEV, opts); err != nil {
		return 0, fmt.Errorf("installed binaries: mount overlay on %s: %w", InstallBin, err)
	}
	return n, nil
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// freeInitramfs removes the initramfs's files (what switch_root does), so
// their memory returns to the guest; it returns the bytes freed. It only
// acts when / is the initramfs (ramfs or tmpfs) and never crosses into
// another filesystem, NewRoot included.
func freeInitramfs() int64 {
	var sfs unix.Statfs_t
	if err := unix.Statfs("/", &sfs); err != nil || (sfs.Type != unix.RAMFS_MAGIC && sfs.Type != unix.TMPFS_MAGIC) {
		return 0
	}
	var root unix.Stat_t
	if err := unix.Lstat("/", &root); err != nil {
		return 0
	}
	return removeTree("/", root.Dev, NewRoot)
}

// removeTree removes what dir holds on device dev, except keep, and
// returns the bytes of the files it removed.
func removeTree(dir string, dev uint64, keep string) int64 {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	var freed int64
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		if p == keep {
			continue
		}
		var st unix.Stat_t
		if unix.Lstat(p, &st) != nil || st.Dev != dev {
			continue // gone, or another filesystem mounted here
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			freed += removeTree(p, dev, keep)
			_ = unix.Rmdir(p)
			continue
		}
		if unix.Unlink(p) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
			freed += st.Size
		}
	}
	return freed
}

// MountShares mounts each virtio-fs share on its path, shallowest first
// (so /environment comes before /environment/workspace), creating the
// mount point where the root is writable. A writable share whose root
// uid 1000 cannot write is given to 1000:1000 when the host allows it.
func MountShares(log *slog.Logger, shares []vmparams.Share) error {
	sorted := append([]vmparams.Share(nil), shares...)
	sort.SliceStable(sorted, func(i, j int) bool {
		return strings.Count(sorted[i].Path, "/") < strings.Count(sorted[j].Path, "/")
	})
	for _, s := range sorted {
		if err := os.MkdirAll(s.Path, 0o755); err != nil {
			return fmt.Errorf("share %s: mount point %s: %w", s.Tag, s.Path, err)
		}
		flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV)
		if s.ReadOnly {
			flags |= unix.MS_RDONLY
		}
		if err := unix.Mount(s.Tag, s.Path, "virtiofs", flags, ""); err != nil {
			return fmt.Errorf("share %s: mount virtiofs on %s: %w (is virtiofs in the image's module list, and does the host share the tag?)", s.Tag, s.Path, err)
		}
		if !s.ReadOnly {
			ensureWritableBy1000(log, s)
		}
		log.Info("share mounted", "tag", s.Tag, "path", s.Path, "read_only", s.ReadOnly)
	}
	return nil
}

func ensureWritableBy1000(log *slog.Logger, s vmparams.Share) {
	var st unix.Stat_t
	if err := unix.Stat(s.Path, &st); err != nil {
		return
	}
	if st.Uid == bootstrap.DaemonUID || st.Mode&0o002 != 0 || (st.Gid == bootstrap.DaemonGID && st.Mode&0o020 != 0) {
		return
	}
	if err := unix.Chown(s.Path, bootstrap.DaemonUID, bootstrap.DaemonGID); err != nil {
		log.Warn("uid 1000 cannot write this share and it cannot be given to 1000:1000", "tag", s.Tag, "path", s.Path,
			"owner", st.Uid, "mode", fmt.Sprintf("%#o", st.Mode&0o7777), "err", err)
	}
}
