package workload

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Direct mode's kernel backstop (docs/egress.md, "Direct mode"): a
// Landlock ruleset that handles TCP bind and connect and allows no port,
// so the kernel refuses every TCP bind and connect a workload process
// makes itself, on any socket: its own, or one of the host's it holds,
// whatever another of its threads did meanwhile. The agent's supervisor
// makes the binds and connects it approves on the workload's behalf (its
// own calls are not the workload's: Landlock judges the caller).

// landlockTCPABI is the first Landlock ABI with TCP rules (Linux 6.7).
const landlockTCPABI = 4

// ErrNoLandlockTCP wraps why this kernel cannot refuse a process's own TCP
// bind and connect; nothing was changed.
var ErrNoLandlockTCP = errors.New("the kernel cannot refuse the workload's own TCP connects")

// LandlockTCP returns nil when this kernel can refuse a process's own TCP
// bind and connect (Landlock ABI 4 or later), else why not (wrapping
// ErrNoLandlockTCP).
func LandlockTCP() error {
	abi, _, e := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	switch {
	case e == unix.ENOSYS || e == unix.EOPNOTSUPP:
		return fmt.Errorf("%w: Landlock is not enabled (it needs CONFIG_SECURITY_LANDLOCK and landlock in the kernel's lsm= list)", ErrNoLandlockTCP)
	case e != 0:
		return fmt.Errorf("%w: landlock_create_ruleset: %w (a container runtime's seccomp profile may refuse it)", ErrNoLandlockTCP, e)
	case abi < landlockTCPABI:
		return fmt.Errorf("%w: this kernel's Landlock (ABI %d) has no TCP rules; Linux 6.7 and later have them", ErrNoLandlockTCP, abi)
	}
	return nil
}

// rulesetAttr is struct landlock_ruleset_attr up to handled_access_net
// (ABI 4); the kernel takes a shorter struct as having no later fields.
type rulesetAttr struct {
	handledFS, handledNet uint64
}

// restrictTCP puts the calling thread, and what it execs, under a
// Landlock domain refusing every TCP bind and connect of its own. The
// thread must have no_new_privs. An error wraps ErrNoLandlockTCP when
// nothing was changed.
func restrictTCP() error {
	if err := LandlockTCP(); err != nil {
		return err
	}
	attr := rulesetAttr{handledNet: unix.LANDLOCK_ACCESS_NET_BIND_TCP | unix.LANDLOCK_ACCESS_NET_CONNECT_TCP}
	fd, _, e := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr), 0)
	if e != 0 {
		return fmt.Errorf("%w: landlock_create_ruleset: %w", ErrNoLandlockTCP, e)
	}
	defer unix.Close(int(fd))
	if _, _, e := unix.Syscall(unix.SYS_LANDLOCK_RESTRICT_SELF, fd, 0, 0); e != 0 {
		return fmt.Errorf("%w: landlock_restrict_self: %w", ErrNoLandlockTCP, e)
	}
	return nil
}

// InstallDirect puts the calling thread (which has no_new_privs) under
// direct mode: first the Landlock domain (the kernel refuses its own TCP
// bind and connect), then the trap, whose listener it returns for the
// agent alone. An error wrapping ErrNoLandlockTCP changed nothing; any
// other leaves the thread unable to bind or connect TCP at all, and the
// process must not run.
func InstallDirect() (*os.File, error) {
	if err := restrictTCP(); err != nil {
		return nil, err
	}
	l, err := InstallDirectFilter()
	if err != nil {
		return nil, fmt.Errorf("direct mode: Landlock is in force but the trap is not: %w", err)
	}
	return l, nil
}
