package pipe

import (
	"bytes"
	"crypto/rand"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tcpPair returns two connected loopback TCP sockets.
func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	ch := make(chan net.Conn, 1)
	go func() { c, _ := ln.Accept(); ch <- c }()
	a, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	b := <-ch
	require.NotNil(t, b)
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// wrapped hides the socket type (as a yamux stream or a buffered reader
// would), so Join copies through its own buffers; CloseWrite stays.
type wrapped struct{ net.Conn }

func (w wrapped) CloseWrite() error { return w.Conn.(*net.TCPConn).CloseWrite() }

func TestJoinCopiesBothWaysHalfClosesAndCounts(t *testing.T) {
	for _, mode := range []string{"copied", "spliced"} {
		t.Run(mode, func(t *testing.T) {
			client, proxyIn := tcpPair(t)
			proxyOut, upstream := tcpPair(t)
			if mode == "copied" {
				proxyOut = wrapped{proxyOut}
			}
			assert.Equal(t, mode == "spliced" && canSplice, Spliced(proxyIn, proxyOut))
			joinCopiesBothWays(t, client, proxyIn, proxyOut, upstream)
		})
	}
}

func joinCopiesBothWays(t *testing.T, client, proxyIn, proxyOut, upstream net.Conn) {
	up := make([]byte, 3<<20+17)
	_, _ = rand.Read(up)
	down := []byte("response bytes")

	var act Activity
	type res struct {
		ab, ba int64
		err    error
	}
	done := make(chan res, 1)
	go func() {
		ab, ba, err := Join(proxyIn, proxyOut, &act)
		done <- res{ab, ba, err}
	}()
	// Upstream: read everything until EOF (the client's half-close must
	// reach it), then answer and close.
	upDone := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(upstream)
		_, _ = upstream.Write(down)
		upstream.Close()
		upDone <- b
	}()
	_, err := client.Write(up)
	require.NoError(t, err)
	require.NoError(t, client.(*net.TCPConn).CloseWrite())
	got, err := io.ReadAll(client)
	require.NoError(t, err)
	assert.Equal(t, down, got)
	assert.True(t, bytes.Equal(up, <-upDone), "upstream got every byte")
	r := <-done
	require.NoError(t, r.err)
	assert.Equal(t, int64(len(up)), r.ab)
	assert.Equal(t, int64(len(down)), r.ba)
	assert.Less(t, act.Idle(), 5*time.Second)
	assert.Equal(t, int64(0), BigBuffersInUse(), "buffers are returned when the copy ends")
}

func TestIdleDirectionReleasesItsBigBuffer(t *testing.T) {
	a, b := tcpPair(t)
	dst := &bytes.Buffer{}
	done := make(chan int64, 1)
	go func() { n, _ := Copy(dst, b, nil); done <- n }()
	_, err := a.Write(make([]byte, 1<<20))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return BigBuffersInUse() == 1 }, 5*time.Second, 5*time.Millisecond,
		"a full small read switches to a big buffer")
	require.Eventually(t, func() bool { return BigBuffersInUse() == 0 }, 5*time.Second, 20*time.Millisecond,
		"an idle direction hands its big buffer back")
	_, err = a.Write([]byte("more"))
	require.NoError(t, err)
	a.Close()
	assert.Equal(t, int64(1<<20+4), <-done, "no byte is lost across the switch")
}

func TestJoinClosesBothSidesOnError(t *testing.T) {
	a, aPeer := tcpPair(t)
	b, bPeer := tcpPair(t)
	done := make(chan error, 1)
	go func() { _, _, err := Join(a, b, nil); done <- err }()
	// Reset the b side: its peer closes with unread data (RST).
	_, _ = b.Write([]byte("x"))
	bPeer.(*net.TCPConn).SetLinger(0)
	bPeer.Close()
	_, _ = aPeer.Write(bytes.Repeat([]byte("y"), 1<<20))
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Join did not return after one side failed")
	}
}
