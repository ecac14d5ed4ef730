package initsys

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// CgroupMount is the unified cgroup hierarchy, mounted by PID 1 of a VM
// (container-like providers hand the guest its own view instead).
var CgroupMount = Mount{
	Target: "/sys/fs/cgroup", FSType: "cgroup2", Source: "cgroup2",
	Flags: unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, Data: "nsdelegate", Mode: 0o555,
}

// maxModuleList bounds the module list file.
const maxModuleList = 64 << 10

// ReadModuleList reads a list of module paths, one absolute path per line,
// in load order. Blank lines and lines starting with '#' are skipped.
func ReadModuleList(r io.Reader) ([]string, error) {
	var out []string
	sc := bufio.NewScanner(io.LimitReader(r, maxModuleList))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if !strings.HasPrefix(line, "/") || !strings.HasSuffix(line, ".ko") {
			return nil, fmt.Errorf("module list: %q is not an absolute path to a .ko file", line)
		}
		out = append(out, line)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("module list: %w", err)
	}
	return out, nil
}

// LoadModule loads one kernel module file with finit_module. A module that
// is already loaded is not an error.
func LoadModule(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("load module: %w", err)
	}
	defer f.Close()
	if err := unix.FinitModule(int(f.Fd()), "", 0); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("load module %s: %w (was the image built for this kernel? modules must match its version)", path, err)
	}
	return nil
}

// SetClock sets the wall clock to t.
func SetClock(t time.Time) error {
	tv := unix.NsecToTimeval(t.UnixNano())
	if err := unix.Settimeofday(&tv); err != nil {
		return fmt.Errorf("set clock: %w", err)
	}
	return nil
}

// PowerOff syncs filesystems and powers the machine off. It returns only
// if the kernel refused (not PID 1 of a VM, or no privilege).
func PowerOff() error {
	unix.Sync()
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF); err != nil {
		return fmt.Errorf("power off: %w", err)
	}
	return nil
}
