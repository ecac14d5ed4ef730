package workload

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Direct mode (docs/egress.md, "Direct mode"): a second filter traps the
// workload's connect, bind and listen to the agent, which answers a
// connect to the outside with the host's own socket in place of the
// workload's (package guest/direct). The filter only traps: the agent
// decides nothing about targets, the host does.

// DirectCalls are trapped to the agent's listener (SECCOMP_RET_USER_NOTIF).
var DirectCalls = []string{"bind", "connect", "listen"}

// FastOpenCalls fail with EPERM when their flags (the argument given)
// carry MSG_FASTOPEN: a send that connects would be a connect the agent
// never sees. On a connected TCP socket the kernel ignores a send's
// address otherwise.
var FastOpenCalls = map[string]int{"sendto": 3, "sendmsg": 2, "sendmmsg": 3}

// socketcall's calls that hide a connect, bind, listen or send behind
// its pointer argument (linux/net.h): ENOSYS in direct mode, as
// socketcall(SYS_SOCKET) always is.
var directSocketcalls = []uint32{2, 3, 4, 11, 16, 20}

// retUserNotif is SECCOMP_RET_USER_NOTIF.
const retUserNotif uint32 = 0x7fc00000

// DirectFilter returns direct mode's program for a process built for
// goarch: every convention the workload's filter lets through gets the
// same traps with its own numbers; anything else is the workload
// filter's to refuse (it kills foreign arches and x32).
func DirectFilter(goarch string) ([]bpf.Instruction, error) {
	return perArch(goarch, directBlock, retAllow)
}

func directBlock(a *assembler, c abi) error {
	p := c.name + "."
	a.emit(bpf.LoadAbsolute{Off: offNR, Size: 4})
	nr := func(name string) (uint32, bool, error) {
		n, ok := c.nr[name]
		if !ok && !contains(c.absent, name) {
			return 0, false, fmt.Errorf("seccomp: %s has no number for %s", c.name, name)
		}
		return n, ok, nil
	}
	for _, name := range DirectCalls {
		n, ok, err := nr(name)
		if err != nil {
			return err
		}
		if ok {
			a.jump(bpf.JumpEqual, n, p+"notify", "")
		}
	}
	for _, name := range []string{"sendto", "sendmsg", "sendmmsg"} {
		n, ok, err := nr(name)
		if err != nil {
			return err
		}
		if ok {
			a.jump(bpf.JumpEqual, n, fmt.Sprintf("%sflags%d", p, FastOpenCalls[name]), "")
		}
	}
	if n, ok, err := nr("socketcall"); err != nil {
		return err
	} else if ok {
		a.jump(bpf.JumpEqual, n, p+"socketcall", "")
	}
	a.emit(bpf.RetConstant{Val: retAllow})
	a.label(p + "notify")
	a.emit(bpf.RetConstant{Val: retUserNotif})
	for _, arg := range []int{2, 3} {
		a.label(fmt.Sprintf("%sflags%d", p, arg))
		a.emit(bpf.LoadAbsolute{Off: uint32(offArg0 + 8*arg), Size: 4})
		a.jump(bpf.JumpBitsSet, unix.MSG_FASTOPEN, p+"eperm", "")
		a.emit(bpf.RetConstant{Val: retAllow})
	}
	a.label(p + "socketcall")
	a.emit(bpf.LoadAbsolute{Off: offArg0, Size: 4})
	for _, call := range directSocketcalls {
		a.jump(bpf.JumpEqual, call, p+"enosys", "")
	}
	a.emit(bpf.RetConstant{Val: retAllow})
	a.label(p + "eperm")
	a.emit(bpf.RetConstant{Val: retErrno(unix.EPERM)})
	a.label(p + "enosys")
	a.emit(bpf.RetConstant{Val: retErrno(unix.ENOSYS)})
	return nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// seccompFlagWaitKillableRecv is SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV
// (Linux 5.19): once the agent has a notification, only a fatal signal
// interrupts the trapped call. Without it a signal (Go's preemption
// sends SIGURG all the time) restarts a connect the host is already
// making, and the host's socket is wasted.
const seccompFlagWaitKillableRecv = 1 << 5

// InstallDirectFilter installs direct mode's filter on the calling thread
// (which has no_new_privs) and returns its listener, which only the agent
// may hold: the caller passes it on and closes it before exec.
func InstallDirectFilter() (*os.File, error) {
	prog, err := DirectFilter(runtime.GOARCH)
	if err != nil {
		return nil, err
	}
	r, errno, err := install(prog, unix.SECCOMP_FILTER_FLAG_NEW_LISTENER|seccompFlagWaitKillableRecv)
	if err == nil && errno == unix.EINVAL {
		r, errno, err = install(prog, unix.SECCOMP_FILTER_FLAG_NEW_LISTENER)
	}
	if err != nil {
		return nil, err
	}
	if errno != 0 {
		return nil, fmt.Errorf("seccomp: install direct mode's filter: %w (the kernel needs Linux 5.9 for a listener that can add descriptors)", errno)
	}
	unix.CloseOnExec(int(r))
	return os.NewFile(r, "seccomp listener"), nil
}

// sendListener passes l to the agent on the launcher's direct socket.
func sendListener(sock int, l *os.File) error {
	if err := unix.Sendmsg(sock, []byte{'L'}, unix.UnixRights(int(l.Fd())), nil, 0); err != nil {
		return fmt.Errorf("pass the seccomp listener to the agent: %w", err)
	}
	return nil
}

// receiveListener takes the listener a launcher passed on sock, which it
// did before it exec'd (so it is there now, or never): exactly one
// descriptor, and a seccomp listener.
func receiveListener(sock *os.File) (*os.File, error) {
	buf := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(4*2))
	n, oobn, flags, _, err := unix.Recvmsg(int(sock.Fd()), buf, oob, unix.MSG_DONTWAIT|unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("receive the seccomp listener: %w", err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	var fds []int
	if err == nil {
		for _, m := range msgs {
			got, perr := unix.ParseUnixRights(&m)
			if perr != nil {
				err = perr
			}
			fds = append(fds, got...)
		}
	}
	if err != nil || flags&unix.MSG_CTRUNC != 0 || n != 1 || len(fds) != 1 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, errors.New("receive the seccomp listener: the launcher sent something else")
	}
	f := os.NewFile(uintptr(fds[0]), "seccomp listener")
	if link, _ := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fds[0])); link != "anon_inode:seccomp notify" {
		f.Close()
		return nil, fmt.Errorf("receive the seccomp listener: got %q, not a seccomp listener", link)
	}
	return f, nil
}

// DirectCall names the trapped call of a notification: "connect",
// "bind", "listen", or "" for a number direct mode does not trap under
// that arch (a listener only ever reports the trapped ones).
func DirectCall(arch, nr uint32) string {
	for _, c := range abis(runtime.GOARCH) {
		if c.audit != arch {
			continue
		}
		for _, name := range DirectCalls {
			if n, ok := c.nr[name]; ok && n == nr {
				return name
			}
		}
	}
	return ""
}
