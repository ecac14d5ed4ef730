package protocol

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// writesConn records each Write it gets.
type writesConn struct {
	net.Conn // nil: only Write is called
	writes   [][]byte
	err      error
}

func (c *writesConn) Write(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	c.writes = append(c.writes, bytes.Clone(p))
	return len(p), nil
}

func yamuxHeader(typ uint8, flags uint16, id, length uint32) []byte {
	h := make([]byte, yamuxHeaderSize)
	h[1] = typ
	binary.BigEndian.PutUint16(h[2:4], flags)
	binary.BigEndian.PutUint32(h[4:8], id)
	binary.BigEndian.PutUint32(h[8:12], length)
	return h
}

func TestCoalesceJoinsADataFramesHeaderWithItsBody(t *testing.T) {
	rec := &writesConn{}
	c := Coalesce(rec)
	hdr, body := yamuxHeader(0, 0, 1, 64), bytes.Repeat([]byte{7}, 64)
	n, err := c.Write(hdr)
	require.NoError(t, err)
	assert.Equal(t, len(hdr), n, "the held header counts as written")
	assert.Empty(t, rec.writes, "a data frame's header waits for its body")
	n, err = c.Write(body)
	require.NoError(t, err)
	assert.Equal(t, len(body), n, "the body's Write reports the body only")
	require.Len(t, rec.writes, 1, "header and body go out in one write")
	assert.Equal(t, append(hdr, body...), rec.writes[0])
}

func TestCoalescePassesFramesWithoutBodyAtOnce(t *testing.T) {
	for name, hdr := range map[string][]byte{
		"window update":   yamuxHeader(1, 0, 1, 1<<20),
		"ping":            yamuxHeader(2, 1, 0, 9),
		"data, no body":   yamuxHeader(0, 4, 1, 0), // a FIN
		"go away":         yamuxHeader(3, 0, 0, 0),
		"not a header":    []byte("twelve bytes"[:11]),
		"longer than one": append(yamuxHeader(0, 0, 1, 5), 1, 2, 3, 4, 5),
	} {
		t.Run(name, func(t *testing.T) {
			rec := &writesConn{}
			n, err := Coalesce(rec).Write(hdr)
			require.NoError(t, err)
			assert.Equal(t, len(hdr), n)
			assert.Equal(t, [][]byte{hdr}, rec.writes)
		})
	}
}

func TestCoalesceSendsALargeBodyBehindItsHeaderInOrder(t *testing.T) {
	rec := &writesConn{}
	c := Coalesce(rec)
	body := bytes.Repeat([]byte{3}, coalesceCopyMax+1)
	hdr := yamuxHeader(0, 0, 1, uint32(len(body)))
	_, err := c.Write(hdr)
	require.NoError(t, err)
	n, err := c.Write(body)
	require.NoError(t, err)
	assert.Equal(t, len(body), n)
	// No copy: a socket takes both in one writev; this recorder in order.
	assert.Equal(t, append(hdr, body...), bytes.Join(rec.writes, nil))
}

func TestCoalesceReturnsTheTransportsError(t *testing.T) {
	broken := errors.New("broken pipe")
	rec := &writesConn{}
	c := Coalesce(rec)
	_, err := c.Write(yamuxHeader(0, 0, 1, 3))
	require.NoError(t, err)
	rec.err = broken
	n, err := c.Write([]byte{1, 2, 3})
	assert.ErrorIs(t, err, broken)
	assert.Zero(t, n)
	// The header went with the failed write: nothing is held any more.
	rec.err = nil
	_, err = c.Write(yamuxHeader(1, 0, 1, 5))
	require.NoError(t, err)
	assert.Equal(t, [][]byte{yamuxHeader(1, 0, 1, 5)}, rec.writes)
}

func coalesceSocketpair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	conv := func(fd int) net.Conn {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		c, err := net.FileConn(f)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}
	return conv(fds[0]), conv(fds[1])
}

func TestCoalesceHonoursTheWriteDeadline(t *testing.T) {
	a, _ := coalesceSocketpair(t) // the peer never reads
	c := Coalesce(a)
	body := make([]byte, 8<<20) // more than the socket buffers hold
	_, err := c.Write(yamuxHeader(0, 0, 1, uint32(len(body))))
	require.NoError(t, err)
	require.NoError(t, c.SetWriteDeadline(time.Now().Add(50*time.Millisecond)))
	done := make(chan error, 1)
	go func() { _, err := c.Write(body); done <- err }()
	select {
	case err := <-done:
		assert.ErrorIs(t, err, os.ErrDeadlineExceeded)
	case <-time.After(10 * time.Second):
		t.Fatal("a write to a peer that does not read outlived its deadline")
	}
}

// Many streams writing at once over coalesced transports on both sides:
// every stream's bytes arrive complete and in order.
func TestCoalescedSessionsCarryConcurrentStreamsIntact(t *testing.T) {
	a, b := coalesceSocketpair(t)
	cs, err := yamux.Client(Coalesce(a), MuxConfig(nil))
	require.NoError(t, err)
	ss, err := yamux.Server(Coalesce(b), MuxConfig(nil))
	require.NoError(t, err)
	defer cs.Close()
	defer ss.Close()
	const streams, size = 16, 3 << 20
	payload := func(i int) []byte {
		p := make([]byte, size)
		for j := range p {
			p[j] = byte(i*31 + j*7 + j>>11)
		}
		return p
	}
	got := make(chan string, streams)
	go func() {
		for range streams {
			st, err := ss.AcceptStream()
			if err != nil {
				got <- err.Error()
				return
			}
			go func() {
				data, err := io.ReadAll(st)
				got <- fmt.Sprintf("%v %x", err, sha256.Sum256(data))
			}()
		}
	}()
	var wg sync.WaitGroup
	want := map[string]int{}
	for i := range streams {
		p := payload(i)
		want[fmt.Sprintf("<nil> %x", sha256.Sum256(p))]++
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := cs.OpenStream()
			if !assert.NoError(t, err) {
				return
			}
			// Odd write sizes: small frames (copied) and large (writev).
			for off := 0; off < len(p); {
				n := min(len(p)-off, 1+(off*13)%(40<<10))
				_, err := st.Write(p[off : off+n])
				if !assert.NoError(t, err) {
					return
				}
				off += n
			}
			assert.NoError(t, st.Close())
		}()
	}
	wg.Wait()
	have := map[string]int{}
	for range streams {
		have[<-got]++
	}
	assert.Equal(t, want, have)
}

func sndbuf(t *testing.T, c net.Conn) int {
	t.Helper()
	raw, err := c.(syscall.Conn).SyscallConn()
	require.NoError(t, err)
	var v int
	var serr error
	require.NoError(t, raw.Control(func(fd uintptr) { v, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF) }))
	require.NoError(t, serr)
	return v
}

func TestTuneTransportGrowsASocketsBuffers(t *testing.T) {
	a, _ := coalesceSocketpair(t)
	before := sndbuf(t, a)
	TuneTransport(a)
	// The kernel caps the request at net.core.wmem_max and doubles it;
	// the default is below either.
	assert.Greater(t, sndbuf(t, a), before)
	assert.NotPanics(t, func() { TuneTransport(&writesConn{}) }, "not a socket: nothing to tune")
}
