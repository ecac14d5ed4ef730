package workload

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/internal/syscall32"
)

// childEnv selects what this test binary does when a test re-runs it as a
// child process (see TestMain).
const childEnv = "OAC_WORKLOAD_TEST_CHILD"

// runChild runs this test binary as a child in mode and returns its
// output and exit.
func runChild(t *testing.T, mode string) ([]byte, error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+mode)
	return cmd.Output()
}

// attempts are what a hostile workload tries, run in a child with or
// without the filter: each result is the errno name, or "ok".
func attempts() map[string]string {
	res := map[string]string{}
	// The target is a process of the child's own, never the test binary
	// (an attach that succeeds stops its target).
	sleeper := exec.Command("/bin/sleep", "30")
	if err := sleeper.Start(); err != nil {
		res["start target"] = err.Error()
		return res
	}
	defer func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() }()
	target := sleeper.Process.Pid
	raw := func(name string, trap uintptr, args ...uintptr) {
		a := make([]uintptr, 6)
		copy(a, args)
		_, _, e := unix.Syscall6(trap, a[0], a[1], a[2], a[3], a[4], a[5])
		res[name] = errnoName(e)
	}
	raw("ptrace attach", unix.SYS_PTRACE, unix.PTRACE_SEIZE, uintptr(target))
	raw("socket vsock", unix.SYS_SOCKET, unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_CLOEXEC)
	raw("socket unix", unix.SYS_SOCKET, unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC)
	if res["ptrace attach"] == "ok" {
		_ = unix.PtraceDetach(target)
	}
	var b [8]byte
	local := []unix.Iovec{{Base: &b[0], Len: 8}}
	remote := []unix.RemoteIovec{{Base: firstMapping(target), Len: 8}}
	_, err := unix.ProcessVMReadv(target, local, remote, 0)
	res["process_vm_readv"] = errName(err)
	_, err = unix.ProcessVMWritev(target, local, remote, 0)
	res["process_vm_writev"] = errName(err)
	if fd, err := unix.PidfdOpen(target, 0); err == nil {
		_, err = unix.PidfdGetfd(fd, 0, 0)
		res["pidfd_getfd"] = errName(err)
		unix.Close(fd)
	} else {
		res["pidfd_getfd"] = "pidfd_open: " + errName(err)
	}
	raw("keyctl", unix.SYS_KEYCTL, unix.KEYCTL_GET_KEYRING_ID, uintptr(0xfffffffd)) // KEY_SPEC_SESSION_KEYRING
	raw("add_key", unix.SYS_ADD_KEY)
	raw("bpf", unix.SYS_BPF, 0xffff)
	raw("perf_event_open", unix.SYS_PERF_EVENT_OPEN)
	raw("userfaultfd", unix.SYS_USERFAULTFD, 0)
	raw("io_uring_setup", unix.SYS_IO_URING_SETUP, 1)
	raw("setns", unix.SYS_SETNS, ^uintptr(0), 0)
	raw("clone3", unix.SYS_CLONE3)
	// A Go process has many threads, so without the filter unshare of a user
	// namespace fails with EINVAL; the filter answers first, with EPERM.
	raw("unshare newuser", unix.SYS_UNSHARE, unix.CLONE_NEWUSER)
	raw("unshare none", unix.SYS_UNSHARE, 0)
	for _, c := range []struct {
		name  string
		flags uintptr
	}{{"clone newuser", unix.CLONE_NEWUSER}, {"clone newuser+newns", unix.CLONE_NEWUSER | unix.CLONE_NEWNS}, {"clone plain", 0}} {
		cmd := exec.Command("/bin/true")
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: c.flags}
		if c.flags&unix.CLONE_NEWUSER != 0 {
			cmd.SysProcAttr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}}
		}
		res[c.name] = errName(cmd.Run())
	}
	netReachAttempts(res)
	if syscall32.Available() {
		r32 := func(name string, trap, a1 uintptr) {
			if r := syscall32.Call(trap, a1, 0, 0); r < 0 {
				res[name] = unix.ErrnoName(unix.Errno(-r))
			} else {
				res[name] = "ok"
			}
		}
		r32("i386 unshare newuser", 310, unix.CLONE_NEWUSER)
		r32("i386 unshare none", 310, 0)
		r32("i386 ptrace peek", 26, unix.PTRACE_PEEKDATA)
		r32("i386 keyctl", 288, unix.KEYCTL_GET_KEYRING_ID)
		r32("i386 socketcall socket", 102, 1)
		r32("i386 socketcall setsockopt", 102, 14)
		res["i386 getpid"] = fmt.Sprint(syscall32.Call(20, 0, 0, 0) == int32(os.Getpid()))
	}
	return res
}

// netReachAttempts are the calls that would show or use a socket's
// network namespace (internal/netreach), and the ones a socket answers
// itself, which stay open.
func netReachAttempts(res map[string]string) {
	tcp, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		res["socket tcp"] = errName(err)
		return
	}
	defer unix.Close(tcp)
	tcp6, err := unix.Socket(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		res["socket tcp6"] = errName(err)
		return
	}
	defer unix.Close(tcp6)
	ioctl := func(name string, req uintptr, arg unsafe.Pointer) {
		_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(tcp), req, uintptr(arg))
		res[name] = errnoName(e)
	}
	var ifr [40]byte
	copy(ifr[:], "lo")
	ioctl("SIOCGIFHWADDR lo", unix.SIOCGIFHWADDR, unsafe.Pointer(&ifr[0]))
	var buf [4096]byte
	conf := struct {
		len int32
		_   int32
		buf uintptr
	}{len: int32(len(buf)), buf: uintptr(unsafe.Pointer(&buf[0]))}
	ioctl("SIOCGIFCONF", unix.SIOCGIFCONF, unsafe.Pointer(&conf))
	runtime.KeepAlive(&buf)
	ioctl("SIOCGSKNS", unix.SIOCGSKNS, nil)
	ioctl("SIOCGIFCONF in the upper bits", 1<<32|unix.SIOCGIFCONF, unsafe.Pointer(&conf))
	var n int32
	ioctl("FIONREAD", unix.SIOCINQ, unsafe.Pointer(&n))
	ioctl("SIOCOUTQNSD", unix.SIOCOUTQNSD, unsafe.Pointer(&n))
	res["SO_BINDTODEVICE"] = errName(unix.SetsockoptString(tcp, unix.SOL_SOCKET, unix.SO_BINDTODEVICE, "lo"))
	res["SO_BINDTOIFINDEX"] = errName(unix.SetsockoptInt(tcp, unix.SOL_SOCKET, unix.SO_BINDTOIFINDEX, 1))
	// Loose source routing through 127.0.0.2 (NOP, LSRR, length 7, pointer 4).
	res["IP_OPTIONS"] = errName(unix.SetsockoptString(tcp, unix.IPPROTO_IP, unix.IP_OPTIONS, string([]byte{1, 0x83, 7, 4, 127, 0, 0, 2})))
	// A segment routing header (type 4) with one segment, ::1.
	srh := make([]byte, 24)
	srh[1], srh[2], srh[23] = 2, 4, 1
	res["IPV6_RTHDR"] = errName(unix.SetsockoptString(tcp6, unix.IPPROTO_IPV6, unix.IPV6_RTHDR, string(srh)))
	res["IP_UNICAST_IF"] = errName(unix.SetsockoptInt(tcp, unix.IPPROTO_IP, unix.IP_UNICAST_IF, 0))
	res["TCP_NODELAY"] = errName(unix.SetsockoptInt(tcp, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1))
	res["SO_KEEPALIVE"] = errName(unix.SetsockoptInt(tcp, unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1))
}

// firstMapping returns the start of pid's first mapping (its program's
// text, readable).
func firstMapping(pid int) uintptr {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	start, _, _ := strings.Cut(string(b), "-")
	v, _ := strconv.ParseUint(start, 16, 64)
	return uintptr(v)
}

func errnoName(e unix.Errno) string {
	if e == 0 {
		return "ok"
	}
	return unix.ErrnoName(e)
}

func errName(err error) string {
	if err == nil {
		return "ok"
	}
	var e unix.Errno
	if ok := asErrno(err, &e); ok {
		return unix.ErrnoName(e)
	}
	return err.Error()
}

func asErrno(err error, e *unix.Errno) bool {
	for err != nil {
		if x, ok := err.(unix.Errno); ok {
			*e = x
			return true
		}
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return false
		}
		err = u.Unwrap()
	}
	return false
}

// child is the child process's side: mode "filtered" installs the filter
// first, "plain" does not; "x32" installs it and makes one x32 call.
func child(mode string) int {
	runtime.LockOSThread()
	if mode != "plain" {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		if err := InstallFilter(true); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
	}
	if mode == "x32" {
		_, _, e := unix.Syscall(x32Bit|unix.SYS_GETPID, 0, 0, 0)
		fmt.Println("survived:", errnoName(e))
		return 0
	}
	_ = json.NewEncoder(os.Stdout).Encode(attempts())
	return 0
}

func TestTheFilterOnTheRealKernel(t *testing.T) {
	needRoot(t)
	run := func(mode string) map[string]string {
		out, err := runChild(t, mode)
		require.NoError(t, err, "%s child", mode)
		var res map[string]string
		require.NoError(t, json.Unmarshal(out, &res), "%s", out)
		return res
	}
	plain, filtered := run("plain"), run("filtered")
	t.Logf("without the filter: %v", plain)
	t.Logf("with the filter:    %v", filtered)
	for _, name := range []string{"ptrace attach", "process_vm_readv", "process_vm_writev", "pidfd_getfd",
		"keyctl", "add_key", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "setns",
		"unshare newuser", "clone newuser", "clone newuser+newns"} {
		assert.Equal(t, "EPERM", filtered[name], name)
	}
	assert.Equal(t, "ENOSYS", filtered["clone3"])
	assert.Equal(t, "EAFNOSUPPORT", filtered["socket vsock"], "no vsock for the workload")
	assert.Equal(t, "ok", filtered["socket unix"])
	if _, err := os.Stat("/sys/module/vsock"); err == nil {
		assert.Equal(t, "ok", plain["socket vsock"], "this kernel has vsock: the refusal is the filter's")
	}
	assert.Equal(t, "ok", filtered["unshare none"], "unshare without a user namespace is not the filter's business")
	assert.Equal(t, "ok", filtered["clone plain"], "processes still start")
	// The same calls without the filter prove the EPERM is the filter's:
	// as root they succeed or fail for the kernel's own reasons.
	assert.Equal(t, "EINVAL", plain["unshare newuser"], "a threaded process cannot unshare a user namespace")
	assert.Equal(t, "ok", plain["clone newuser"])
	assert.Equal(t, "ok", plain["ptrace attach"])
	assert.Equal(t, "ok", plain["process_vm_readv"], "root reads another process's memory")
	assert.Equal(t, "EFAULT", plain["process_vm_writev"], "past the permission check: the text is not writable")
	assert.Equal(t, "ok", plain["pidfd_getfd"])
	for _, name := range []string{"SIOCGIFHWADDR lo", "SIOCGIFCONF", "SIOCGSKNS", "SO_BINDTODEVICE", "SO_BINDTOIFINDEX", "IP_OPTIONS", "IPV6_RTHDR", "IP_UNICAST_IF"} {
		assert.Equal(t, "EPERM", filtered[name], "%s reaches the socket's namespace", name)
		assert.NotEqual(t, "EPERM", plain[name], "%s: the refusal is the filter's", name)
	}
	for _, name := range []string{"SIOCGIFHWADDR lo", "SIOCGIFCONF", "SO_BINDTODEVICE", "IP_OPTIONS", "IPV6_RTHDR"} {
		assert.Equal(t, "ok", plain[name], "%s works without the filter (what the filter refuses is real)", name)
	}
	for _, name := range []string{"FIONREAD", "SIOCOUTQNSD", "TCP_NODELAY", "SO_KEEPALIVE"} {
		assert.Equal(t, "ok", filtered[name], "%s is the socket's own business", name)
	}
	assert.Equal(t, "EPERM", filtered["SIOCGIFCONF in the upper bits"], "the kernel reads the request as 32 bits")
	if syscall32.Available() {
		assert.Equal(t, "true", plain["i386 getpid"], "this kernel runs i386 calls (IA32 emulation)")
		assert.Equal(t, "true", filtered["i386 getpid"], "everyday i386 calls pass")
		assert.Equal(t, "EPERM", filtered["i386 unshare newuser"])
		assert.Equal(t, "EPERM", filtered["i386 ptrace peek"])
		assert.Equal(t, "EPERM", filtered["i386 keyctl"])
		assert.Equal(t, "ENOSYS", filtered["i386 socketcall socket"])
		assert.Equal(t, "EFAULT", plain["i386 socketcall socket"], "past the filter the kernel reads the arguments' pointer")
		assert.Equal(t, "ENOSYS", filtered["i386 socketcall setsockopt"])
		assert.Equal(t, "EFAULT", plain["i386 socketcall setsockopt"])
		assert.Equal(t, "ok", filtered["i386 unshare none"])
		assert.Equal(t, "EINVAL", plain["i386 unshare newuser"])
		assert.NotEqual(t, "EPERM", plain["i386 keyctl"])
	}
}

func TestAnX32CallKillsTheProcess(t *testing.T) {
	needRoot(t)
	if runtime.GOARCH != "amd64" {
		t.Skip("x32 exists on amd64 only")
	}
	out, err := runChild(t, "x32")
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "output: %s", out)
	ws := ee.Sys().(syscall.WaitStatus)
	assert.True(t, ws.Signaled(), "%v", ws)
	assert.Equal(t, syscall.SIGSYS, ws.Signal())
	assert.Empty(t, out)
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true: these tests need root")
		}
		t.Skip("needs root")
	}
}
