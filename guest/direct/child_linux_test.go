package direct

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/guest/workload"
)

// The hostile workload: this test binary re-run with childEnv set. It
// puts itself under direct mode's filter on its main thread, passes the
// listener to the test on fd 3, then runs the test's commands from stdin
// on that thread, one result line each.

const childEnv = "OAC_DIRECT_TEST_CHILD"

// addrBuf is the one sockaddr the child's connects pass: at a fixed
// place, so the rewriter can change it while a connect is trapped.
var addrBuf [16]byte

func childMain() int {
	runtime.LockOSThread()
	if os.Getenv(childEnv) == "flood" {
		return floodMain()
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		fmt.Println("setup", err)
		return 1
	}
	l, err := workload.InstallDirectFilter()
	if err != nil {
		fmt.Println("setup", err)
		return 1
	}
	if err := unix.Sendmsg(3, []byte{'L'}, unix.UnixRights(int(l.Fd())), nil, 0); err != nil {
		fmt.Println("setup", err)
		return 1
	}
	l.Close()
	unix.Close(3)
	// The rewriter: a byte on fd 4 rewrites addrBuf to the address
	// given by "rewrite", then acks on fd 5.
	var mu sync.Mutex
	var rewrite [16]byte
	go func() {
		b := make([]byte, 1)
		for {
			if n, _ := unix.Read(4, b); n != 1 {
				return
			}
			mu.Lock()
			for i := range addrBuf {
				*(*byte)(unsafe.Pointer(&addrBuf[i])) = rewrite[i]
			}
			mu.Unlock()
			_, _ = unix.Write(5, b)
		}
	}()
	fmt.Println("ready")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		fmt.Println(run(f, &mu, &rewrite))
	}
	return 0
}

func result(v int, err error) string {
	if err != nil {
		if e, ok := err.(unix.Errno); ok {
			return "err " + unix.ErrnoName(e)
		}
		return "err " + err.Error()
	}
	return "ok " + strconv.Itoa(v)
}

func put(ap netip.AddrPort) {
	var b [16]byte
	binary.NativeEndian.PutUint16(b[0:], unix.AF_INET)
	binary.BigEndian.PutUint16(b[2:], ap.Port())
	a := ap.Addr().As4()
	copy(b[4:], a[:])
	addrBuf = b
}

func rawConnect(fd int) error {
	if _, _, e := unix.Syscall(unix.SYS_CONNECT, uintptr(fd), uintptr(unsafe.Pointer(&addrBuf[0])), 16); e != 0 {
		return e
	}
	return nil
}

func run(f []string, mu *sync.Mutex, rewrite *[16]byte) string {
	atoi := func(i int) int { n, _ := strconv.Atoi(f[i]); return n }
	switch f[0] {
	case "connect", "connect-nonblock", "connect-once":
		typ := unix.SOCK_STREAM
		if f[0] == "connect-nonblock" {
			typ |= unix.SOCK_NONBLOCK
		}
		fd, err := unix.Socket(unix.AF_INET, typ, 0)
		if err != nil {
			return result(0, err)
		}
		if f[0] == "connect-once" { // one SYN retry: seconds, not minutes
			_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_SYNCNT, 1)
		}
		put(netip.MustParseAddrPort(f[1]))
		if err := rawConnect(fd); err != nil {
			unix.Close(fd)
			return result(0, err)
		}
		return result(fd, nil)
	case "rewrite-to":
		mu.Lock()
		old := addrBuf
		put(netip.MustParseAddrPort(f[1]))
		*rewrite = addrBuf
		addrBuf = old
		mu.Unlock()
		return "ok 0"
	case "write":
		n, err := unix.Write(atoi(1), []byte(f[2]))
		return result(n, err)
	case "flags":
		fl, err := unix.FcntlInt(uintptr(atoi(1)), unix.F_GETFL, 0)
		return result(fl&unix.O_NONBLOCK, err)
	case "peer":
		sa, err := unix.Getpeername(atoi(1))
		if err != nil {
			return result(0, err)
		}
		in := sa.(*unix.SockaddrInet4)
		return "ok " + netip.AddrPortFrom(netip.AddrFrom4(in.Addr), uint16(in.Port)).String()
	case "disconnect":
		var sa [16]byte
		_, _, e := unix.Syscall(unix.SYS_CONNECT, uintptr(atoi(1)), uintptr(unsafe.Pointer(&sa[0])), 16)
		if e != 0 {
			return result(0, e)
		}
		return "ok 0"
	case "reconnect":
		put(netip.MustParseAddrPort(f[2]))
		return result(0, rawConnect(atoi(1)))
	case "bind":
		return result(0, unix.Bind(atoi(1), &unix.SockaddrInet4{}))
	case "listen":
		return result(0, unix.Listen(atoi(1), 1))
	case "fastopen":
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
		if err != nil {
			return result(0, err)
		}
		defer unix.Close(fd)
		ap := netip.MustParseAddrPort(f[1])
		return result(0, unix.Sendto(fd, []byte("x"), unix.MSG_FASTOPEN, &unix.SockaddrInet4{Addr: ap.Addr().As4(), Port: int(ap.Port())}))
	case "flood":
		// n processes under this filter (exec keeps it), each making m
		// connects to f[3] at once.
		n, m := atoi(1), atoi(2)
		var cmds []*exec.Cmd
		for range n {
			c := exec.Command("/proc/self/exe")
			c.Env = append(os.Environ(), childEnv+"=flood", "FLOOD_M="+strconv.Itoa(m), "FLOOD_TO="+f[3])
			c.Stdout = os.Stderr
			if err := c.Start(); err != nil {
				return result(0, err)
			}
			cmds = append(cmds, c)
		}
		bad := 0
		for _, c := range cmds {
			if c.Wait() != nil {
				bad++
			}
		}
		return result(bad, nil)
	}
	return "err unknown command"
}

// floodMain makes FLOOD_M connects to FLOOD_TO and exits 0 when every one
// was answered with ECONNREFUSED.
func floodMain() int {
	m, _ := strconv.Atoi(os.Getenv("FLOOD_M"))
	put(netip.MustParseAddrPort(os.Getenv("FLOOD_TO")))
	// From a thread that is not the group's leader, as most of a threaded
	// program's calls are (the notification names the thread).
	done := make(chan int)
	go func() {
		runtime.LockOSThread()
		done <- floodFrom(m)
	}()
	return <-done
}

func floodFrom(m int) int {
	if unix.Gettid() == unix.Getpid() {
		return 3
	}
	for range m {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
		if err != nil {
			return 2
		}
		err = rawConnect(fd)
		unix.Close(fd)
		if err != unix.ECONNREFUSED {
			fmt.Fprintln(os.Stderr, "flood connect:", err)
			return 1
		}
	}
	return 0
}
