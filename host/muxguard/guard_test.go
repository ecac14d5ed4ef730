package muxguard

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
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

func frame(typ uint8, flags uint16, id, length uint32) []byte {
	h := make([]byte, headerSize)
	h[1] = typ
	binary.BigEndian.PutUint16(h[2:4], flags)
	binary.BigEndian.PutUint32(h[4:8], id)
	binary.BigEndian.PutUint32(h[8:12], length)
	return h
}

// bytesConn is a transport whose guest side is a fixed byte string and
// whose host side writes are kept.
type bytesConn struct {
	net.Conn // nil: only what the guard calls is implemented
	r        io.Reader
	w        bytes.Buffer
	mu       sync.Mutex
	closed   bool
}

func (c *bytesConn) Read(b []byte) (int, error) { return c.r.Read(b) }
func (c *bytesConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.w.Write(b)
}
func (c *bytesConn) SetWriteDeadline(time.Time) error { return nil }
func (c *bytesConn) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	return nil
}

// feed guards the guest bytes in, as yamux would read them, and returns
// the guard and what it passed.
func feed(t *testing.T, l Limits, in ...[]byte) (*Conn, []byte) {
	t.Helper()
	c := &bytesConn{r: bytes.NewReader(bytes.Join(in, nil))}
	clock := time.Unix(1000, 0)
	g := newConn(c, l, func() time.Time { return clock })
	var out []byte
	buf := make([]byte, 7) // odd sizes: headers are returned in pieces
	for {
		n, err := g.Read(buf)
		out = append(out, buf[:n]...)
		if err != nil {
			break
		}
	}
	return g, out
}

func testLimits() Limits {
	return Limits{MaxStreams: 4, OpenRate: 1, OpenBurst: 8, PingRate: 1, PingBurst: 3, RecvBudget: 1 << 40}
}

func TestCorrectFramesPassUnchanged(t *testing.T) {
	in := [][]byte{
		frame(typeWindowUpdate, flagSYN, 1, protocol.MaxStreamWindow-initialWindow),
		frame(typeData, 0, 1, 5), []byte("hello"),
		frame(typePing, flagSYN, 0, 7),
		frame(typeWindowUpdate, flagFIN, 1, 0),
		frame(typeGoAway, 0, 0, 0),
	}
	g, out := feed(t, testLimits(), in...)
	require.NoError(t, g.Err())
	assert.Equal(t, bytes.Join(in, nil), out)
	assert.Equal(t, int64(5), g.Stats().Unread, "what the host has not read counts against the budget")
}

func TestHostileFramesEndTheSessionWithAReasonNamingThem(t *testing.T) {
	open := frame(typeWindowUpdate, flagSYN, 1, 0)
	cases := []struct {
		name string
		in   [][]byte
		want string
	}{
		{"window update wrapping the send window", [][]byte{open, frame(typeWindowUpdate, 0, 1, 0xffffffff)},
			"window update on stream 1 takes the host's send window to 4295229439 bytes, beyond the 1048576"},
		{"window update beyond the stream window", [][]byte{open, frame(typeWindowUpdate, 0, 1, protocol.MaxStreamWindow)},
			"beyond the 1048576 a stream may have"},
		{"ping flood", [][]byte{frame(typePing, flagSYN, 0, 1), frame(typePing, flagSYN, 0, 2), frame(typePing, flagSYN, 0, 3), frame(typePing, flagSYN, 0, 4)},
			"pings faster than 1 a second (burst 3)"},
		{"data beyond the granted window", [][]byte{open, frame(typeData, 0, 1, initialWindow+1)},
			"262145 bytes of data on stream 1, beyond the 262144-byte window the host granted"},
		{"oversized data frame", [][]byte{frame(typeData, 0, 9, protocol.MaxStreamWindow+1)},
			"data frame of 1048577 bytes on stream 9"},
		{"stream of the host's parity", [][]byte{frame(typeWindowUpdate, flagSYN, 2, 0)}, "opened stream 2, an id of the host's (even) parity"},
		{"stream opened twice", [][]byte{open, open}, "opened stream 1 while it is open"},
		{"too many streams", [][]byte{open, frame(typeWindowUpdate, flagSYN, 3, 0), frame(typeWindowUpdate, flagSYN, 5, 0),
			frame(typeWindowUpdate, flagSYN, 7, 0), frame(typeWindowUpdate, flagSYN, 9, 0)}, "5 streams open in the session (limit 4)"},
		{"unknown flags", [][]byte{frame(typeData, 0x10, 1, 0)}, "yamux flags 0x10"},
		{"unknown GoAway code", [][]byte{frame(typeGoAway, 0, 0, 9)}, "GoAway with unknown code 9"},
		{"unknown type after a valid frame", [][]byte{open, frame(7, 0, 0, 0)}, "invalid msg type: yamux frame type 7"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g, out := feed(t, testLimits(), c.in...)
			err := g.Err()
			require.ErrorIs(t, err, ErrHostile)
			assert.Contains(t, err.Error(), c.want)
			assert.Equal(t, string(bytes.Join(c.in[:len(c.in)-1], nil)), string(out), "the offending header never reaches yamux")
			select {
			case <-g.Violated():
			default:
				t.Fatal("Violated is closed")
			}
		})
	}
}

func TestOpenRateIsATokenBucket(t *testing.T) {
	l := testLimits()
	l.MaxStreams = 100
	var in [][]byte
	for i := range 9 {
		id := uint32(2*i + 1)
		in = append(in, frame(typeWindowUpdate, flagSYN, id, 0), frame(typeWindowUpdate, flagRST, id, 0))
	}
	g, _ := feed(t, l, in...)
	require.ErrorIs(t, g.Err(), ErrHostile)
	assert.Contains(t, g.Err().Error(), "opens streams faster than 1 a second (burst 8)")
}

func TestBytesThatAreNoSessionAreNotCalledHostile(t *testing.T) {
	g, out := feed(t, testLimits(), []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	require.ErrorIs(t, g.Err(), yamux.ErrInvalidVersion)
	assert.NotErrorIs(t, g.Err(), ErrHostile, "a peer speaking something else is a misconfiguration")
	assert.Empty(t, out)
}

func TestClosedStreamsLeaveTheCount(t *testing.T) {
	var in [][]byte
	for i := range 20 {
		id := uint32(2*i + 1)
		in = append(in, frame(typeWindowUpdate, flagSYN, id, 0), frame(typeData, 0, id, 3), []byte("abc"), frame(typeWindowUpdate, flagRST, id, 0))
	}
	l := testLimits()
	l.OpenBurst = 100
	g, _ := feed(t, l, in...)
	require.NoError(t, g.Err())
	assert.Equal(t, Stats{GuestStreams: 0, Unread: 0, PeakUnread: 3}, g.Stats())
}

// A real session over the guard: the budget holds what the host has not
// read, the guest's writes wait until the host reads, nothing is lost.
func TestReceiveBudgetPausesTheGuestUntilTheHostReads(t *testing.T) {
	hc, gc := net.Pipe()
	l := DefaultLimits()
	l.RecvBudget = 512 << 10
	g := New(hc, l)
	host, err := yamux.Server(g, protocol.MuxConfig(nil))
	require.NoError(t, err)
	defer host.Close()
	guest, err := yamux.Client(gc, protocol.MuxConfig(nil))
	require.NoError(t, err)
	defer guest.Close()

	const streams, size = 4, 1 << 20
	var wg sync.WaitGroup
	for range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := guest.OpenStream()
			if !assert.NoError(t, err) {
				return
			}
			_, err = st.Write(bytes.Repeat([]byte("x"), size))
			assert.NoError(t, err)
			st.Close()
		}()
	}
	var accepted []net.Conn
	for range streams {
		st, err := host.AcceptStream()
		require.NoError(t, err)
		accepted = append(accepted, g.Track(st))
	}
	// Nobody reads: the guest is held at the budget.
	require.Eventually(t, func() bool { return g.Stats().Unread >= l.RecvBudget-protocol.MaxStreamWindow }, 5*time.Second, 5*time.Millisecond)
	time.Sleep(100 * time.Millisecond)
	assert.LessOrEqual(t, g.Stats().Unread, l.RecvBudget+protocol.MaxStreamWindow, "one frame may pass the budget, no more")
	var rwg sync.WaitGroup
	for _, st := range accepted {
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			n, err := io.Copy(io.Discard, st)
			assert.NoError(t, err)
			assert.Equal(t, int64(size), n)
			st.Close()
		}()
	}
	rwg.Wait()
	wg.Wait()
	assert.NoError(t, g.Err())
	assert.LessOrEqual(t, g.Stats().PeakUnread, l.RecvBudget+protocol.MaxStreamWindow)
}

// A guest that stops reading cannot hold a write of the host forever.
func TestAWriteToAGuestThatReadsNothingTimesOut(t *testing.T) {
	hc, gc := net.Pipe()
	defer gc.Close()
	l := DefaultLimits()
	l.WriteTimeout = 50 * time.Millisecond
	g := New(hc, l)
	start := time.Now()
	_, err := g.Write(frame(typePing, flagSYN, 0, 1))
	require.ErrorIs(t, err, ErrStalled)
	assert.Less(t, time.Since(start), 5*time.Second, "the write gave up (after 50 ms, on a busy machine later)")
	assert.ErrorIs(t, g.Err(), ErrStalled)
	assert.True(t, errors.Is(err, ErrStalled) && !errors.Is(err, os.ErrDeadlineExceeded), "the reason names the stall, not the deadline")
}

// guardedSession is a guest session and a host session over the guard on
// a net.Pipe.
func guardedSession(t *testing.T) (*Conn, *yamux.Session, *yamux.Session) {
	t.Helper()
	hc, gc := net.Pipe()
	g := New(hc, DefaultLimits())
	host, err := yamux.Server(g, protocol.MuxConfig(nil))
	require.NoError(t, err)
	guest, err := yamux.Client(gc, protocol.MuxConfig(nil))
	require.NoError(t, err)
	t.Cleanup(func() { guest.Close(); host.Close() })
	return g, guest, host
}

func (g *Conn) keptBuffers() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.kept
}

// Streams read in bulk keep their receive buffers, at most MaxKeptBuffers
// of them; idleness (Shrink), an error or Close gives a slot back.
func TestBulkStreamsKeepTheirReceiveBuffersUpToTheLimit(t *testing.T) {
	g, guest, host := guardedSession(t)
	const streams = MaxKeptBuffers + 2
	var tracked []net.Conn
	for range streams {
		st, err := guest.OpenStream()
		require.NoError(t, err)
		_, err = st.Write(bytes.Repeat([]byte("x"), 2*KeepAfterRead))
		require.NoError(t, err)
		hst, err := host.AcceptStream()
		require.NoError(t, err)
		tr := g.Track(hst)
		_, err = io.ReadFull(tr, make([]byte, 2*KeepAfterRead))
		require.NoError(t, err)
		tracked = append(tracked, tr)
		defer st.Close()
	}
	assert.Equal(t, MaxKeptBuffers, g.keptBuffers(), "bulk readers keep their buffers, up to the limit")

	small, err := guest.OpenStream()
	require.NoError(t, err)
	_, err = small.Write([]byte("hello"))
	require.NoError(t, err)
	hst, err := host.AcceptStream()
	require.NoError(t, err)
	_, err = io.ReadFull(g.Track(hst), make([]byte, 5))
	require.NoError(t, err)
	assert.Equal(t, MaxKeptBuffers, g.keptBuffers(), "a small read takes no slot")

	tracked[0].(interface{ Shrink() }).Shrink()
	assert.Equal(t, MaxKeptBuffers-1, g.keptBuffers(), "an idle stream gives its buffer back")
	require.NoError(t, tracked[1].Close())
	assert.Equal(t, MaxKeptBuffers-2, g.keptBuffers(), "a closed stream gives its buffer back")
	require.NoError(t, tracked[0].Close())
	assert.Equal(t, MaxKeptBuffers-2, g.keptBuffers(), "a slot is given back once")
	for _, tr := range tracked {
		tr.Close()
	}
	assert.Zero(t, g.keptBuffers())
	assert.NoError(t, g.Err())
}

// A kept slot is given back when the reader sees the end of the stream.
func TestAStreamsEndGivesItsKeptBufferBack(t *testing.T) {
	g, guest, host := guardedSession(t)
	st, err := guest.OpenStream()
	require.NoError(t, err)
	go func() {
		_, _ = st.Write(bytes.Repeat([]byte("y"), 4*KeepAfterRead))
		st.Close()
	}()
	hst, err := host.AcceptStream()
	require.NoError(t, err)
	tr := g.Track(hst)
	buf := make([]byte, 4*KeepAfterRead)
	_, err = io.ReadFull(tr, buf[:KeepAfterRead])
	require.NoError(t, err)
	require.Equal(t, 1, g.keptBuffers())
	n, err := io.Copy(io.Discard, tr)
	require.NoError(t, err)
	assert.Equal(t, int64(3*KeepAfterRead), n)
	assert.Zero(t, g.keptBuffers(), "EOF gives the slot back")
}
