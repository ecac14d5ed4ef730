package dataplane

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/protocol"
)

// tcpPair returns a connected loopback TCP pair: the workload's client and
// the socket the proxy accepted.
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

func TestHandSendsTheClientsSocketAndItsAnswerClaimsNoDescriptor(t *testing.T) {
	h := newFakeHost(t)
	ch, hc := dial(t, h, nil)
	hr := protocol.NewFDReader(hc)
	t.Cleanup(hr.Close)
	client, accepted := tcpPair(t)

	// A handed request whose asker gives up (its answer still comes, with
	// no descriptor), then one that is answered, then an ordinary Open
	// whose descriptor must not be mistaken for anyone else's.
	ctx, cancel := context.WithCancel(context.Background())
	_, other := tcpPair(t)
	gaveUp := make(chan protocol.EgressReply, 1)
	go func() {
		r, answered := ch.Hand(ctx, other, "up.test", 443, protocol.ViaConnect, nil, nil)
		assert.True(t, answered)
		gaveUp <- r
	}()
	var first protocol.Connect
	require.NoError(t, protocol.ReadMessage(hr, protocol.MaxHeaderFrame, protocol.TypeConnect, &first))
	assert.True(t, first.Hand)
	_, err := hr.TakeTCP()
	require.NoError(t, err, "the socket came with the frame")
	cancel()
	assert.Equal(t, protocol.EgressCancelled, (<-gaveUp).Code)

	type res struct {
		r        protocol.EgressReply
		answered bool
	}
	handed := make(chan res, 1)
	go func() {
		r, answered := ch.Hand(context.Background(), accepted, "up.test", 443, protocol.ViaConnect, []byte("200\n"), []byte("early"))
		handed <- res{r, answered}
	}()
	var req protocol.Connect
	require.NoError(t, protocol.ReadMessage(hr, protocol.MaxHeaderFrame, protocol.TypeConnect, &req))
	assert.True(t, req.Hand)
	assert.Equal(t, []byte("200\n"), req.Reply)
	assert.Equal(t, []byte("early"), req.Early)
	sock, err := hr.TakeTCP()
	require.NoError(t, err)
	defer sock.Close()
	// Answer the forgotten one late (no descriptor), then this one.
	require.NoError(t, protocol.SendFD(hc, protocol.TypeConnected, protocol.Connected{ID: first.ID}, -1))
	require.NoError(t, protocol.SendFD(hc, protocol.TypeConnected, protocol.Connected{ID: req.ID}, -1))
	got := <-handed
	require.True(t, got.answered)
	require.True(t, got.r.OK())
	// The guest lets go of its descriptor; the host's copy is the socket.
	accepted.Close()
	_, err = sock.Write([]byte("from the host"))
	require.NoError(t, err)
	buf := make([]byte, len("from the host"))
	_ = client.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = io.ReadFull(client, buf)
	require.NoError(t, err)
	assert.Equal(t, "from the host", string(buf))

	// The channel still pairs an ordinary Open with its own descriptor.
	opened := make(chan net.Conn, 1)
	go func() {
		c, r, answered := ch.Open(context.Background(), "up.test", 80, protocol.ViaTransparent)
		assert.True(t, answered)
		assert.True(t, r.OK())
		opened <- c
	}()
	var open protocol.Connect
	require.NoError(t, protocol.ReadMessage(hr, protocol.MaxHeaderFrame, protocol.TypeConnect, &open))
	assert.False(t, open.Hand)
	hs, g := pair(t)
	require.NoError(t, protocol.SendFD(hc, protocol.TypeConnected, protocol.Connected{ID: open.ID}, int(g.Fd())))
	g.Close()
	c := <-opened
	require.NotNil(t, c)
	defer c.Close()
	_, err = hs.Write([]byte("x"))
	require.NoError(t, err)
	one := make([]byte, 1)
	_, err = io.ReadFull(c, one)
	require.NoError(t, err)
	select {
	case <-ch.Done():
		t.Fatal("the channel ended")
	default:
	}
}

func TestHandOfTooManyEarlyBytesIsNotAsked(t *testing.T) {
	h := newFakeHost(t)
	ch, _ := dial(t, h, nil)
	_, accepted := tcpPair(t)
	_, answered := ch.Hand(context.Background(), accepted, "up.test", 443, protocol.ViaConnect, nil, make([]byte, protocol.MaxHandEarly+1))
	assert.False(t, answered, "the connection goes another way")
}
