package protocol

import (
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/internal/yamux"
)

// frameHeader builds a raw frame header, including values a well-behaved
// writer never produces (unknown types, flags, lengths over the limit).
func frameHeader(t Type, flags uint16, n uint32) []byte {
	var h [HeaderSize]byte
	binary.BigEndian.PutUint16(h[0:2], uint16(t))
	binary.BigEndian.PutUint16(h[2:4], flags)
	binary.BigEndian.PutUint32(h[4:8], n)
	return h[:]
}

// countingReader counts the bytes it hands out.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// endless is a reader that never runs dry: a peer announcing a huge body and
// actually sending it.
type endless struct{}

func (endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	return len(p), nil
}

// deadlineRecorder is an io.Reader that records every read deadline set on it.
type deadlineRecorder struct {
	io.Reader
	mu        sync.Mutex
	deadlines []time.Time
}

func (d *deadlineRecorder) SetReadDeadline(t time.Time) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.deadlines = append(d.deadlines, t)
	return nil
}

func (d *deadlineRecorder) recorded() []time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]time.Time(nil), d.deadlines...)
}

// fakeConn is a net.Conn that reads from a fixed reader, discards writes and
// records read deadlines. It lets fuzz targets drive ReadStreamHeader without
// goroutines.
type fakeConn struct {
	deadlineRecorder
}

func newFakeConn(r io.Reader) *fakeConn {
	return &fakeConn{deadlineRecorder{Reader: r}}
}

func (c *fakeConn) Write(p []byte) (int, error)        { return len(p), nil }
func (c *fakeConn) Close() error                       { return nil }
func (c *fakeConn) LocalAddr() net.Addr                { return fakeAddr{} }
func (c *fakeConn) RemoteAddr() net.Addr               { return fakeAddr{} }
func (c *fakeConn) SetDeadline(t time.Time) error      { return c.SetReadDeadline(t) }
func (c *fakeConn) SetWriteDeadline(t time.Time) error { return nil }

type fakeAddr struct{}

func (fakeAddr) Network() string { return "fake" }
func (fakeAddr) String() string  { return "fake" }

// pipePair returns both ends of a net.Pipe, closed when the test ends.
func pipePair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	a, b := net.Pipe()
	t.Cleanup(func() {
		a.Close()
		b.Close()
	})
	return a, b
}

// sessionPair runs real yamux sessions over net.Pipe: the guest is the
// client, the host the server, both with MuxConfig(nil), as in production.
func sessionPair(t *testing.T) (guest, host *yamux.Session) {
	t.Helper()
	gc, hc := net.Pipe()
	guest, err := yamux.Client(gc, MuxConfig(nil))
	require.NoError(t, err)
	host, err = yamux.Server(hc, MuxConfig(nil))
	require.NoError(t, err)
	t.Cleanup(func() {
		guest.Close()
		host.Close()
	})
	return guest, host
}

// shortenFrameBodyTimeout sets the body timeout for the rest of the test.
func shortenFrameBodyTimeout(t *testing.T, d time.Duration) {
	t.Helper()
	old := frameBodyTimeout
	frameBodyTimeout = d
	t.Cleanup(func() { frameBodyTimeout = old })
}

type guestResult struct {
	ctl     *Control
	welcome Welcome
	err     error
}

// startGuest runs GuestHandshake in the background.
func startGuest(t *testing.T, s *yamux.Session, hello Hello, timeout time.Duration) <-chan guestResult {
	t.Helper()
	ch := make(chan guestResult, 1)
	go func() {
		ctl, w, err := GuestHandshake(s, hello, timeout)
		ch <- guestResult{ctl, w, err}
	}()
	return ch
}

func waitGuest(t *testing.T, ch <-chan guestResult) guestResult {
	t.Helper()
	select {
	case r := <-ch:
		if r.ctl != nil {
			t.Cleanup(func() { r.ctl.Close() })
		}
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("guest handshake did not return")
		return guestResult{}
	}
}
