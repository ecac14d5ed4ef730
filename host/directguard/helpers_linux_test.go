package directguard

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// needRoot skips a test that needs root, or fails it under CI=true, where
// skipping would hide that the guard went untested.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	const why = "the guard loads BPF programs into the kernel, attaches them to a cgroup and destroys sockets: run the tests as root"
	if os.Getenv("CI") == "true" {
		t.Fatal("CI=true: " + why)
	}
	t.Skip(why)
}

// openGuard opens a guard with its own share directory, closed with the
// test.
func openGuard(t *testing.T, cfg Config) *Guard {
	t.Helper()
	if cfg.ShareDir == "" {
		cfg.ShareDir = t.TempDir()
	}
	g, err := Open(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, g.Close()) })
	return g
}

// listen is a loopback listener of the family of addr ("127.0.0.1" or
// "::1"), in ns (nil: this thread's), closed with the test.
func listen(t *testing.T, addr string) (*net.TCPListener, netip.AddrPort) {
	t.Helper()
	return listenIn(t, nil, addr)
}

func listenIn(t *testing.T, ns *netnsThread, addr string) (*net.TCPListener, netip.AddrPort) {
	t.Helper()
	var l net.Listener
	var err error
	inNetns(ns, func() { l, err = net.Listen("tcp", net.JoinHostPort(addr, "0")) })
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	return l.(*net.TCPListener), l.Addr().(*net.TCPAddr).AddrPort()
}

// dialLocked connects to peer as the egress broker does for direct mode:
// locked by g before it connects, sealed after when seal is set.
func dialLocked(t *testing.T, g *Guard, peer netip.AddrPort, seal bool) *net.TCPConn {
	t.Helper()
	return dialLockedIn(t, nil, g, peer, seal)
}

func dialLockedIn(t *testing.T, ns *netnsThread, g *Guard, peer netip.AddrPort, seal bool) *net.TCPConn {
	t.Helper()
	var c net.Conn
	var err error
	inNetns(ns, func() {
		d := net.Dialer{Timeout: 10 * time.Second, Control: func(network, _ string, c syscall.RawConn) error {
			return g.Lock(network, peer, c)
		}}
		c, err = d.Dial("tcp", peer.String())
	})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	tc := c.(*net.TCPConn)
	if seal {
		rc, err := tc.SyscallConn()
		require.NoError(t, err)
		require.NoError(t, g.Seal(rc))
	}
	return tc
}

// withFD runs f on c's descriptor.
func withFD(t *testing.T, c syscall.Conn, f func(fd int)) {
	t.Helper()
	rc, err := c.SyscallConn()
	require.NoError(t, err)
	require.NoError(t, rc.Control(func(fd uintptr) { f(int(fd)) }))
}

func cookieOf(t *testing.T, c syscall.Conn) uint64 {
	t.Helper()
	var cookie uint64
	withFD(t, c, func(fd int) {
		var err error
		cookie, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_COOKIE)
		require.NoError(t, err)
	})
	return cookie
}

func sockaddrOf(ap netip.AddrPort) unix.Sockaddr {
	if ap.Addr().Is4() {
		return &unix.SockaddrInet4{Addr: ap.Addr().As4(), Port: int(ap.Port())}
	}
	return &unix.SockaddrInet6{Addr: ap.Addr().As16(), Port: int(ap.Port())}
}

// disconnect is connect(fd, {AF_UNSPEC}): a TCP socket's disconnect,
// which the kernel allows whoever holds the socket.
func disconnect(fd int) error {
	var sa [16]byte
	if _, _, e := unix.Syscall(unix.SYS_CONNECT, uintptr(fd), uintptr(unsafe.Pointer(&sa[0])), uintptr(len(sa))); e != 0 {
		return e
	}
	return nil
}

func htons(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return binary.NativeEndian.Uint16(b[:])
}

// packet is one TCP segment seen on loopback.
type packet struct {
	src, dst netip.AddrPort
	syn, ack bool
	// options: an IPv4 packet with options (a source route among them).
	options bool
}

// capture sees the TCP segments this host sends on loopback, as they are
// sent (PACKET_OUTGOING: the copy made in the sender's own call, so a
// segment a call sent is queued here before the call returns).
type capture struct {
	t  *testing.T
	fd int
	ns *netnsThread // where it captures and fences; nil: this thread's
}

func newCapture(t *testing.T, ns *netnsThread) *capture {
	t.Helper()
	var fd int
	var err error
	inNetns(ns, func() { fd, err = openCapture() })
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(fd) })
	return &capture{t: t, fd: fd, ns: ns}
}

func openCapture() (int, error) {
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		return -1, err
	}
	// No protocol yet: nothing arrives before the filter is in place.
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	// TCP over IPv4, and IPv6 (its extension headers are walked here),
	// from the network header on (SOCK_DGRAM).
	raw, err := bpf.Assemble([]bpf.Instruction{
		bpf.LoadAbsolute{Off: 0, Size: 1},
		bpf.ALUOpConstant{Op: bpf.ALUOpShiftRight, Val: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: 6, SkipTrue: 3},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: 4, SkipFalse: 3},
		bpf.LoadAbsolute{Off: 9, Size: 1},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.IPPROTO_TCP, SkipFalse: 1},
		bpf.RetConstant{Val: 256},
		bpf.RetConstant{Val: 0},
	})
	if err == nil {
		f := make([]unix.SockFilter, len(raw))
		for i, r := range raw {
			f[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
		}
		err = unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &unix.SockFprog{Len: uint16(len(f)), Filter: &f[0]})
	}
	if err == nil {
		// Room for a flood, should the guard let one through: the
		// fence must still arrive.
		err = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 64<<20)
	}
	if err == nil {
		err = unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: lo.Index})
	}
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// inNetns runs f in ns, or right here when ns is nil.
func inNetns(ns *netnsThread, f func()) {
	if ns == nil {
		f()
		return
	}
	ns.run(f)
}

func parsePacket(b []byte) (packet, bool) {
	if len(b) < 1 {
		return packet{}, false
	}
	var p packet
	var tcp []byte
	switch b[0] >> 4 {
	case 4:
		if len(b) < 20 {
			return p, false
		}
		ihl := int(b[0]&0xf) * 4
		if ihl < 20 || len(b) < ihl+14 {
			return p, false
		}
		src, dst := netip.AddrFrom4([4]byte(b[12:16])), netip.AddrFrom4([4]byte(b[16:20]))
		tcp = b[ihl:]
		p.src = netip.AddrPortFrom(src, binary.BigEndian.Uint16(tcp[0:]))
		p.dst = netip.AddrPortFrom(dst, binary.BigEndian.Uint16(tcp[2:]))
		p.options = ihl > 20
	case 6:
		if len(b) < 40 {
			return p, false
		}
		src, dst := netip.AddrFrom16([16]byte(b[8:24])), netip.AddrFrom16([16]byte(b[24:40]))
		next, off := b[6], 40
		// Hop-by-hop, routing and destination options headers.
		for next == 0 || next == 43 || next == 60 {
			if len(b) < off+2 {
				return p, false
			}
			next, off = b[off], off+(int(b[off+1])+1)*8
		}
		if next != unix.IPPROTO_TCP || len(b) < off+14 {
			return p, false
		}
		tcp = b[off:]
		p.src = netip.AddrPortFrom(src, binary.BigEndian.Uint16(tcp[0:]))
		p.dst = netip.AddrPortFrom(dst, binary.BigEndian.Uint16(tcp[2:]))
	default:
		return p, false
	}
	p.syn = tcp[13]&0x02 != 0
	p.ack = tcp[13]&0x10 != 0
	return p, true
}

// until returns the segments sent before the first one fence matches,
// waiting at most 10 s for it.
func (c *capture) until(fence func(packet) bool) []packet {
	c.t.Helper()
	var seen []packet
	buf := make([]byte, 512)
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, from, err := unix.Recvfrom(c.fd, buf, 0)
		if errors.Is(err, unix.EAGAIN) {
			left := time.Until(deadline)
			require.Positive(c.t, left, "the fence segment was never seen")
			_, err = unix.Poll([]unix.PollFd{{Fd: int32(c.fd), Events: unix.POLLIN}}, int(left.Milliseconds())+1)
			if err != nil && !errors.Is(err, unix.EINTR) {
				require.NoError(c.t, err)
			}
			continue
		}
		require.NoError(c.t, err)
		if ll, ok := from.(*unix.SockaddrLinklayer); !ok || ll.Pkttype != unix.PACKET_OUTGOING {
			continue
		}
		p, ok := parsePacket(buf[:n])
		if !ok {
			continue
		}
		if fence(p) {
			return seen
		}
		seen = append(seen, p)
	}
}

// fence sends a SYN to target from a socket of its own, and returns what
// the capture saw sent before it: every segment an earlier call sent.
func (c *capture) fence(target netip.AddrPort) []packet {
	c.t.Helper()
	var conn net.Conn
	var err error
	inNetns(c.ns, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, err = (&net.Dialer{}).DialContext(ctx, "tcp", target.String())
	})
	require.NoError(c.t, err)
	from := conn.LocalAddr().(*net.TCPAddr).AddrPort()
	conn.Close()
	return c.until(func(p packet) bool { return p.syn && !p.ack && p.src == from })
}

// synsTo counts the SYNs among ps addressed to port.
func synsTo(ps []packet, port uint16) int {
	n := 0
	for _, p := range ps {
		if p.syn && !p.ack && p.dst.Port() == port {
			n++
		}
	}
	return n
}

// synsToAny counts the SYNs among ps addressed to any of to.
func synsToAny(ps []packet, to ...netip.AddrPort) int {
	n := 0
	for _, p := range ps {
		if p.syn && !p.ack && slices.Contains(to, p.dst) {
			n++
		}
	}
	return n
}

// between are the segments among ps sent from src to dst.
func between(ps []packet, src, dst netip.AddrPort) []packet {
	var out []packet
	for _, p := range ps {
		if p.src == src && p.dst == dst {
			out = append(out, p)
		}
	}
	return out
}

// eventually polls cond until it holds, for at most 10 s: for the
// kernel's own state changes, which nothing signals.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func errnoName(err error) string {
	if err == nil {
		return "ok"
	}
	var e unix.Errno
	if errors.As(err, &e) {
		return unix.ErrnoName(e)
	}
	return fmt.Sprint(err)
}

// netnsThread is a thread in a network namespace of its own (only lo,
// up), which runs what it is given: the host's sysctls and addresses stay
// untouched. Its goroutine never unlocks the thread, so the thread ends
// with it.
type netnsThread struct {
	do   chan func()
	done chan struct{}
}

func newNetns(t *testing.T) *netnsThread {
	t.Helper()
	n := &netnsThread{do: make(chan func()), done: make(chan struct{})}
	ready := make(chan error, 1)
	go func() {
		defer close(n.done)
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ready <- err
			return
		}
		ready <- setLinkUp("lo")
		for f := range n.do {
			f()
		}
	}()
	require.NoError(t, <-ready)
	t.Cleanup(func() {
		close(n.do)
		<-n.done
	})
	return n
}

// run runs f on the namespace's thread.
func (n *netnsThread) run(f func()) {
	ran := make(chan struct{})
	n.do <- func() {
		defer close(ran)
		f()
	}
	<-ran
}

func setLinkUp(name string) error {
	s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(s)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(s, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(s, unix.SIOCSIFFLAGS, ifr)
}

// addAddr6 adds addr/128 to lo (struct in6_ifreq, SIOCSIFADDR), in the
// calling thread's namespace.
func addAddr6(addr netip.Addr) error {
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		return err
	}
	s, err := unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(s)
	var req struct {
		addr      [16]byte
		prefixlen uint32
		ifindex   int32
	}
	req.addr = addr.As16()
	req.prefixlen = 128
	req.ifindex = int32(lo.Index)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(s), unix.SIOCSIFADDR, uintptr(unsafe.Pointer(&req))); e != 0 {
		return e
	}
	return nil
}
