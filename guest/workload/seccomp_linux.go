package workload

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sort"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/internal/netreach"
)

// Denied are the system calls every workload process gets EPERM for: other
// processes' memory and descriptors (ptrace, process_vm_readv/writev,
// pidfd_getfd, process_madvise, kcmp), joining namespaces (setns), and the
// kernel interfaces a sandboxed program has no use for and that have a
// history of privilege escalations (the OCI bundle's list: keyrings, bpf,
// perf_event_open, userfaultfd, fanotify, kexec, open_by_handle_at; and
// io_uring, whose operations no filter sees).
var Denied = []string{
	"add_key", "bpf", "fanotify_init", "io_uring_enter", "io_uring_register", "io_uring_setup",
	"kcmp", "kexec_file_load", "kexec_load", "keyctl", "open_by_handle_at", "perf_event_open",
	"pidfd_getfd", "process_madvise", "process_vm_readv", "process_vm_writev", "ptrace",
	"request_key", "setns", "userfaultfd",
}

// NewUserNSCalls fail with EPERM when their flags (the first argument)
// ask for a new user namespace: inside one a process holds every
// capability, which is how `unshare -Ur` would undo the sandbox.
var NewUserNSCalls = []string{"clone", "unshare"}

// SocketCalls fail with EAFNOSUPPORT when they ask for an AF_VSOCK socket
// (the first argument): vsock reaches the host's services from a VM and,
// since it ignores network namespaces, from a container too; the agent
// needs it, the workload never does.
var SocketCalls = []string{"socket"}

// SocketcallCalls is i386's multiplexed socket call: its arguments lie
// behind a pointer no filter can read, so creating a socket through it
// (its first argument SYS_SOCKET) fails with ENOSYS; libcs since 2015 use
// the direct socket call, which the filter sees.
var SocketcallCalls = []string{"socketcall"}

// sysSocket is socketcall's number for socket (linux/net.h).
const sysSocket = 1

// NetReachCalls fail with EPERM when they reach past a socket into its
// network namespace (package internal/netreach): ioctl with a request in
// netreach.Ioctls (interfaces, addresses, routes, ARP, the namespace),
// setsockopt with a level and name in netreach.Sockopts (an interface to
// bind to, source routing). In the workload's own namespace they would
// show only lo; on a socket of the host's (direct mode) they would show
// and use the host's network, so they are refused on every provider and
// in every mode alike. i386's socketcall for setsockopt is ENOSYS.
var NetReachCalls = []string{"ioctl", "setsockopt"}

// ENOSYSCalls fail with ENOSYS: clone3 passes its flags behind a pointer,
// which a filter cannot read, and C libraries fall back to clone on ENOSYS.
var ENOSYSCalls = []string{"clone3"}

// seccomp_data offsets (linux/seccomp.h): nr, arch, then the arguments as
// 64-bit values; the guests are little-endian, so an argument's low 32
// bits come first.
const (
	offNR           = 0
	offArch         = 4
	offArg0         = 16
	retAllow uint32 = unix.SECCOMP_RET_ALLOW
	// retKill ends the whole process (SECCOMP_RET_KILL_PROCESS); kernels
	// before 4.14 read it as SECCOMP_RET_KILL, ending the thread.
	retKill uint32 = 0x80000000
)

func retErrno(errno unix.Errno) uint32 {
	return unix.SECCOMP_RET_ERRNO | uint32(errno)&unix.SECCOMP_RET_DATA
}

// Filter returns the workload's seccomp program for a process built for
// goarch. It checks seccomp_data.arch first: the native convention and
// its 32-bit compat one each get the deny list with their own numbers;
// x32 calls on x86_64 and any other arch kill the process, so no call can
// slip past the list under another numbering.
func Filter(goarch string) ([]bpf.Instruction, error) {
	return perArch(goarch, block, retKill)
}

// perArch is a program that dispatches on seccomp_data.arch: each of
// goarch's conventions gets its block (which always returns), any other
// arch otherwise.
func perArch(goarch string, block func(*assembler, abi) error, otherwise uint32) ([]bpf.Instruction, error) {
	conventions := abis(goarch)
	if len(conventions) == 0 {
		return nil, fmt.Errorf("seccomp: no system call table for %s", goarch)
	}
	a := newAssembler()
	a.emit(bpf.LoadAbsolute{Off: offArch, Size: 4})
	for i, c := range conventions {
		next := fmt.Sprintf("arch%d", i+1)
		a.jump(bpf.JumpEqual, c.audit, "", next)
		if err := block(a, c); err != nil {
			return nil, err
		}
		a.label(next)
	}
	a.emit(bpf.RetConstant{Val: otherwise})
	return a.assemble()
}

// block is one convention's checks; it always returns.
func block(a *assembler, c abi) error {
	p := c.name + "."
	a.emit(bpf.LoadAbsolute{Off: offNR, Size: 4})
	if c.x32 {
		a.jump(bpf.JumpGreaterOrEqual, x32Bit, p+"kill", "")
	}
	for _, rule := range []struct {
		names  []string
		target string
	}{{NewUserNSCalls, p + "flags"}, {SocketCalls, p + "family"}, {SocketcallCalls, p + "socketcall"}, {ENOSYSCalls, p + "enosys"}, {Denied, p + "eperm"}, {NetReachCalls[:1], p + "ioctl"}, {NetReachCalls[1:], p + "setsockopt"}} {
		for _, name := range rule.names {
			nr, ok := c.nr[name]
			if !ok {
				if slices.Contains(c.absent, name) {
					continue
				}
				return fmt.Errorf("seccomp: %s has no number for %s", c.name, name)
			}
			a.jump(bpf.JumpEqual, nr, rule.target, "")
		}
	}
	a.emit(bpf.RetConstant{Val: retAllow})
	a.label(p + "flags")
	a.emit(bpf.LoadAbsolute{Off: offArg0, Size: 4})
	a.jump(bpf.JumpBitsSet, unix.CLONE_NEWUSER, p+"eperm", "")
	a.emit(bpf.RetConstant{Val: retAllow})
	a.label(p + "family")
	a.emit(bpf.LoadAbsolute{Off: offArg0, Size: 4})
	a.jump(bpf.JumpEqual, unix.AF_VSOCK, p+"eafnosupport", "")
	a.emit(bpf.RetConstant{Val: retAllow})
	a.label(p + "socketcall")
	a.emit(bpf.LoadAbsolute{Off: offArg0, Size: 4})
	a.jump(bpf.JumpEqual, sysSocket, p+"enosys", "")
	a.jump(bpf.JumpEqual, netreach.SocketcallSetsockopt, p+"enosys", "")
	a.emit(bpf.RetConstant{Val: retAllow})
	netReach(a, p)
	a.label(p + "eafnosupport")
	a.emit(bpf.RetConstant{Val: retErrno(unix.EAFNOSUPPORT)})
	a.label(p + "eperm")
	a.emit(bpf.RetConstant{Val: retErrno(unix.EPERM)})
	a.label(p + "enosys")
	a.emit(bpf.RetConstant{Val: retErrno(unix.ENOSYS)})
	a.label(p + "kill")
	a.emit(bpf.RetConstant{Val: retKill})
	return nil
}

// netReach emits the ioctl and setsockopt checks (labels p+"ioctl" and
// p+"setsockopt"); both end in p+"eperm" or allow. The kernel reads an
// ioctl's request, a setsockopt's level and name as 32-bit ints: only
// the low halves of the arguments are compared.
func netReach(a *assembler, p string) {
	a.label(p + "ioctl")
	a.emit(bpf.LoadAbsolute{Off: offArg0 + 8, Size: 4})
	for i, r := range netreach.Ioctls {
		next := fmt.Sprintf("%sioctl%d", p, i)
		a.jump(bpf.JumpGreaterOrEqual, r.First, "", next)
		a.jump(bpf.JumpGreaterThan, r.Last, next, p+"eperm")
		a.label(next)
	}
	a.emit(bpf.RetConstant{Val: retAllow})
	a.label(p + "setsockopt")
	var levels []uint32
	for _, o := range netreach.Sockopts {
		if !slices.Contains(levels, o.Level) {
			levels = append(levels, o.Level)
		}
	}
	a.emit(bpf.LoadAbsolute{Off: offArg0 + 8, Size: 4})
	for _, l := range levels {
		a.jump(bpf.JumpEqual, l, fmt.Sprintf("%slevel%d", p, l), "")
	}
	a.emit(bpf.RetConstant{Val: retAllow})
	for _, l := range levels {
		a.label(fmt.Sprintf("%slevel%d", p, l))
		a.emit(bpf.LoadAbsolute{Off: offArg0 + 16, Size: 4})
		for _, o := range netreach.Sockopts {
			if o.Level == l {
				a.jump(bpf.JumpEqual, o.Name, p+"eperm", "")
			}
		}
		a.emit(bpf.RetConstant{Val: retAllow})
	}
}

// assembler resolves named jump targets into classic BPF's forward skips.
type assembler struct {
	ins    []bpf.Instruction
	labels map[string]int
	jumps  map[int][2]string // instruction index -> true, false label ("" falls through)
}

func newAssembler() *assembler {
	return &assembler{labels: map[string]int{}, jumps: map[int][2]string{}}
}

func (a *assembler) emit(i bpf.Instruction) { a.ins = append(a.ins, i) }

func (a *assembler) label(name string) { a.labels[name] = len(a.ins) }

func (a *assembler) jump(cond bpf.JumpTest, val uint32, ifTrue, ifFalse string) {
	a.jumps[len(a.ins)] = [2]string{ifTrue, ifFalse}
	a.emit(bpf.JumpIf{Cond: cond, Val: val})
}

func (a *assembler) assemble() ([]bpf.Instruction, error) {
	skip := func(from int, label string) (uint8, error) {
		if label == "" {
			return 0, nil
		}
		to, ok := a.labels[label]
		if !ok {
			return 0, fmt.Errorf("seccomp: undefined label %q", label)
		}
		d := to - from - 1
		if d < 0 || d > 255 {
			return 0, fmt.Errorf("seccomp: jump to %q out of range (%d)", label, d)
		}
		return uint8(d), nil
	}
	for i, labels := range a.jumps {
		j := a.ins[i].(bpf.JumpIf)
		var err error
		if j.SkipTrue, err = skip(i, labels[0]); err != nil {
			return nil, err
		}
		if j.SkipFalse, err = skip(i, labels[1]); err != nil {
			return nil, err
		}
		a.ins[i] = j
	}
	if len(a.ins) > unix.BPF_MAXINSNS {
		return nil, errors.New("seccomp: program too long")
	}
	return a.ins, nil
}

// filterNames lists every system call the filter acts on, sorted (for
// descriptions).
func filterNames() []string {
	names := slices.Concat(Denied, NewUserNSCalls, SocketCalls, SocketcallCalls, ENOSYSCalls, NetReachCalls, DirectCalls, []string{"sendto", "sendmsg", "sendmmsg"})
	sort.Strings(names)
	return names
}

// InstallFilter installs the workload's filter on the calling thread (and,
// with tsync, on every thread of the process). The thread must have
// no_new_privs set. Filters stack: one already installed (an OCI
// runtime's) stays in force as well.
func InstallFilter(tsync bool) error {
	prog, err := Filter(runtime.GOARCH)
	if err != nil {
		return err
	}
	var flags uintptr
	if tsync {
		flags = unix.SECCOMP_FILTER_FLAG_TSYNC
	}
	r, errno, err := install(prog, flags)
	if err != nil {
		return err
	}
	if errno != 0 {
		return fmt.Errorf("seccomp: install the workload filter: %w (the kernel needs CONFIG_SECCOMP_FILTER)", errno)
	}
	if r != 0 {
		return fmt.Errorf("seccomp: thread %d could not be synchronized", r)
	}
	return nil
}

// install assembles prog and installs it with flags on the calling
// thread; r is seccomp(2)'s result (a listener, a thread that could not
// be synchronized).
func install(prog []bpf.Instruction, flags uintptr) (uintptr, unix.Errno, error) {
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return 0, 0, fmt.Errorf("seccomp: assemble: %w", err)
	}
	filters := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		filters[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	fprog := unix.SockFprog{Len: uint16(len(filters)), Filter: &filters[0]}
	r, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, flags, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(filters)
	return r, errno, nil
}
