package directguard

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/moby/sys/mountinfo"
	"github.com/oac/sandbox-agent/internal/osthread"
	"golang.org/x/sys/unix"
)

// ownCgroup is this process's cgroup v2 path (the "0::" line of
// /proc/self/cgroup), relative to its cgroup namespace's root.
func ownCgroup() (string, error) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return "", fmt.Errorf("direct mode needs cgroup v2: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if p, ok := strings.CutPrefix(sc.Text(), "0::"); ok && strings.HasPrefix(p, "/") {
			return path.Clean(p), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("direct mode needs cgroup v2: %w", err)
	}
	return "", errors.New("direct mode needs cgroup v2: this process has no cgroup v2 path in /proc/self/cgroup")
}

// cgroupInMount is where cgroup rel is under a cgroup2 mount of root
// root at mountpoint, or false when the mount does not show it.
func cgroupInMount(rel, root, mountpoint string) (string, bool) {
	rest, ok := strings.CutPrefix(rel, root)
	if !ok || (root != "/" && rest != "" && !strings.HasPrefix(rest, "/")) {
		return "", false
	}
	return filepath.Join(mountpoint, rest), true
}

// openCgroup opens the directory of this process's cgroup v2, through a
// cgroup2 mount of this mount namespace or, when there is none, one it
// mounts in a private mount namespace.
func openCgroup() (*os.File, string, error) {
	rel, err := ownCgroup()
	if err != nil {
		return nil, "", err
	}
	mounts, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup2"))
	if err != nil {
		return nil, "", fmt.Errorf("direct mode cannot read the mount table to find cgroup v2: %w", err)
	}
	var last error
	for _, m := range mounts {
		dir, ok := cgroupInMount(rel, m.Root, m.Mountpoint)
		if !ok {
			continue
		}
		f, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err == nil {
			return f, dir, nil
		}
		last = err
	}
	if last != nil {
		return nil, "", fmt.Errorf("direct mode cannot open its cgroup v2 directory: %w", last)
	}
	f, err := openCgroupPrivately(rel)
	if err != nil {
		return nil, "", err
	}
	return f, "(private cgroup2 mount)" + rel, nil
}

// openCgroupPrivately mounts cgroup2 in a mount namespace of its own and
// opens cgroup rel there. The namespace belongs to a thread that ends
// with the work; the directory's descriptor outlives both.
func openCgroupPrivately(rel string) (*os.File, error) {
	var f *os.File
	err := osthread.Throwaway(func() (err error) {
		f, err = mountAndOpen(rel)
		return err
	})
	return f, err
}

func mountAndOpen(rel string) (*os.File, error) {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return nil, fmt.Errorf("direct mode needs cgroup v2 mounted (none is, and a private mount namespace to mount it failed): %w", err)
	}
	// Nothing done here may show in the host's mount table.
	if err := unix.Mount("", "/", "", unix.MS_SLAVE|unix.MS_REC, ""); err != nil {
		return nil, fmt.Errorf("direct mode needs cgroup v2 mounted (none is, and making a private mount namespace failed): %w", err)
	}
	dir, err := os.MkdirTemp("", "oac-cgroup2-")
	if err != nil {
		return nil, fmt.Errorf("direct mode needs cgroup v2 mounted (none is, and a directory to mount it on failed): %w", err)
	}
	defer os.Remove(dir)
	if err := unix.Mount("cgroup2", dir, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return nil, fmt.Errorf("direct mode needs cgroup v2 (the kernel has none to mount): %w", err)
	}
	defer unix.Unmount(dir, unix.MNT_DETACH)
	f, err := os.OpenFile(filepath.Join(dir, rel), os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("direct mode cannot open its cgroup v2 directory: %w", err)
	}
	return f, nil
}
