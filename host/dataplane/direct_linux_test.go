package dataplane

import (
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/host/api"
	"github.com/oac/sandbox-agent/protocol"
)

// lockedSocket returns a TCP socket locked to peer and connected to it, as
// direct mode hands it to the guest: the raw descriptor, so the test can
// do with it what a hostile guest would.
func lockedSocket(t *testing.T, peer netip.AddrPort) int {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(fd) })
	require.NoError(t, LockDirect("tcp4", peer, rawFD(fd)))
	// A refused handshake fails after one SYN retry, not two minutes.
	require.NoError(t, unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_SYNCNT, 1))
	require.NoError(t, unix.Connect(fd, sockaddr(peer)))
	return fd
}

func sockaddr(ap netip.AddrPort) unix.Sockaddr {
	return &unix.SockaddrInet4{Addr: ap.Addr().As4(), Port: int(ap.Port())}
}

func listen(t *testing.T) (*net.TCPListener, netip.AddrPort) {
	t.Helper()
	l, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	return l, l.Addr().(*net.TCPAddr).AddrPort()
}

// disconnect is connect(fd, {AF_UNSPEC}): a TCP socket's disconnect.
func disconnect(fd int) error {
	var sa [16]byte
	if _, _, e := unix.Syscall(unix.SYS_CONNECT, uintptr(fd), uintptr(unsafe.Pointer(&sa[0])), uintptr(len(sa))); e != 0 {
		return e
	}
	return nil
}

type rawFD int

func (r rawFD) Control(f func(uintptr)) error  { f(uintptr(r)); return nil }
func (r rawFD) Read(func(uintptr) bool) error  { return syscall.EINVAL }
func (r rawFD) Write(func(uintptr) bool) error { return syscall.EINVAL }

func TestALockedSocketTalksToItsUpstream(t *testing.T) {
	l, peer := listen(t)
	fd := lockedSocket(t, peer)
	c, err := l.Accept()
	require.NoError(t, err)
	defer c.Close()
	_, err = unix.Write(fd, []byte("ping"))
	require.NoError(t, err)
	buf := make([]byte, 4)
	_, err = c.Read(buf)
	require.NoError(t, err)
	_, err = c.Write([]byte("pong"))
	require.NoError(t, err)
	n, err := unix.Read(fd, buf)
	require.NoError(t, err)
	assert.Equal(t, "pong", string(buf[:n]))
}

func TestALockedSocketsFilterCannotBeRemovedOrReplaced(t *testing.T) {
	_, peer := listen(t)
	fd := lockedSocket(t, peer)
	assert.ErrorIs(t, unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DETACH_FILTER, 0), unix.EPERM)
	prog, err := peerFilter(netip.MustParseAddrPort("127.0.0.1:1"))
	require.NoError(t, err)
	assert.ErrorIs(t, unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, prog), unix.EPERM)
	assert.ErrorIs(t, unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_LOCK_FILTER, 0), unix.EPERM)
}

func TestADisconnectedLockedSocketReachesNothingElse(t *testing.T) {
	_, peer := listen(t)
	other, otherAddr := listen(t)
	fd := lockedSocket(t, peer)

	// connect(AF_UNSPEC) disconnects a TCP socket...
	require.NoError(t, disconnect(fd))
	// ...but it keeps the port the host chose: no bind elsewhere.
	assert.ErrorIs(t, unix.Bind(fd, &unix.SockaddrInet4{Port: 0}), unix.EINVAL)
	// Reconnected to anything but its upstream, the handshake never
	// completes: the peer's SYN-ACK is dropped.
	err := unix.Connect(fd, sockaddr(otherAddr))
	assert.ErrorIs(t, err, unix.ETIMEDOUT)
	_ = other // its SYN queue saw a SYN; it never gets a connection

	// Nor can it listen: the kernel refuses a socket that was connected.
	assert.ErrorIs(t, unix.Listen(fd, 1), unix.EINVAL)
}

func TestThePeerFilterAdmitsOnlyItsPeer(t *testing.T) {
	// The same program for an IPv6 peer assembles; its words are the
	// address's.
	_, err := peerFilter(netip.MustParseAddrPort("[2001:db8::1]:443"))
	require.NoError(t, err)
	_, err = peerFilter(netip.MustParseAddrPort("[::ffff:192.0.2.1]:443"))
	require.NoError(t, err)
}

// direct sends a direct Connect for target:80 and returns the answer
// and, for an OK one, the socket it carried.
func (g *guest) direct(id uint64, target string) (protocol.Connected, *net.TCPConn) {
	g.t.Helper()
	g.send(protocol.TypeConnect, protocol.Connect{ID: id, Host: target, Port: 80, Via: protocol.ViaDirect, Direct: true})
	var r protocol.Connected
	require.NoError(g.t, g.recv(protocol.TypeConnected, &r))
	if !r.OK() {
		assert.Zero(g.t, g.r.Pending(), "a refusal carries no descriptor")
		return r, nil
	}
	c, err := g.r.TakeTCP()
	require.NoError(g.t, err)
	g.t.Cleanup(func() { c.Close() })
	return r, c
}

func TestADirectConnectGetsTheHostsOwnSocketLockedToTheUpstream(t *testing.T) {
	needRoot(t)
	h := startHost(t, 8, nil, protocol.CapDataFD, protocol.CapDataHand, protocol.CapDataDirect)
	g, ch := h.openChannel(t)
	r, c := g.direct(5, "up.test")
	require.True(t, r.OK(), "%+v", r)
	// The guest holds the upstream connection itself: no relay.
	echoes(t, c)
	assert.Zero(t, ch.Open(), "the host carries nothing")
	rc, err := c.SyscallConn()
	require.NoError(t, err)
	require.NoError(t, rc.Control(func(fd uintptr) {
		assert.ErrorIs(t, unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_DETACH_FILTER, 0), unix.EPERM, "its peer filter is locked")
	}))
	allowed := h.events.of(api.KindEgress)
	require.Len(t, allowed, 1)
	assert.Equal(t, protocol.ViaDirect, allowed[0].Via)
	assert.Equal(t, "allowed", allowed[0].Decision)
	assert.Contains(t, allowed[0].Message, "no egress_closed follows")

	r, c = g.direct(6, "elsewhere.test")
	assert.Equal(t, protocol.EgressDenied, r.Code)
	assert.Nil(t, c)
}

func TestADirectConnectOnAChannelThatWasNotOfferedItIsAViolation(t *testing.T) {
	needRoot(t)
	h := startHost(t, 8, nil, protocol.CapDataFD, protocol.CapDataHand)
	g, _ := h.openChannel(t)
	g.send(protocol.TypeConnect, protocol.Connect{ID: 1, Host: "up.test", Port: 80, Via: protocol.ViaDirect, Direct: true})
	select {
	case err := <-h.violations:
		assert.ErrorIs(t, err, ErrViolation)
	case <-time.After(10 * time.Second):
		t.Fatal("no violation reported")
	}
	assert.Zero(t, h.accepted.Load(), "nothing was dialed")
}
