package volmount

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/oac/sandbox-agent/internal/osthread"
	"golang.org/x/sys/unix"
)

// Volume is a host directory to mount at a guest directory.
type Volume struct {
	Guest string // absolute, inside the guest
	Host  string // absolute, on the host
}

// Supported reports whether this process can attach volumes: it needs
// CAP_SYS_ADMIN in the host's namespaces (a root shim).
func Supported() bool { return os.Geteuid() == 0 }

// PeerPidfd returns a pidfd of the process that connected c, a unix
// socket: the guest's agent, which connected before anything of a tenant
// ran. The kernel's SO_PEERPIDFD (Linux 6.5) names it without a race;
// older kernels give its pid (SO_PEERCRED), opened while the connection
// holds the agent.
func PeerPidfd(c net.Conn) (int, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return -1, fmt.Errorf("the guest's transport is %T, not a socket of this kernel", c)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd, pid := -1, 0
	var opErr error
	if err := rc.Control(func(s uintptr) {
		fd, opErr = unix.GetsockoptInt(int(s), unix.SOL_SOCKET, unix.SO_PEERPIDFD)
		if opErr == nil {
			return
		}
		cred, err := unix.GetsockoptUcred(int(s), unix.SOL_SOCKET, unix.SO_PEERCRED)
		if err != nil {
			opErr = err
			return
		}
		pid, opErr = int(cred.Pid), nil
	}); err != nil {
		return -1, err
	}
	if opErr != nil {
		return -1, fmt.Errorf("the guest agent's process: %w", opErr)
	}
	if fd >= 0 {
		unix.CloseOnExec(fd)
		return fd, nil
	}
	if pid <= 0 {
		return -1, errors.New("the guest agent's process is not visible from the host's pid namespace")
	}
	fd, err = unix.PidfdOpen(pid, 0)
	if err != nil {
		return -1, fmt.Errorf("the guest agent's process %d: %w", pid, err)
	}
	unix.CloseOnExec(fd)
	return fd, nil
}

// Attached is what Attach mounted, for Detach, until Release.
type Attached struct {
	pidfd int
	dirs  []string
}

// Attach mounts every volume inside the mount namespace of the process
// that connected c (the guest's agent), or none: a failure unmounts what
// it had mounted. The guest directories must exist there, reached
// without a symlink.
func Attach(c net.Conn, vols []Volume) (*Attached, error) {
	pidfd, err := PeerPidfd(c)
	if err != nil {
		return nil, err
	}
	a, err := AttachPidfd(pidfd, vols)
	if err != nil {
		unix.Close(pidfd)
		return nil, err
	}
	return a, nil
}

// AttachPidfd is Attach for the process pidfd names; the Attached owns
// pidfd.
func AttachPidfd(pidfd int, vols []Volume) (*Attached, error) {
	trees := make([]int, 0, len(vols))
	defer func() {
		for _, t := range trees {
			unix.Close(t)
		}
	}()
	for _, v := range vols {
		t, err := unix.OpenTree(unix.AT_FDCWD, v.Host, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
		if err != nil {
			return nil, fmt.Errorf("volume %s: %s: %w", v.Guest, v.Host, err)
		}
		trees = append(trees, t)
	}
	a := &Attached{pidfd: pidfd}
	err := inGuest(pidfd, func(root int) error {
		for i, v := range vols {
			if err := moveInto(root, trees[i], v.Guest); err != nil {
				_ = unmountAll(root, a.dirs)
				a.dirs = nil
				return fmt.Errorf("volume %s: %w", v.Guest, err)
			}
			a.dirs = append(a.dirs, v.Guest)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return a, nil
}

// Release keeps the mounts and lets go of the guest's process.
func (a *Attached) Release() {
	if a != nil && a.pidfd >= 0 {
		unix.Close(a.pidfd)
		a.pidfd = -1
	}
}

// Detach unmounts what Attach mounted (a claim refused after its
// volumes were in place).
func (a *Attached) Detach() error {
	if a == nil || a.pidfd < 0 {
		return nil
	}
	defer a.Release()
	dirs := a.dirs
	a.dirs = nil
	if len(dirs) == 0 {
		return nil
	}
	return inGuest(a.pidfd, func(root int) error { return unmountAll(root, dirs) })
}

// inGuest runs f on a thread in the mount namespace of pidfd's process,
// with root an O_PATH descriptor of that process's root directory. The
// thread never returns to the shim's namespace: it ends with f.
func inGuest(pidfd int, f func(root int) error) error {
	pid, err := pidOf(pidfd)
	if err != nil {
		return err
	}
	// The process's root, opened in the host's namespace; the pidfd
	// still naming a live process afterwards means the pid was not reused.
	root, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/root", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("the guest agent's root: %w", err)
	}
	defer unix.Close(root)
	if err := unix.PidfdSendSignal(pidfd, 0, nil, 0); err != nil {
		return fmt.Errorf("the guest agent is gone: %w", err)
	}
	return osthread.Throwaway(func() error {
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			return fmt.Errorf("leave the shim's filesystem context: %w", err)
		}
		if err := unix.Setns(pidfd, unix.CLONE_NEWNS); err != nil {
			return fmt.Errorf("enter the guest's mount namespace: %w", err)
		}
		return f(root)
	})
}

// moveInto moves the detached tree onto dir below root, reached without
// symlinks, magic links or "..".
func moveInto(root, tree int, dir string) error {
	target, err := openBelow(root, dir)
	if err != nil {
		return err
	}
	defer unix.Close(target)
	if err := unix.MoveMount(tree, "", target, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("mount: %w", err)
	}
	return nil
}

func unmountAll(root int, dirs []string) error {
	var errs []error
	for i := len(dirs) - 1; i >= 0; i-- {
		fd, err := openBelow(root, dirs[i])
		if err == nil {
			// The top mount at the directory, through the descriptor
			// (this thread's working directory is its own, see inGuest).
			if err = unix.Fchdir(fd); err == nil {
				err = unix.Unmount(".", unix.MNT_DETACH)
			}
			unix.Close(fd)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("unmount volume %s: %w", dirs[i], err))
		}
	}
	return errors.Join(errs...)
}

func openBelow(root int, dir string) (int, error) {
	rel := strings.TrimLeft(dir, "/")
	if rel == "" || !strings.HasPrefix(dir, "/") {
		return -1, fmt.Errorf("%q is not an absolute directory below /", dir)
	}
	fd, err := unix.Openat2(root, rel, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return -1, fmt.Errorf("the guest's %s: %w", dir, err)
	}
	return fd, nil
}

// pidOf reads the pid a pidfd names from its fdinfo.
func pidOf(pidfd int) (int, error) {
	b, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(pidfd))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Pid:"); ok {
			pid, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil || pid <= 0 {
				return 0, fmt.Errorf("the guest agent's process has ended or is not visible here (pid %q)", strings.TrimSpace(v))
			}
			return pid, nil
		}
	}
	return 0, errors.New("not a pidfd")
}
