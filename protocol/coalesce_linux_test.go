package protocol

import (
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/internal/yamux"
)

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
