package directguard

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/internal/netreach"
	"github.com/oac/sandbox-agent/internal/syscall32"
)

// The tests' children: this test binary run again with childEnv set.
const childEnv = "OAC_DIRECTGUARD_TEST_CHILD"

// childCommand runs this test binary again as child.
func childCommand(child string, env ...string) *exec.Cmd {
	cmd := exec.Command("/proc/self/exe")
	// A race-enabled child would otherwise sleep a second as it exits.
	race := strings.TrimSpace(os.Getenv("GORACE") + " atexit_sleep_ms=0")
	cmd.Env = append(append(os.Environ(), childEnv+"="+child, "GORACE="+race), env...)
	return cmd
}

func childMain() bool {
	switch os.Getenv(childEnv) {
	case "":
		return false
	case "guest-root":
		os.Exit(guestRootMain())
	case "share-holder":
		os.Exit(shareHolderMain())
	case "compat-probe":
		fmt.Println("pid", syscall32.Call(sysGetpid32, 0, 0, 0))
		os.Exit(0)
	case "outside-cgroup":
		os.Exit(outsideCgroupMain())
	}
	fmt.Fprintln(os.Stderr, "unknown child", os.Getenv(childEnv))
	os.Exit(2)
	return true
}

// guestRoot is a hostile guest's root: a process in a user namespace of
// its own, mapped to root there, and a network namespace of its own, so
// it has every capability in its namespaces and none in the host's. It is
// handed a socket of the host's (fd 3) and runs the test's commands on
// it, one answer line each.
type guestRoot struct {
	t   *testing.T
	in  io.WriteCloser
	out *bufio.Scanner
}

func startGuestRoot(t *testing.T, handed *os.File) *guestRoot {
	t.Helper()
	cmd := childCommand("guest-root")
	cmd.ExtraFiles = []*os.File{handed}
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNET,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
		Pdeathsig:   syscall.SIGKILL,
	}
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		in.Close()
		// It ends at the end of its input; a race-enabled child that saw
		// a race exits 66.
		assert.NoError(t, cmd.Wait(), "the guest root exits cleanly")
	})
	g := &guestRoot{t: t, in: in, out: bufio.NewScanner(out)}
	require.True(t, g.out.Scan(), "the guest root started")
	require.Equal(t, "ready", g.out.Text())
	return g
}

func (g *guestRoot) do(format string, args ...any) string {
	g.t.Helper()
	cmd := fmt.Sprintf(format, args...)
	_, err := io.WriteString(g.in, cmd+"\n")
	require.NoError(g.t, err)
	require.True(g.t, g.out.Scan(), "the guest root answered %q", cmd)
	return g.out.Text()
}

func guestRootMain() int {
	fmt.Println("ready")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		fmt.Println(guestRootDo(strings.Fields(sc.Text())))
	}
	return 0
}

func answer(err error) string {
	if err == nil {
		return "ok"
	}
	return errnoName(err)
}

func setsockoptBytes(fd, level, name int, b []byte) error {
	var p unsafe.Pointer
	if len(b) > 0 {
		p = unsafe.Pointer(&b[0])
	}
	if _, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), uintptr(level), uintptr(name), uintptr(p), uintptr(len(b)), 0); e != 0 {
		return e
	}
	return nil
}

func intBytes(v int) []byte {
	b := make([]byte, 4)
	binary.NativeEndian.PutUint32(b, uint32(v))
	return b
}

// sockoptValue is a value each option accepts on an unguarded socket.
func sockoptValue(o netreach.Sockopt) []byte {
	switch {
	case o.Level == unix.SOL_SOCKET && o.Name == unix.SO_BINDTODEVICE:
		// Unbinding: so that SO_BINDTOIFINDEX, next, may still bind (a
		// bound socket's binding takes CAP_NET_RAW to change).
		return nil
	case o.Level == unix.IPPROTO_IP && o.Name == unix.IP_OPTIONS:
		return []byte{1, 1, 1, 1} // four NOPs
	case o.Level == unix.IPPROTO_IP && o.Name == unix.IP_UNICAST_IF:
		b := make([]byte, 4)
		binary.BigEndian.PutUint32(b, 1) // lo, in network order
		return b
	case o.Level == unix.IPPROTO_IP && o.Name == unix.IP_LOCAL_PORT_RANGE:
		return intBytes(1024 | 65535<<16)
	case o.Level == unix.IPPROTO_IPV6 && (o.Name == unix.IPV6_RTHDR || o.Name == unix.IPV6_2292RTHDR || o.Name == unix.IPV6_2292PKTOPTIONS):
		return nil // clears: nothing to check
	}
	return intBytes(1) // an interface index: lo
}

func memDrops(fd int) (uint32, error) {
	var m [unix.SK_MEMINFO_VARS]uint32
	l := uint32(unsafe.Sizeof(m))
	if _, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_MEMINFO, uintptr(unsafe.Pointer(&m[0])), uintptr(unsafe.Pointer(&l)), 0); e != 0 {
		return 0, e
	}
	return m[unix.SK_MEMINFO_DROPS], nil
}

func rawSockaddr(ap netip.AddrPort) []byte {
	b := make([]byte, 16)
	binary.NativeEndian.PutUint16(b, unix.AF_INET)
	binary.BigEndian.PutUint16(b[2:], ap.Port())
	a := ap.Addr().As4()
	copy(b[4:], a[:])
	return b
}

func anyAddrOf(fd int) unix.Sockaddr {
	if d, _ := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN); d == unix.AF_INET6 {
		return &unix.SockaddrInet6{}
	}
	return &unix.SockaddrInet4{}
}

func localPort(fd int) int {
	switch sa, _ := unix.Getsockname(fd); sa := sa.(type) {
	case *unix.SockaddrInet4:
		return sa.Port
	case *unix.SockaddrInet6:
		return sa.Port
	}
	return -1
}

func guestRootDo(f []string) string {
	arg := func(i int) string {
		if i < len(f) {
			return f[i]
		}
		return ""
	}
	fd, _ := strconv.Atoi(arg(1))
	switch f[0] {
	case "caps":
		// Root in its own namespaces: it may bring its own loopback up.
		s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return answer(err)
		}
		defer unix.Close(s)
		ifr, err := unix.NewIfreq("lo")
		if err != nil {
			return answer(err)
		}
		if err := unix.IoctlIfreq(s, unix.SIOCGIFFLAGS, ifr); err != nil {
			return answer(err)
		}
		ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
		return answer(unix.IoctlIfreq(s, unix.SIOCSIFFLAGS, ifr))
	case "nonblock":
		return answer(unix.SetNonblock(fd, true))
	case "disconnect":
		return answer(disconnect(fd))
	case "connect":
		return answer(unix.Connect(fd, sockaddrOf(netip.MustParseAddrPort(arg(2)))))
	case "compat-connect":
		return answer(connect32(fd, rawSockaddr(netip.MustParseAddrPort(arg(2)))))
	case "fastopen":
		return answer(unix.Sendto(fd, []byte("x"), unix.MSG_FASTOPEN, sockaddrOf(netip.MustParseAddrPort(arg(2)))))
	case "bind":
		return answer(unix.Bind(fd, anyAddrOf(fd)))
	case "listen":
		if err := unix.Listen(fd, 8); err != nil {
			return answer(err)
		}
		return "ok " + strconv.Itoa(localPort(fd))
	case "local":
		return "ok " + strconv.Itoa(localPort(fd))
	case "accept":
		nfd, _, err := unix.Accept4(fd, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		if err != nil {
			return answer(err)
		}
		return "ok " + strconv.Itoa(nfd)
	case "peer":
		sa, err := unix.Getpeername(fd)
		if err != nil {
			return answer(err)
		}
		in := sa.(*unix.SockaddrInet4)
		return "ok " + netip.AddrPortFrom(netip.AddrFrom4(in.Addr), uint16(in.Port)).String()
	case "waitdrops":
		// Until the socket has dropped more than arg 2 segments.
		than, _ := strconv.Atoi(arg(2))
		deadline := time.Now().Add(10 * time.Second)
		for {
			d, err := memDrops(fd)
			if err != nil {
				return answer(err)
			}
			if int(d) > than {
				return "ok " + strconv.Itoa(int(d))
			}
			if time.Now().After(deadline) {
				return "timeout " + strconv.Itoa(int(d))
			}
			time.Sleep(time.Millisecond)
		}
	case "sockopts":
		var out []string
		for _, o := range refusedSockopts() {
			out = append(out, o.What+"="+answer(setsockoptBytes(fd, int(o.Level), int(o.Name), sockoptValue(o))))
		}
		return strings.Join(out, " ")
	case "mark":
		return answer(unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_MARK, 1))
	case "repair":
		return answer(unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR, 1))
	case "skns":
		ns, err := unix.IoctlRetInt(fd, unix.SIOCGSKNS)
		if err == nil {
			unix.Close(ns)
		}
		return answer(err)
	case "ifconf":
		// SIOCGIFCONF: the names of the socket's namespace's interfaces.
		buf := make([]byte, 40*64)
		ifc := struct {
			len int32
			_   int32
			buf uintptr
		}{len: int32(len(buf)), buf: uintptr(unsafe.Pointer(&buf[0]))}
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCGIFCONF, uintptr(unsafe.Pointer(&ifc))); e != 0 {
			return answer(e)
		}
		var names []string
		for off := 0; off+40 <= int(ifc.len); off += 40 {
			names = append(names, unix.ByteSliceToString(buf[off:off+16]))
		}
		return "ok " + strings.Join(names, ",")
	case "compat-sockopt":
		level, _ := strconv.Atoi(arg(2))
		name, _ := strconv.Atoi(arg(3))
		val, _ := hex.DecodeString(arg(4))
		return answer(setsockopt32(fd, level, name, val))
	case "write":
		_, err := unix.Write(fd, []byte(arg(2)))
		return answer(err)
	case "race":
		threads, _ := strconv.Atoi(arg(2))
		n, _ := strconv.Atoi(arg(3))
		return race(fd, threads, n, netip.MustParseAddrPort(arg(4)))
	}
	return "unknown command " + f[0]
}

// race has threads at once disconnect the socket and try to connect it,
// and send to it with MSG_FASTOPEN, n times each; it answers how each call
// ended, counted.
func race(fd, threads, n int, to netip.AddrPort) string {
	var mu sync.Mutex
	counts := map[string]int{}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range threads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sa := sockaddrOf(to) // the call writes into it: one each
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			mine := map[string]int{}
			<-start
			for range n {
				mine["disconnect:"+answer(disconnect(fd))]++
				mine["connect:"+answer(unix.Connect(fd, sa))]++
				mine["fastopen:"+answer(unix.Sendto(fd, []byte("x"), unix.MSG_FASTOPEN, sa))]++
			}
			mu.Lock()
			for k, v := range mine {
				counts[k] += v
			}
			mu.Unlock()
		}()
	}
	close(start)
	wg.Wait()
	var out []string
	for k, v := range counts {
		out = append(out, k+"="+strconv.Itoa(v))
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

// shareHolderMain opens a guard on the share directory it is given and
// holds it until killed or its stdin closes.
func shareHolderMain() int {
	size, _ := strconv.Atoi(os.Getenv("SHARE_SIZE"))
	g, err := Open(Config{ShareDir: os.Getenv("SHARE_DIR"), ShareSize: size})
	if err != nil {
		fmt.Println("err", err)
		return 1
	}
	lo, hi := g.Share()
	fmt.Println("share", lo, hi)
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// outsideCgroupMain runs in a cgroup of its own: it opens a guard there
// (attached to that cgroup only) and tries to seal the socket it is
// handed on fd 3, made by its parent outside that cgroup, and one it makes
// itself.
func outsideCgroupMain() int {
	g, err := Open(Config{ShareDir: os.Getenv("SHARE_DIR")})
	if err != nil {
		fmt.Println("open:", err)
		return 1
	}
	defer g.Close()
	handed := os.NewFile(3, "handed")
	rc, err := handed.SyscallConn()
	if err != nil {
		fmt.Println("handed:", err)
		return 1
	}
	fmt.Println("handed:", answerErr(g.Seal(rc)))
	peer, err := netip.ParseAddrPort(os.Getenv("PEER"))
	if err != nil {
		fmt.Println("peer:", err)
		return 1
	}
	d := net.Dialer{Control: func(network, _ string, c syscall.RawConn) error { return g.Lock(network, peer, c) }}
	own, err := d.Dial("tcp4", peer.String())
	if err != nil {
		fmt.Println("own:", err)
		return 1
	}
	defer own.Close()
	rc, err = own.(*net.TCPConn).SyscallConn()
	if err != nil {
		fmt.Println("own:", err)
		return 1
	}
	fmt.Println("own:", answerErr(g.Seal(rc)))
	return 0
}

func answerErr(err error) string {
	if err == nil {
		return "sealed"
	}
	return err.Error()
}

var errNoCompat = errors.New("this kernel runs no 32-bit calls")

// i386 system call numbers (arch/x86/entry/syscalls/syscall_32.tbl): the
// kernel shows a 32-bit setsockopt to no cgroup setsockopt program, so a
// hostile guest root can try exactly that.
const (
	sysGetpid32     = 20
	sysConnect32    = 362
	sysSetsockopt32 = 366
)

// connect32 is the 32-bit connect to the raw struct sockaddr sa.
func connect32(fd int, sa []byte) error {
	p, free, err := syscall32.Low(sa)
	if err != nil {
		return err
	}
	defer free()
	return errno32(syscall32.Call5(sysConnect32, uintptr(fd), p, uintptr(len(sa)), 0, 0))
}

// setsockopt32 is the 32-bit setsockopt.
func setsockopt32(fd, level, name int, val []byte) error {
	p, free, err := syscall32.Low(val)
	if err != nil {
		return err
	}
	defer free()
	return errno32(syscall32.Call5(sysSetsockopt32, uintptr(fd), uintptr(level), uintptr(name), p, uintptr(len(val))))
}

func errno32(r int32) error {
	if r < 0 && r > -4096 {
		return unix.Errno(-r)
	}
	return nil
}

// haveCompat tells whether 32-bit calls work here: a child tries one (a
// kernel without them kills it).
func haveCompat(t *testing.T) error {
	t.Helper()
	if runtime.GOARCH != "amd64" {
		return errNoCompat
	}
	cmd := childCommand("compat-probe")
	out, err := cmd.Output()
	if err != nil || !strings.HasPrefix(string(out), "pid ") {
		return fmt.Errorf("%w (%v)", errNoCompat, err)
	}
	return nil
}
