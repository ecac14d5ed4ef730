package yamux

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// heldConn is a transport whose Read ignores Close until released: the
// session's receive loop cannot return, so Session.Close waits before it
// marks its streams closed, the window the patch is about.
type heldConn struct {
	net.Conn
	release chan struct{}
	once    sync.Once
}

func (c *heldConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if err != nil {
		<-c.release
	}
	return n, err
}

func (c *heldConn) Release() { c.once.Do(func() { close(c.release) }) }

func pairWithHeldServer(t *testing.T) (client, server *Session, held *heldConn) {
	t.Helper()
	a, b := net.Pipe()
	held = &heldConn{Conn: b, release: make(chan struct{})}
	t.Cleanup(held.Release)
	conf := DefaultConfig()
	conf.LogOutput = io.Discard
	client, err := Client(a, conf)
	require.NoError(t, err)
	server, err = Server(held, conf)
	require.NoError(t, err)
	t.Cleanup(func() { client.Close() })
	return client, server, held
}

func TestABlockedReadEndsWhenItsSessionShutsDown(t *testing.T) {
	client, server, held := pairWithHeldServer(t)
	c, err := client.OpenStream()
	require.NoError(t, err)
	_, err = c.Write([]byte("x")) // sends the SYN
	require.NoError(t, err)
	s, err := server.AcceptStream()
	require.NoError(t, err)
	one := make([]byte, 1)
	_, err = s.Read(one)
	require.NoError(t, err)

	read := make(chan error, 1)
	go func() { _, err := s.Read(one); read <- err }()
	closed := make(chan struct{})
	go func() { server.Close(); close(closed) }() // waits for the held receive loop
	select {
	case err := <-read:
		assert.ErrorIs(t, err, ErrSessionShutdown)
	case <-time.After(10 * time.Second):
		t.Fatal("the read still waits (and retries) after its session shut down")
	}
	held.Release()
	<-closed
}

func TestABlockedWriteEndsWhenItsSessionShutsDown(t *testing.T) {
	client, server, held := pairWithHeldServer(t)
	c, err := client.OpenStream()
	require.NoError(t, err)
	_, err = c.Write([]byte("x"))
	require.NoError(t, err)
	s, err := server.AcceptStream()
	require.NoError(t, err)
	// The client never reads: the server's send window runs out.
	wrote := make(chan error, 1)
	go func() {
		_, err := s.Write(make([]byte, 2*initialStreamWindow))
		wrote <- err
	}()
	require.Eventually(t, func() bool { return atomic.LoadUint32(&s.sendWindow) == 0 }, 10*time.Second, time.Millisecond)
	closed := make(chan struct{})
	go func() { server.Close(); close(closed) }()
	select {
	case err := <-wrote:
		assert.ErrorIs(t, err, ErrSessionShutdown)
	case <-time.After(10 * time.Second):
		t.Fatal("the write still waits (and retries) after its session shut down")
	}
	held.Release()
	<-closed
}
