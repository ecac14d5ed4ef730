package dataplane

import (
	"net"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/protocol"
)

// What keeps a handed socket on its upstream is package directguard's,
// and tested there; these tests are the channel's part: a direct Connect
// is answered with the guard's sealed socket, only where it was offered.

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
	// The channel's work for it ends once the answer and its event are
	// out, while the connection stays open: the host carries nothing.
	require.Eventually(t, func() bool { return ch.Open() == 0 }, 5*time.Second, time.Millisecond, "the host carries nothing")
	rc, err := c.SyscallConn()
	require.NoError(t, err)
	require.NoError(t, rc.Control(func(fd uintptr) {
		assert.ErrorIs(t, unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_DETACH_FILTER, 0), unix.EPERM, "its peer filter is locked")
		var unspec [16]byte
		_, _, e := unix.Syscall(unix.SYS_CONNECT, fd, uintptr(unsafe.Pointer(&unspec[0])), 16)
		if e == 0 {
			assert.ErrorIs(t, unix.Connect(int(fd), &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}, Port: 9}), unix.EPERM, "sealed: never connected again")
		}
	}))
	// The decision's event follows the answer (it says whether the
	// guest got it).
	require.Eventually(t, func() bool { return len(h.events.of(api.KindEgress)) == 1 }, 5*time.Second, 10*time.Millisecond)
	allowed := h.events.of(api.KindEgress)
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
