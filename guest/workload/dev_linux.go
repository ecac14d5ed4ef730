package workload

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/guest/doors"
)

// The contract's /dev, as bwrap --dev and an OCI runtime give it: these
// devices, the pseudo-terminals and the shared-memory and message-queue
// directories, and the fd links. Nothing of the guest's own /dev beyond
// it (a VM's disks and vsock, a WSL distribution's GPU, whatever a
// platform adds) is the workload's.
var (
	devNodes = []string{"null", "zero", "full", "random", "urandom", "tty", "ptmx"}
	devDirs  = []string{"pts", "shm", "mqueue"}
	devLinks = [][2]string{{"fd", "/proc/self/fd"}, {"stdin", "/proc/self/fd/0"}, {"stdout", "/proc/self/fd/1"}, {"stderr", "/proc/self/fd/2"}}
)

// minimalDev replaces /dev, in the calling process's mount namespace
// (which must be its own), with a tmpfs holding only the contract's
// devices, each bound from the old /dev. A device the guest lacks is left
// out; /dev/ptmx stays a symlink where it was one (into pts).
func minimalDev() error {
	type bind struct {
		name string
		fd   int
		dir  bool
	}
	var binds []bind
	links := map[string]string{}
	defer func() {
		for _, b := range binds {
			unix.Close(b.fd)
		}
	}()
	for _, name := range append(append([]string(nil), devNodes...), devDirs...) {
		p := "/dev/" + name
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); errors.Is(err, unix.ENOENT) {
			continue
		} else if err != nil {
			return fmt.Errorf("/dev: %s: %w", p, err)
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFLNK:
			target, err := os.Readlink(p)
			if err != nil {
				return fmt.Errorf("/dev: %w", err)
			}
			links[name] = target
			continue
		case unix.S_IFCHR, unix.S_IFDIR:
		default:
			continue // not a device: not the contract's
		}
		fd, err := unix.Open(p, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("/dev: open %s: %w", p, err)
		}
		binds = append(binds, bind{name, fd, st.Mode&unix.S_IFMT == unix.S_IFDIR})
	}
	if err := unix.Mount("tmpfs", "/dev", "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755,size=64k,nr_inodes=64"); err != nil {
		return fmt.Errorf("/dev: mount a tmpfs: %w", err)
	}
	for _, b := range binds {
		dst := "/dev/" + b.name
		var err error
		if b.dir {
			err = os.Mkdir(dst, 0o755)
		} else {
			err = os.WriteFile(dst, nil, 0)
		}
		if err != nil {
			return fmt.Errorf("/dev: %w", err)
		}
		if err := unix.Mount("/proc/self/fd/"+strconv.Itoa(b.fd), dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("/dev: bind %s: %w", b.name, err)
		}
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join("/dev", name)); err != nil {
			return fmt.Errorf("/dev: %w", err)
		}
	}
	for _, l := range devLinks {
		if err := os.Symlink(l[1], filepath.Join("/dev", l[0])); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("/dev: %w", err)
		}
	}
	return nil
}

// closeDoors applies the platform's doors plan in the calling process's
// mount namespace (its own, every mount a slave): each door's mount is
// detached, or covered where the kernel refuses (a mount a user namespace
// locked); each directory to cover gets an empty read-only tmpfs. It
// returns the files to mask with the process's other masks.
func closeDoors(p doors.Plan) ([]string, error) {
	masks := append([]string(nil), p.Mask...)
	for _, mp := range p.Detach {
		err := unix.Unmount(mp, unix.MNT_DETACH)
		if err == nil || errors.Is(err, unix.ENOENT) {
			continue
		}
		mask, cerr := cover(mp)
		if cerr != nil {
			return nil, fmt.Errorf("close the platform door %s: detach: %v; cover: %w", mp, err, cerr)
		}
		masks = append(masks, mask...)
	}
	for _, d := range p.Cover {
		mask, err := cover(d)
		if err != nil {
			return nil, fmt.Errorf("close the platform door %s: %w", d, err)
		}
		masks = append(masks, mask...)
	}
	return masks, nil
}

// cover hides a directory under an empty read-only tmpfs, or returns a
// file to mask (a socket, a device, a regular file) instead.
func cover(p string) ([]string, error) {
	fd, err := unix.Openat2(unix.AT_FDCWD, p, &unix.OpenHow{
		Flags: unix.O_PATH | unix.O_CLOEXEC | unix.O_NOFOLLOW, Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if errors.Is(err, unix.ENOSYS) {
		fd, err = walkNoSymlinks(p)
	}
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return []string{p}, nil
	}
	if err := unix.Mount("tmpfs", "/proc/self/fd/"+strconv.Itoa(fd), "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0555,size=4k,nr_inodes=2"); err != nil {
		return nil, fmt.Errorf("cover with a tmpfs: %w", err)
	}
	return nil, nil
}
