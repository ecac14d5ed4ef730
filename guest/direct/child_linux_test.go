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
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/guest/workload"
)

// The hostile workload: this test binary re-run with childEnv set, in a
// network namespace of its own (with lo up), as the launcher runs a
// workload process in direct mode: uid 1000 with no capability, the
// workload's filter, Landlock's TCP rules and direct mode's trap, whose
// listener it passes to the test on fd 3; then it execs itself (stage
// "run"), so every thread it ever has is under all of them. It runs the
// test's commands from stdin, one result line each.

const childEnv = "OAC_DIRECT_TEST_CHILD"

// addrBuf is the one sockaddr the child's connects pass: at a fixed
// place, so the rewriter can change it while a connect is trapped.
var addrBuf [16]byte

func childMain() int {
	runtime.LockOSThread()
	switch os.Getenv(childEnv) {
	case "flood":
		return floodMain()
	case "run":
		return commands()
	}
	if err := confine(); err != nil {
		fmt.Println("setup", err)
		return 1
	}
	if err := os.Setenv(childEnv, "run"); err != nil {
		fmt.Println("setup", err)
		return 1
	}
	err := syscall.Exec("/proc/self/exe", os.Args, os.Environ())
	fmt.Println("setup exec:", err)
	return 1
}

// confine does what the launcher does for a workload process in direct
// mode, and passes the listener on fd 3.
func confine() error {
	if err := loopbackUp(); err != nil {
		return err
	}
	if err := syscall.Setgroups(nil); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := syscall.Setresgid(1000, 1000, 1000); err != nil {
		return fmt.Errorf("setresgid: %w", err)
	}
	if err := syscall.Setresuid(1000, 1000, 1000); err != nil {
		return fmt.Errorf("setresuid: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	if err := workload.InstallFilter(false); err != nil {
		return err
	}
	l, err := workload.InstallDirect()
	if err != nil {
		return err
	}
	if err := unix.Sendmsg(3, []byte{'L'}, unix.UnixRights(int(l.Fd())), nil, 0); err != nil {
		return err
	}
	l.Close()
	return unix.Close(3)
}

func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo's flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring lo up: %w", err)
	}
	return nil
}

func commands() int {
	// The rewriter: a byte on fd 4 rewrites addrBuf to the address
	// given by "rewrite-to", then acks on fd 5.
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
	cookie, err := NetnsCookie()
	if err != nil {
		fmt.Println("setup netns cookie:", err)
		return 1
	}
	fmt.Println("ready", cookie)
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

func sockaddrBytes(ap netip.AddrPort) [16]byte {
	var b [16]byte
	binary.NativeEndian.PutUint16(b[0:], unix.AF_INET)
	binary.BigEndian.PutUint16(b[2:], ap.Port())
	a := ap.Addr().As4()
	copy(b[4:], a[:])
	return b
}

func put(ap netip.AddrPort) { addrBuf = sockaddrBytes(ap) }

func rawConnect(fd int) error {
	if _, _, e := unix.Syscall(unix.SYS_CONNECT, uintptr(fd), uintptr(unsafe.Pointer(&addrBuf[0])), 16); e != 0 {
		return e
	}
	return nil
}

func connectTo(fd int, b *[16]byte) error {
	if _, _, e := unix.Syscall(unix.SYS_CONNECT, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), 16); e != 0 {
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
	case "peer", "local":
		get := unix.Getpeername
		if f[0] == "local" {
			get = unix.Getsockname
		}
		sa, err := get(atoi(1))
		if err != nil {
			return result(0, err)
		}
		in := sa.(*unix.SockaddrInet4)
		return "ok " + netip.AddrPortFrom(netip.AddrFrom4(in.Addr), uint16(in.Port)).String()
	case "disconnect":
		var sa [16]byte
		return result(0, connectTo(atoi(1), &sa))
	case "reconnect":
		put(netip.MustParseAddrPort(f[2]))
		return result(0, rawConnect(atoi(1)))
	case "bind":
		return result(0, unix.Bind(atoi(1), &unix.SockaddrInet4{}))
	case "listen":
		return result(0, unix.Listen(atoi(1), 1))
	case "serve":
		// A TCP server on the workload's own loopback: its bind and
		// listen are made by the supervisor.
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
		if err != nil {
			return result(0, err)
		}
		if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
			return result(0, err)
		}
		if err := unix.Listen(fd, 16); err != nil {
			return result(0, err)
		}
		sa, err := unix.Getsockname(fd)
		if err != nil {
			return result(0, err)
		}
		return fmt.Sprintf("ok %d %d", fd, sa.(*unix.SockaddrInet4).Port)
	case "accept":
		nfd, _, err := unix.Accept(atoi(1))
		return result(nfd, err)
	case "bind-port":
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
		if err != nil {
			return result(0, err)
		}
		defer unix.Close(fd)
		return result(0, unix.Bind(fd, &unix.SockaddrInet4{Port: atoi(1)}))
	case "udp-connect":
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
		if err != nil {
			return result(0, err)
		}
		defer unix.Close(fd)
		put(netip.MustParseAddrPort(f[1]))
		return result(0, rawConnect(fd))
	case "unix-connect":
		// An abstract unix server and a client of it.
		srv, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		if err != nil {
			return result(0, err)
		}
		defer unix.Close(srv)
		addr := &unix.SockaddrUnix{Name: "@oac-direct-test-" + strconv.Itoa(os.Getpid())}
		if err := unix.Bind(srv, addr); err != nil {
			return result(0, err)
		}
		if err := unix.Listen(srv, 1); err != nil {
			return result(0, err)
		}
		c, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		if err != nil {
			return result(0, err)
		}
		defer unix.Close(c)
		return result(0, unix.Connect(c, addr))
	case "ifconf":
		var buf [1024]byte
		conf := struct {
			len int32
			_   int32
			buf uintptr
		}{len: int32(len(buf)), buf: uintptr(unsafe.Pointer(&buf[0]))}
		_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(atoi(1)), unix.SIOCGIFCONF, uintptr(unsafe.Pointer(&conf)))
		runtime.KeepAlive(&buf)
		if e != 0 {
			return result(0, e)
		}
		return result(int(conf.len), nil)
	case "bindtodevice":
		return result(0, unix.SetsockoptString(atoi(1), unix.SOL_SOCKET, unix.SO_BINDTODEVICE, f[2]))
	case "fastopen":
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
		if err != nil {
			return result(0, err)
		}
		defer unix.Close(fd)
		ap := netip.MustParseAddrPort(f[1])
		return result(0, unix.Sendto(fd, []byte("x"), unix.MSG_FASTOPEN, &unix.SockaddrInet4{Addr: ap.Addr().As4(), Port: int(ap.Port())}))
	case "take":
		// A descriptor the test passes on fd 6.
		buf, oob := make([]byte, 1), make([]byte, unix.CmsgSpace(4))
		_, oobn, _, _, err := unix.Recvmsg(6, buf, oob, 0)
		if err != nil {
			return result(0, err)
		}
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil || len(msgs) != 1 {
			return "err no descriptor"
		}
		fds, err := unix.ParseUnixRights(&msgs[0])
		if err != nil || len(fds) != 1 {
			return "err no descriptor"
		}
		return result(fds[0], nil)
	case "race":
		return race(atoi(1), atoi(2), netip.MustParseAddrPort(f[3]))
	case "flood":
		// n processes under this filter (exec keeps it), each making m
		// connects to f[3] at once.
		n, m := atoi(1), atoi(2)
		var cmds []*exec.Cmd
		for range n {
			c := exec.Command("/proc/self/exe")
			c.Env = append(withoutChildEnv(), childEnv+"=flood", "FLOOD_M="+strconv.Itoa(m), "FLOOD_TO="+f[3])
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

// race is the descriptor-number race against a host socket (host): one
// thread keeps swapping the number x between host and a socket of the
// workload's own (UDP, whose connect and bind the trap lets the kernel
// make; TCP, whose listen it does not), while others keep asking for
// what would take host elsewhere: a disconnect and a connect to target
// (a service of the host's), a bind, a listen. It returns how many calls
// found the host socket at x and succeeded.
func race(host, rounds int, target netip.AddrPort) string {
	udp, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
	if err != nil {
		return result(0, err)
	}
	defer unix.Close(udp)
	tcp, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
	if err != nil {
		return result(0, err)
	}
	defer unix.Close(tcp)
	x, err := unix.Dup(udp)
	if err != nil {
		return result(0, err)
	}
	defer unix.Close(x)
	to, unspec := sockaddrBytes(target), [16]byte{}
	var stop atomic.Bool
	var swapper sync.WaitGroup
	swapper.Add(1)
	go func() {
		defer swapper.Done()
		for !stop.Load() {
			_ = unix.Dup3(host, x, 0)
			_ = unix.Dup3(udp, x, 0)
			_ = unix.Dup3(host, x, 0)
			_ = unix.Dup3(tcp, x, 0)
		}
	}()
	var won atomic.Int64
	var attackers sync.WaitGroup
	for a := range 4 {
		attackers.Add(1)
		go func() {
			defer attackers.Done()
			for range rounds {
				var err error
				switch a {
				case 0:
					if err = connectTo(x, &unspec); err == nil {
						err = connectTo(x, &to)
					}
				case 1:
					err = connectTo(x, &to)
				case 2:
					err = unix.Bind(x, &unix.SockaddrInet4{Port: int(target.Port()) + 1})
				case 3:
					err = unix.Listen(x, 1)
				}
				if err == nil && isHost(x, host) {
					won.Add(1)
				}
			}
		}()
	}
	attackers.Wait()
	stop.Store(true)
	swapper.Wait()
	return result(int(won.Load()), nil)
}

// isHost reports (roughly: x may change meanwhile) whether x is host's
// socket now.
func isHost(x, host int) bool {
	var a, b unix.Stat_t
	return unix.Fstat(x, &a) == nil && unix.Fstat(host, &b) == nil && a.Ino == b.Ino
}

func withoutChildEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, childEnv+"=") {
			env = append(env, kv)
		}
	}
	return env
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
