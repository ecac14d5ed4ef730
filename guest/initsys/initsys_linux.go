package initsys

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// Mount is one filesystem PID 1 makes sure is mounted.
type Mount struct {
	Target   string
	FSType   string
	Source   string
	Flags    uintptr
	Data     string
	Mode     os.FileMode
	Required bool // failure is fatal
}

// Mounts lists what PID 1 mounts when missing, in order.
var Mounts = []Mount{
	{Target: "/proc", FSType: "proc", Source: "proc", Flags: unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, Mode: 0o555, Required: true},
	{Target: "/sys", FSType: "sysfs", Source: "sysfs", Flags: unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC | unix.MS_RDONLY, Mode: 0o555},
	{Target: "/dev", FSType: "devtmpfs", Source: "devtmpfs", Flags: unix.MS_NOSUID, Data: "mode=0755", Mode: 0o755, Required: true},
	{Target: "/dev/pts", FSType: "devpts", Source: "devpts", Flags: unix.MS_NOSUID | unix.MS_NOEXEC, Data: "newinstance,ptmxmode=0666,mode=0620", Mode: 0o755},
	{Target: "/dev/shm", FSType: "tmpfs", Source: "shm", Flags: unix.MS_NOSUID | unix.MS_NODEV, Data: "mode=1777", Mode: 0o1777},
	{Target: "/tmp", FSType: "tmpfs", Source: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NODEV, Data: "mode=1777", Mode: 0o1777},
	{Target: "/run", FSType: "tmpfs", Source: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NODEV, Data: "mode=0755", Mode: 0o755},
}

// ContainerMounts are Mounts without sysfs, for a PID 1 the runtime
// started in a container (bwrap, an OCI runtime, Docker: the host names
// the transport). The runtime mounts /sys where the container has one;
// where it has none, a user namespace cannot mount it (the kernel refuses
// a sysfs not already visible), and the refused attempt costs the boot
// most of a millisecond (0.8 ms measured under bwrap).
var ContainerMounts = func() []Mount {
	var out []Mount
	for _, m := range Mounts {
		if m.Target != "/sys" {
			out = append(out, m)
		}
	}
	return out
}()

// Result says what happened to one mount.
type Result struct {
	Target string
	Action string // "present", "mounted" or "failed"
	Err    error
}

// EnsureMounts mounts each entry of ms that is not already a mount point.
// It returns one Result per entry and an error only when a Required mount
// is missing and could not be made. The mount table is read once (a PID 1
// boots on this path): a mount made here hides the mount points below it.
func EnsureMounts(ms []Mount) ([]Result, error) {
	points, _ := mountPoints()
	var res []Result
	for _, m := range ms {
		if points[m.Target] {
			res = append(res, Result{Target: m.Target, Action: "present"})
			continue
		}
		err := mountOne(m)
		if err != nil {
			res = append(res, Result{Target: m.Target, Action: "failed", Err: err})
			if m.Required {
				return res, err
			}
			continue
		}
		res = append(res, Result{Target: m.Target, Action: "mounted"})
		if points == nil {
			// /proc was not mounted before: read the table now.
			points, _ = mountPoints()
			continue
		}
		for p := range points {
			if strings.HasPrefix(p, m.Target+"/") {
				delete(points, p)
			}
		}
		points[m.Target] = true
	}
	return res, nil
}

// mountPoints returns the mount points of /proc/self/mountinfo (nil
// before /proc is mounted).
func mountPoints() (map[string]bool, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	points := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 {
			points[unescapeOctal(f[4])] = true
		}
	}
	return points, nil
}

func mountOne(m Mount) error {
	if err := os.MkdirAll(m.Target, m.Mode.Perm()); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create mount point %s: %w", m.Target, err)
	}
	if err := unix.Mount(m.Source, m.Target, m.FSType, m.Flags, m.Data); err != nil {
		return fmt.Errorf("mount %s on %s: %w", m.FSType, m.Target, err)
	}
	return nil
}

// IsMountPoint reports whether path is a mount point according to
// /proc/self/mountinfo; before /proc is mounted nothing is.
func IsMountPoint(path string) (bool, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	defer f.Close()
	return mountInfoHas(f, path)
}

// mountInfoHas scans a mountinfo document for a mount point equal to path.
func mountInfoHas(r io.Reader, path string) (bool, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 4 && unescapeOctal(f[4]) == path {
			return true, nil
		}
	}
	return false, sc.Err()
}

// unescapeOctal decodes the \040-style escapes mountinfo uses.
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOct(s[i+1]) && isOct(s[i+2]) && isOct(s[i+3]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOct(c byte) bool { return c >= '0' && c <= '7' }

// LoopbackUp sets IFF_UP on lo if it is down. It reports whether it had to.
func LoopbackUp() (bool, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return false, fmt.Errorf("bring lo up: socket: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return false, fmt.Errorf("bring lo up: %w", err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return false, fmt.Errorf("bring lo up: read flags: %w", err)
	}
	flags := ifr.Uint16()
	if flags&unix.IFF_UP != 0 {
		return false, nil
	}
	ifr.SetUint16(flags | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return false, fmt.Errorf("bring lo up: set flags: %w", err)
	}
	return true, nil
}

// SetHostname sets the UTS hostname.
func SetHostname(name string) error {
	if err := unix.Sethostname([]byte(name)); err != nil {
		return fmt.Errorf("set hostname: %w", err)
	}
	return nil
}
