package dataplane

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/guest/egress"
	"github.com/oac/sandbox-agent/protocol"
	"github.com/oac/sandbox-agent/protocol/transport"
)

const token = "feedfacefeedfacefeedfacefeedface"

// fakeHost is a host's side of the data plane spoken frame by frame.
type fakeHost struct {
	t  *testing.T
	ep transport.Endpoint
	ln *net.UnixListener
}

func newFakeHost(t *testing.T) *fakeHost {
	t.Helper()
	path := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	ep, err := transport.Parse("unix://" + path)
	require.NoError(t, err)
	return &fakeHost{t: t, ep: ep, ln: ln}
}

// acceptChannel takes the guest's channel and acknowledges it.
func (h *fakeHost) acceptChannel() *net.UnixConn {
	h.t.Helper()
	c, err := h.ln.AcceptUnix()
	require.NoError(h.t, err)
	h.t.Cleanup(func() { c.Close() })
	var hello protocol.Channel
	require.NoError(h.t, protocol.ReadMessage(c, protocol.MaxHeaderFrame, protocol.TypeChannel, &hello))
	require.Equal(h.t, token, hello.Token)
	require.NoError(h.t, protocol.SendFD(c, protocol.TypeChannel, protocol.Channel{}, -1))
	return c
}

// pair returns two connected unix sockets: the host keeps a, b goes to
// the guest.
func pair(t *testing.T) (*net.UnixConn, *os.File) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	f := os.NewFile(uintptr(fds[0]), "host")
	c, err := net.FileConn(f)
	f.Close()
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c.(*net.UnixConn), os.NewFile(uintptr(fds[1]), "guest")
}

// dial sets up a channel with h and returns the guest's side and the
// host's connection.
func dial(t *testing.T, h *fakeHost, fw Forwarded) (*Channel, *net.UnixConn) {
	t.Helper()
	type res struct {
		ch  *Channel
		err error
	}
	r := make(chan res, 1)
	go func() { ch, err := DialChannel(context.Background(), h.ep, token, fw, nil); r <- res{ch, err} }()
	hc := h.acceptChannel()
	got := <-r
	require.NoError(t, got.err)
	t.Cleanup(func() { got.ch.Close() })
	return got.ch, hc
}

func TestOpenReturnsTheDescriptorThatCameWithItsAnswer(t *testing.T) {
	h := newFakeHost(t)
	type res struct {
		c  net.Conn
		r  protocol.EgressReply
		ok bool
	}
	results := make(chan res, 2)
	var hostSide *net.UnixConn
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := h.ln.AcceptUnix()
		require.NoError(t, err)
		defer c.Close()
		var hello protocol.Channel
		require.NoError(t, protocol.ReadMessage(c, protocol.MaxHeaderFrame, protocol.TypeChannel, &hello))
		require.NoError(t, protocol.SendFD(c, protocol.TypeChannel, protocol.Channel{}, -1))
		var reqs []protocol.Connect
		for range 2 {
			var req protocol.Connect
			require.NoError(t, protocol.ReadMessage(c, protocol.MaxHeaderFrame, protocol.TypeConnect, &req))
			reqs = append(reqs, req)
		}
		// Answer out of order: a refusal for the second, then the first.
		deny := reqs[0]
		allow := reqs[1]
		if deny.Host != "blocked.test" {
			deny, allow = allow, deny
		}
		require.NoError(t, protocol.SendFD(c, protocol.TypeConnected, protocol.Connected{ID: deny.ID, EgressReply: protocol.EgressReply{
			Code: protocol.EgressDenied, Error: "Denied", Effect: protocol.EffectNone, Reason: "no rule"}}, -1))
		hs, g := pair(t)
		hostSide = hs
		require.NoError(t, protocol.SendFD(c, protocol.TypeConnected, protocol.Connected{ID: allow.ID}, int(g.Fd())))
		g.Close()
		<-time.After(200 * time.Millisecond)
	}()
	ch, err := DialChannel(context.Background(), h.ep, token, nil, nil)
	require.NoError(t, err)
	defer ch.Close()
	for _, host := range []string{"allowed.test", "blocked.test"} {
		go func() {
			c, r, ok := ch.Open(context.Background(), host, 443, protocol.ViaConnect)
			results <- res{c, r, ok}
		}()
	}
	var allowed, denied res
	for range 2 {
		r := <-results
		if r.c != nil {
			allowed = r
		} else {
			denied = r
		}
	}
	<-done
	require.True(t, allowed.ok && denied.ok, "both were answered")
	require.NotNil(t, allowed.c)
	assert.Equal(t, protocol.EgressDenied, denied.r.Code)
	assert.Equal(t, "no rule", denied.r.Reason)
	_, err = allowed.c.Write([]byte("hi"))
	require.NoError(t, err)
	b := make([]byte, 2)
	_, err = io.ReadFull(hostSide, b)
	require.NoError(t, err)
	assert.Equal(t, "hi", string(b), "the descriptor is the allowed connection's")
	allowed.c.Close()
}

// When the channel ends, waiting and later connections say they were not
// answered, so the opener sends them as egress streams instead.
func TestAClosedChannelFallsBackToTheSession(t *testing.T) {
	h := newFakeHost(t)
	ch, hc := dial(t, h, nil)
	waiting := make(chan bool, 1)
	go func() { _, _, answered := ch.Open(context.Background(), "a.test", 443, ""); waiting <- answered }()
	var req protocol.Connect
	require.NoError(t, protocol.ReadMessage(hc, protocol.MaxHeaderFrame, protocol.TypeConnect, &req))
	hc.Close() // the host goes away before answering
	assert.False(t, <-waiting, "a request the host never answered was not answered")
	<-ch.Done()
	var fellBack atomic.Int32
	exit := egress.NewExit(nil, Carrier(ch.Open).Way("pair"), egress.Opens("session", func(ctx context.Context, host string, port int, via string) (net.Conn, protocol.EgressReply) {
		fellBack.Add(1)
		return nil, protocol.EgressReply{Code: protocol.EgressDenied, Effect: protocol.EffectNone}
	}))
	_, rep := exit.Attempt(context.Background(), nil, "a.test", 443, "").Go(false, nil, nil)
	assert.Equal(t, int32(1), fellBack.Load(), "the session carried it")
	assert.Equal(t, protocol.EgressDenied, rep.Code)
}

func TestForwardsArriveAsConnections(t *testing.T) {
	h := newFakeHost(t)
	got := make(chan string, 1)
	_, hc := dial(t, h, func(f protocol.Forward, c net.Conn) {
		defer c.Close()
		b := make([]byte, 4)
		_, _ = io.ReadFull(c, b)
		got <- f.Name + ":" + string(b)
	})
	hs, g := pair(t)
	require.NoError(t, protocol.SendFD(hc, protocol.TypeForward, protocol.Forward{Port: 4096, Name: "daemon"}, int(g.Fd())))
	g.Close()
	_, err := hs.Write([]byte("ping"))
	require.NoError(t, err)
	select {
	case s := <-got:
		assert.Equal(t, "daemon:ping", s)
	case <-time.After(5 * time.Second):
		t.Fatal("the forward was not handed over")
	}
}

func TestAFrameThatShouldCarryADescriptorButDoesNotEndsTheChannel(t *testing.T) {
	h := newFakeHost(t)
	ch, hc := dial(t, h, nil)
	require.NoError(t, protocol.SendFD(hc, protocol.TypeForward, protocol.Forward{Port: 1}, -1))
	select {
	case <-ch.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the channel went on without the descriptor")
	}
}

func TestMoreDescriptorsThanFramesEndTheChannel(t *testing.T) {
	h := newFakeHost(t)
	ch, hc := dial(t, h, nil)
	before := countFDs(t)
	var fds, all []int
	for range protocol.MaxPendingFDs + 4 {
		p, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		require.NoError(t, err)
		fds, all = append(fds, p[1]), append(all, p[0], p[1])
	}
	rc, err := hc.SyscallConn()
	require.NoError(t, err)
	_ = rc.Control(func(fd uintptr) {
		_ = unix.Sendmsg(int(fd), []byte{0}, unix.UnixRights(fds...), nil, 0)
	})
	for _, fd := range all {
		unix.Close(fd)
	}
	select {
	case <-ch.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the channel took more descriptors than it may hold")
	}
	assert.LessOrEqual(t, countFDs(t), before, "none of them is kept")
}

func countFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

func TestDialerNamesItsTargetWithTheToken(t *testing.T) {
	h := newFakeHost(t)
	go func() {
		c, err := h.ln.AcceptUnix()
		if err != nil {
			return
		}
		defer c.Close()
		var req protocol.Connect
		if protocol.ReadMessage(c, protocol.MaxHeaderFrame, protocol.TypeConnect, &req) != nil || req.Token != token || req.Host != "a.test" || req.SrcPort != 40000 {
			return
		}
		_ = protocol.WriteMessage(c, protocol.TypeConnected, protocol.Connected{})
		_, _ = io.Copy(c, c)
	}()
	c, r, answered := Dialer(h.ep, token).Open(context.Background(), egress.Target{Host: "a.test", Port: 443, Via: protocol.ViaSOCKS5, SrcPort: 40000})
	require.True(t, answered)
	require.True(t, r.OK())
	defer c.Close()
	_, isUnix := c.(*net.UnixConn)
	assert.True(t, isUnix, "the connection itself, unwrapped, so it is spliced")
	_, err := c.Write([]byte("echo"))
	require.NoError(t, err)
	b := make([]byte, 4)
	_, err = io.ReadFull(c, b)
	require.NoError(t, err)
	assert.Equal(t, "echo", string(b))
}

func TestDialerThatCannotDialIsNotAnswered(t *testing.T) {
	ep, err := transport.Parse("unix://" + filepath.Join(t.TempDir(), "nothing.sock"))
	require.NoError(t, err)
	_, r, answered := Dialer(ep, token).Open(context.Background(), egress.Target{Host: "a.test", Port: 443})
	assert.False(t, answered, "the connection may go over the session")
	assert.Equal(t, protocol.EgressIO, r.Code)
}
