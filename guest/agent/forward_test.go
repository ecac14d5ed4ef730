package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/oac/sandbox-agent/internal/yamux"
	"github.com/oac/sandbox-agent/protocol"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pair returns a guest (client) and host (server) yamux session over a pipe.
func pair(t *testing.T) (guest, host *yamux.Session) {
	t.Helper()
	gc, hc := net.Pipe()
	guest, err := yamux.Client(gc, protocol.MuxConfig(nil))
	require.NoError(t, err)
	host, err = yamux.Server(hc, protocol.MuxConfig(nil))
	require.NoError(t, err)
	return guest, host
}

// echoServer listens on 127.0.0.1 and echoes every connection.
func echoServer(t *testing.T) (net.Listener, *sync.WaitGroup) {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return ln, &wg
}

func TestForwardStreamReachesTheGuestLoopbackPortAndHalfCloses(t *testing.T) {
	ln, wg := echoServer(t)
	port := ln.Addr().(*net.TCPAddr).Port
	gs, hs := pair(t)
	done := make(chan struct{})
	go func() {
		serveHostStreams(context.Background(), gs, dialLoopback, 4, slog.New(slog.DiscardHandler))
		close(done)
	}()

	st, err := protocol.OpenStream(hs, protocol.StreamHeader{Kind: protocol.KindForward, Port: port})
	require.NoError(t, err)
	_, err = st.Write([]byte("hello through the forward"))
	require.NoError(t, err)
	require.NoError(t, st.Close()) // half-close: the echo still answers
	got, err := io.ReadAll(st)
	require.NoError(t, err)
	assert.Equal(t, "hello through the forward", string(got))

	hs.Close()
	gs.Close()
	<-done
	ln.Close()
	wg.Wait()
}

func TestForwardDialsOnlyLoopbackWithTheHeaderPort(t *testing.T) {
	gs, hs := pair(t)
	var mu sync.Mutex
	var ports []int
	dial := func(ctx context.Context, port int) (net.Conn, error) {
		mu.Lock()
		ports = append(ports, port)
		mu.Unlock()
		return nil, errors.New("refused")
	}
	done := make(chan struct{})
	go func() {
		serveHostStreams(context.Background(), gs, dial, 4, slog.New(slog.DiscardHandler))
		close(done)
	}()

	st, err := protocol.OpenStream(hs, protocol.StreamHeader{Kind: protocol.KindForward, Port: 4096})
	require.NoError(t, err)
	_, err = io.ReadAll(st) // a failed dial closes the stream
	require.NoError(t, err)
	st.Close()

	hs.Close()
	gs.Close()
	<-done
	assert.Equal(t, []int{4096}, ports)
}

func TestNonForwardAndBadHeadersAreClosedWithoutADial(t *testing.T) {
	gs, hs := pair(t)
	dialed := make(chan int, 4)
	dial := func(ctx context.Context, port int) (net.Conn, error) { dialed <- port; return nil, errors.New("no") }
	done := make(chan struct{})
	go func() {
		serveHostStreams(context.Background(), gs, dial, 4, slog.New(slog.DiscardHandler))
		close(done)
	}()

	for _, h := range []protocol.StreamHeader{
		{Kind: protocol.KindLog, Name: "x"},
		{Kind: protocol.KindEgress, Host: "10.0.0.1", Port: 22, Via: protocol.ViaConnect},
		{Kind: protocol.KindForward, Host: "10.0.0.1", Port: 22},
		{Kind: protocol.KindForward, Port: 0},
	} {
		st, err := hs.OpenStream()
		require.NoError(t, err)
		require.NoError(t, protocol.WriteMessage(st, protocol.TypeStreamHeader, h))
		_, err = io.ReadAll(st)
		require.NoError(t, err, "closed: %+v", h)
		st.Close()
	}
	hs.Close()
	gs.Close()
	<-done
	assert.Empty(t, dialed)
}

func TestForwardStreamsOverTheLimitAreClosed(t *testing.T) {
	gs, hs := pair(t)
	release := make(chan struct{})
	dial := func(ctx context.Context, port int) (net.Conn, error) {
		<-release
		return nil, errors.New("no")
	}
	done := make(chan struct{})
	go func() {
		serveHostStreams(context.Background(), gs, dial, 1, slog.New(slog.DiscardHandler))
		close(done)
	}()

	held, err := protocol.OpenStream(hs, protocol.StreamHeader{Kind: protocol.KindForward, Port: 1})
	require.NoError(t, err)
	// Only when the first one is being dialed is the budget spent; keep
	// opening until one is refused (closed without waiting for the dial).
	refused := false
	for i := 0; i < 50 && !refused; i++ {
		st, err := protocol.OpenStream(hs, protocol.StreamHeader{Kind: protocol.KindForward, Port: 2 + i})
		require.NoError(t, err)
		_ = st.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err = io.ReadAll(st)
		refused = err == nil
		st.Close()
	}
	assert.True(t, refused, "a stream over the limit is closed at once")
	close(release)
	_, _ = io.ReadAll(held)
	held.Close()
	hs.Close()
	gs.Close()
	<-done
}

func TestDialLoopbackUsesIPv4Loopback(t *testing.T) {
	ln, wg := echoServer(t)
	c, err := dialLoopback(context.Background(), ln.Addr().(*net.TCPAddr).Port)
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1", c.RemoteAddr().(*net.TCPAddr).IP.String())
	c.Close()
	ln.Close()
	wg.Wait()
}
