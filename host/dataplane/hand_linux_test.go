package dataplane

import (
	"crypto/rand"
	"crypto/sha256"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/egress"
	"github.com/oac/sandbox-agent/protocol"
)

// tcpPair returns a connected loopback TCP pair: client stands for the
// workload's client, accepted for the socket the guest's proxy accepted.
func tcpPair(t *testing.T) (client, accepted *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	got := make(chan net.Conn, 1)
	go func() { c, _ := ln.Accept(); got <- c }()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	a := <-got
	require.NotNil(t, a)
	t.Cleanup(func() { c.Close(); a.Close() })
	return c.(*net.TCPConn), a.(*net.TCPConn)
}

// hand sends a Connect that hands sock over (fd attached) and returns the
// answer. It names source port 1, a guest's word the host ignores for a
// socket whose peer it can read.
func (g *guest) hand(id uint64, target string, sock *net.TCPConn, reply, early []byte) protocol.Connected {
	g.t.Helper()
	f, err := sock.File()
	require.NoError(g.t, err)
	defer f.Close()
	require.NoError(g.t, protocol.SendFD(g.c, protocol.TypeConnect, protocol.Connect{ID: id, Host: target, Port: 80, Via: protocol.ViaConnect, Hand: true, Reply: reply, Early: early,
		SrcPort: 1}, int(f.Fd())))
	var r protocol.Connected
	require.NoError(g.t, g.recv(protocol.TypeConnected, &r))
	assert.Zero(g.t, g.r.Pending(), "an answer to a handed socket carries no descriptor")
	return r
}

func TestAHandedSocketIsCarriedByTheHostAloneWithReplyAndEarlyBytes(t *testing.T) {
	needRoot(t)
	h := startHost(t, 8, nil, protocol.CapDataFD, protocol.CapDataHand)
	g, ch := h.openChannel(t)
	client, accepted := tcpPair(t)
	r := g.hand(3, "up.test", accepted, []byte("OK\n"), []byte("early:"))
	require.True(t, r.OK(), "%+v", r)
	assert.Equal(t, uint64(3), r.ID)
	// The guest keeps nothing: its descriptor closed, the host carries on.
	require.NoError(t, accepted.Close())
	head := make([]byte, len("OK\nearly:"))
	_ = client.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := io.ReadFull(client, head)
	require.NoError(t, err)
	assert.Equal(t, "OK\nearly:", string(head), "the reply first, then the early bytes echoed back")
	// Checksummed bytes both ways through the host's one relay.
	payload := make([]byte, 4<<20)
	_, _ = rand.Read(payload)
	go func() {
		_, _ = client.Write(payload)
		_ = client.CloseWrite()
	}()
	h2 := sha256.New()
	n, err := io.Copy(h2, client)
	require.NoError(t, err)
	assert.Equal(t, int64(len(payload)), n)
	assert.Equal(t, sha256.Sum256(payload), [32]byte(h2.Sum(nil)), "every byte came back unchanged")
	client.Close()
	require.Eventually(t, func() bool { return len(h.events.of(api.KindEgressClosed)) == 1 }, 10*time.Second, 10*time.Millisecond)
	closed := h.events.of(api.KindEgressClosed)[0]
	assert.Equal(t, int64(len(payload)+len("early:")), *closed.BytesOut, "early bytes count")
	assert.Equal(t, protocol.ViaConnect, h.events.of(api.KindEgress)[0].Via)
	require.Eventually(t, func() bool { return ch.Open() == 0 }, 5*time.Second, 10*time.Millisecond)
}

func TestARefusedHandedSocketIsLeftToTheGuestUntouched(t *testing.T) {
	needRoot(t)
	h := startHost(t, 8, nil, protocol.CapDataFD, protocol.CapDataHand)
	g, _ := h.openChannel(t)
	client, accepted := tcpPair(t)
	r := g.hand(1, "blocked.example.com", accepted, []byte("OK\n"), []byte("early"))
	assert.Equal(t, protocol.EgressDenied, r.Code)
	// The host wrote nothing and closed its copy: the guest's answer is
	// the first byte the client sees, and closing the guest's copy ends it.
	_, err := accepted.Write([]byte("403"))
	require.NoError(t, err)
	require.NoError(t, accepted.Close())
	got, err := io.ReadAll(client)
	require.NoError(t, err)
	assert.Equal(t, "403", string(got))
	assert.Equal(t, int32(0), h.accepted.Load(), "nothing dialed")
	require.Eventually(t, func() bool { return len(h.events.of(api.KindEgress)) == 1 }, 10*time.Second, 10*time.Millisecond)
	assert.Equal(t, client.LocalAddr().(*net.TCPAddr).Port, h.events.of(api.KindEgress)[0].SourcePort,
		"the event names the connection by the socket's peer, as the kernel says")
}

func TestHandingAnythingButAConnectedTCPSocketIsAViolation(t *testing.T) {
	needRoot(t)
	for name, mk := range map[string]func(t *testing.T) int{
		"unix socket": func(t *testing.T) int {
			a, _ := unixPair(t)
			return fd(t, a)
		},
		"listening TCP socket": func(t *testing.T) int {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			t.Cleanup(func() { ln.Close() })
			f, err := ln.(*net.TCPListener).File()
			require.NoError(t, err)
			t.Cleanup(func() { f.Close() })
			return int(f.Fd())
		},
		"no descriptor": func(t *testing.T) int { return -1 },
	} {
		t.Run(strings.ReplaceAll(name, " ", "_"), func(t *testing.T) {
			h := startHost(t, 8, nil, protocol.CapDataFD, protocol.CapDataHand)
			g, _ := h.openChannel(t)
			require.NoError(t, protocol.SendFD(g.c, protocol.TypeConnect, protocol.Connect{ID: 1, Host: "up.test", Port: 80, Hand: true}, mk(t)))
			select {
			case err := <-h.violations:
				assert.ErrorIs(t, err, ErrViolation)
			case <-time.After(5 * time.Second):
				t.Fatal("no violation reported")
			}
			assert.True(t, closedSoon(g.c, 5*time.Second), "the channel is closed")
			assert.Equal(t, int32(0), h.accepted.Load(), "nothing dialed")
		})
	}
}

// The workload may reset its own connection before the agent hands the
// other end: that Connect fails as cancelled, nothing is dialed, and the
// channel goes on (the guest did nothing wrong).
func TestAHandedSocketWhoseClientResetItFailsThatConnectOnly(t *testing.T) {
	needRoot(t)
	h := startHost(t, 8, nil, protocol.CapDataFD, protocol.CapDataHand)
	g, _ := h.openChannel(t)
	client, accepted := tcpPair(t)
	require.NoError(t, client.SetLinger(0))
	require.NoError(t, client.Close()) // a reset: the accepted end is connected to nothing now
	_, err := accepted.Read(make([]byte, 1))
	require.Error(t, err, "the reset arrived")
	r := g.hand(1, "up.test", accepted, nil, nil)
	assert.Equal(t, protocol.EgressCancelled, r.Code)
	assert.Equal(t, int32(0), h.accepted.Load(), "nothing dialed")
	select {
	case err := <-h.violations:
		t.Fatalf("reported as a violation: %v", err)
	default:
	}
	_, live := tcpPair(t)
	assert.True(t, g.hand(2, "up.test", live, nil, nil).OK(), "the channel goes on")
}

// Descriptors no handing Connect claims (the guest attaching sockets to
// Connects that hand nothing) are held at most protocol.MaxPendingFDs at
// once; one more fails the guest. (One pending is no violation by
// itself: the reader reads ahead, and the next frame's socket may have
// come with the bytes of this one.)
func TestDescriptorsNoFrameClaimsAreBounded(t *testing.T) {
	needRoot(t)
	h := startHost(t, 8, nil, protocol.CapDataFD, protocol.CapDataHand)
	g, _ := h.openChannel(t)
	_, accepted := tcpPair(t)
	for i := 1; i <= protocol.MaxPendingFDs+1; i++ {
		if err := protocol.SendFD(g.c, protocol.TypeConnect, protocol.Connect{ID: uint64(i), Host: "up.test", Port: 80}, fd(t, accepted)); err != nil {
			break // the host already closed the channel
		}
	}
	select {
	case err := <-h.violations:
		assert.ErrorIs(t, err, ErrViolation)
		assert.ErrorIs(t, err, protocol.ErrDescriptor)
	case <-time.After(5 * time.Second):
		t.Fatal("no violation reported")
	}
}

// A handing Connect right behind one that hands nothing: the reader may
// read both frames at once, and the socket is still the handing one's.
func TestAHandingConnectBehindAnOrdinaryOneKeepsItsSocket(t *testing.T) {
	needRoot(t)
	h := startHost(t, 8, nil, protocol.CapDataFD, protocol.CapDataHand)
	g, _ := h.openChannel(t)
	for i := 0; i < 50; i++ {
		client, accepted := tcpPair(t)
		f, err := accepted.File()
		require.NoError(t, err)
		id := uint64(2*i + 1)
		// Both frames in flight before either answer.
		g.send(protocol.TypeConnect, protocol.Connect{ID: id, Host: "up.test", Port: 80})
		require.NoError(t, protocol.SendFD(g.c, protocol.TypeConnect, protocol.Connect{ID: id + 1, Host: "up.test", Port: 80, Hand: true}, int(f.Fd())))
		f.Close()
		accepted.Close()
		var pairEnd net.Conn
		for range 2 {
			var r protocol.Connected
			require.NoError(t, g.recv(protocol.TypeConnected, &r))
			require.True(t, r.OK(), "%+v", r)
			if r.ID == id {
				pairEnd, err = g.r.TakeConn()
				require.NoError(t, err)
			}
		}
		echoes(t, client)
		echoes(t, pairEnd)
		client.Close()
		pairEnd.Close()
	}
	assert.Empty(t, h.violations)
}

func TestAHostThatDidNotOfferHandingNeverReceivesTheDescriptor(t *testing.T) {
	needRoot(t)
	h := startHost(t, 8, nil, protocol.CapDataFD)
	g, _ := h.openChannel(t)
	_, accepted := tcpPair(t)
	before := openFDs(t)
	require.NoError(t, protocol.SendFD(g.c, protocol.TypeConnect, protocol.Connect{ID: 1, Host: "up.test", Port: 80, Hand: true}, fd(t, accepted)))
	select {
	case err := <-h.violations:
		assert.ErrorIs(t, err, ErrViolation)
	case <-time.After(5 * time.Second):
		t.Fatal("no violation reported")
	}
	assert.LessOrEqual(t, openFDs(t), before+1, "read(2) dropped the descriptor")
}

func unixPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	conn := func(n int) *net.UnixConn {
		f := os.NewFile(uintptr(n), "pair")
		defer f.Close()
		c, err := net.FileConn(f)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// fd returns a descriptor of c (a dup, closed at cleanup).
func fd(t *testing.T, c interface{ File() (*os.File, error) }) int {
	t.Helper()
	f, err := c.File()
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	return int(f.Fd())
}

// What the client sent before its socket was handed goes upstream as soon
// as the upstream connects: while the answer and its event are written,
// not after them. Both kinds: the bytes the guest read (a proxy request's
// Early) and those still waiting in the socket (a captured client writes
// its request as soon as it connects). The event's emission is the point
// checked: the upstream already has the bytes there.
func TestAHandedConnectionsEarlyBytesReachTheUpstreamBeforeItsAnswerAndEvent(t *testing.T) {
	needRoot(t)
	const request = "GET / HTTP/1.1\r\n"
	for _, inSocket := range []bool{false, true} {
		t.Run(map[bool]string{false: "read by the guest", true: "waiting in the socket"}[inSocket], func(t *testing.T) {
			up, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			t.Cleanup(func() { up.Close() })
			atEvent := make(chan string, 1)
			h := startHost(t, 8, func(cfg *Config) {
				pol, err := egress.ParsePolicy(nil, []string{"up.test:80=" + up.Addr().String()})
				require.NoError(t, err)
				cfg.Broker = egress.New(egress.Config{Policy: pol, MaxStreams: 8})
				emit := cfg.Emit
				cfg.Emit = func(e api.Event) {
					if e.Event == api.KindEgress {
						atEvent <- upstreamHas(t, up, len(request))
					}
					emit(e)
				}
			}, protocol.CapDataFD, protocol.CapDataHand)
			g, _ := h.openChannel(t)
			client, accepted := tcpPair(t)
			early := []byte(request)
			if inSocket {
				_, err := client.Write(early)
				require.NoError(t, err)
				require.Eventually(t, func() bool { return inq(t, accepted) == len(request) }, 5*time.Second, time.Millisecond)
				early = nil
			}
			r := g.hand(1, "up.test", accepted, nil, early)
			require.True(t, r.OK(), "%+v", r)
			assert.Equal(t, request, <-atEvent, "the upstream had the client's bytes when the event was written")
			client.Close()
			require.Eventually(t, func() bool { return len(h.events.of(api.KindEgressClosed)) == 1 }, 10*time.Second, 10*time.Millisecond)
			assert.Equal(t, int64(len(request)), *h.events.of(api.KindEgressClosed)[0].BytesOut, "counted once")
		})
	}
}

// upstreamHas accepts the connection the broker dialed on up and reads n
// bytes from it, waiting at most 5 s, and hangs up; it returns them or
// what failed.
func upstreamHas(t *testing.T, up net.Listener, n int) string {
	_ = up.(*net.TCPListener).SetDeadline(time.Now().Add(5 * time.Second))
	c, err := up.Accept()
	if err != nil {
		return "accept: " + err.Error()
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got := make([]byte, n)
	if _, err := io.ReadFull(c, got); err != nil {
		return "read: " + err.Error()
	}
	return string(got)
}

// inq is the length of c's receive queue.
func inq(t *testing.T, c *net.TCPConn) int {
	rc, err := c.SyscallConn()
	require.NoError(t, err)
	var n int
	require.NoError(t, rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) }))
	return n
}

// openHandOnly dials and sets up a channel offered CapDataHand alone (a
// shim that cannot make pairs): the host answers the Channel frame but,
// holding no pairs, never gives the channel to OnChannel (forwards).
func (h *host) openHandOnly(t *testing.T) *guest {
	t.Helper()
	g := h.channelUp(t)
	select {
	case <-h.channel:
		t.Fatal("a hand-only channel has no pairs for forwards, so OnChannel is not told of it")
	default:
	}
	return g
}

func TestAHandOnlyChannelCarriesHandedSocketsWithoutMakingPairs(t *testing.T) {
	h := startHost(t, 8, nil, protocol.CapDataHand, protocol.CapDataDial)
	g := h.openHandOnly(t)
	client, accepted := tcpPair(t)
	r := g.hand(7, "up.test", accepted, []byte("OK\n"), nil)
	require.True(t, r.OK(), "%+v", r)
	require.NoError(t, accepted.Close())
	head := make([]byte, 3)
	_ = client.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := io.ReadFull(client, head)
	require.NoError(t, err)
	assert.Equal(t, "OK\n", string(head))
	echoes(t, client)
	client.Close()
	require.Eventually(t, func() bool { return len(h.events.of(api.KindEgressClosed)) == 1 }, 10*time.Second, 10*time.Millisecond)
	assert.Empty(t, h.events.of(api.KindEgressClosed)[0].Code, "closed cleanly")
}

func TestAskingAHandOnlyChannelForAPairIsAViolation(t *testing.T) {
	h := startHost(t, 8, nil, protocol.CapDataHand, protocol.CapDataDial)
	g := h.openHandOnly(t)
	g.send(protocol.TypeConnect, protocol.Connect{ID: 1, Host: "up.test", Port: 80, Via: protocol.ViaTransparent})
	select {
	case err := <-h.violations:
		assert.ErrorIs(t, err, ErrViolation)
		assert.Contains(t, err.Error(), "offered data_hand only")
	case <-time.After(10 * time.Second):
		t.Fatal("no violation reported")
	}
	assert.True(t, closedSoon(g.c, 5*time.Second), "the channel is closed")
	assert.Equal(t, int32(0), h.accepted.Load(), "nothing dialed for it")
}

func TestAHandOnlyChannelStillServesDataConnections(t *testing.T) {
	h := startHost(t, 8, nil, protocol.CapDataHand, protocol.CapDataDial)
	_ = h.openHandOnly(t)
	d := h.dial(t)
	d.send(protocol.TypeConnect, protocol.Connect{Token: testToken, Host: "up.test", Port: 80, Via: protocol.ViaTransparent})
	var r protocol.Connected
	require.NoError(t, d.recv(protocol.TypeConnected, &r))
	require.True(t, r.OK(), "%+v", r)
	echoes(t, d.c)
}
