package directguard

import (
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// TCP states (include/net/tcp_states.h).
const (
	tcpEstablished = 1
	tcpFinWait1    = 4
	tcpTimeWait    = 6
)

// states answers which of cookies the kernel still lists, and in which
// state, from a dump of every TCP socket.
func states(t *testing.T, g *Guard, cookies ...uint64) map[uint64]uint8 {
	t.Helper()
	want := map[uint64]bool{}
	for _, c := range cookies {
		want[c] = true
	}
	out := map[uint64]uint8{}
	for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
		es, err := g.diag.dump(family, -1, 0)
		require.NoError(t, err)
		for _, e := range es {
			if want[e.ID.Cookie] {
				out[e.ID.Cookie] = e.State
			}
		}
	}
	return out
}

// deaf makes c drop everything it receives: its peer's data and FIN stay
// unacknowledged.
func deaf(t *testing.T, c net.Conn) {
	t.Helper()
	raw, err := bpf.Assemble([]bpf.Instruction{bpf.RetConstant{Val: 0}})
	require.NoError(t, err)
	f := []unix.SockFilter{{Code: raw[0].Op, K: raw[0].K}}
	withFD(t, c.(syscall.Conn), func(fd int) {
		require.NoError(t, unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &unix.SockFprog{Len: 1, Filter: &f[0]}))
	})
}

func TestAbortDestroysEverySealedSocketStillAliveAndNothingElse(t *testing.T) {
	needRoot(t)
	g := openGuard(t, Config{})
	l, up := listen(t, "127.0.0.1")
	accept := func() net.Conn {
		c, err := l.Accept()
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}

	// Open, in the guest's hands (here: this process's).
	open := dialLocked(t, g, up, true)
	openUp := accept()
	openCookie := cookieOf(t, open)

	// Closed by its holder with data its peer never acknowledged: an
	// orphan in FIN-WAIT-1, retrying.
	orphan := dialLocked(t, g, up, true)
	deaf(t, accept())
	orphanCookie := cookieOf(t, orphan)
	_, err := orphan.Write([]byte("unacknowledged"))
	require.NoError(t, err)
	require.NoError(t, orphan.Close())

	// Closed first by its holder, then by its peer: TIME_WAIT.
	waiting := dialLocked(t, g, up, true)
	waitingUp := accept()
	waitingCookie := cookieOf(t, waiting)
	require.NoError(t, waiting.Close())
	_, err = io.ReadAll(waitingUp)
	require.NoError(t, err)
	require.NoError(t, waitingUp.Close())

	// Locked in the same share, never sealed.
	plain := dialLocked(t, g, up, false)
	plainUp := accept()
	plainCookie := cookieOf(t, plain)

	eventually(t, "the sockets reach the states under test", func() bool {
		s := states(t, g, openCookie, orphanCookie, waitingCookie, plainCookie)
		return s[openCookie] == tcpEstablished && s[orphanCookie] == tcpFinWait1 && s[waitingCookie] == tcpTimeWait && s[plainCookie] == tcpEstablished
	})

	start := time.Now()
	n, err := g.Abort()
	took := time.Since(start)
	require.NoError(t, err)
	assert.Equal(t, 3, n)
	t.Logf("Abort of 3 sockets took %v", took)

	assert.Equal(t, map[uint64]uint8{plainCookie: tcpEstablished}, states(t, g, openCookie, orphanCookie, waitingCookie, plainCookie),
		"the open, orphaned and TIME_WAIT sealed sockets are gone; the unsealed one is untouched")
	require.NoError(t, openUp.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err = openUp.Read(make([]byte, 1))
	assert.True(t, errors.Is(err, unix.ECONNRESET), "the open one's peer got a reset: %v", err)
	_, err = open.Read(make([]byte, 1))
	assert.Error(t, err, "its holder finds it aborted")

	_, err = plain.Write([]byte("still"))
	require.NoError(t, err)
	b := make([]byte, 5)
	_, err = io.ReadFull(plainUp, b)
	require.NoError(t, err)
	assert.Equal(t, "still", string(b))

	g.mu.Lock()
	assert.Empty(t, g.cookies, "nothing sealed is left to remember")
	g.mu.Unlock()
	n, err = g.Abort()
	require.NoError(t, err)
	assert.Zero(t, n, "a second abort finds nothing")
}

func TestTheCookieSetFollowsTheLiveSockets(t *testing.T) {
	needRoot(t)
	defer func(n int) { pruneEvery = n }(pruneEvery)
	pruneEvery = 8
	g := openGuard(t, Config{})
	l, up := listen(t, "127.0.0.1")
	var gone []uint64
	for range pruneEvery - 1 {
		c := dialLocked(t, g, up, true)
		s, err := l.Accept()
		require.NoError(t, err)
		gone = append(gone, cookieOf(t, c))
		// The peer closes first: the sealed end leaves no TIME_WAIT.
		require.NoError(t, s.Close())
		_, err = io.ReadAll(c)
		require.NoError(t, err)
		require.NoError(t, c.Close())
	}
	eventually(t, "the closed sockets leave the kernel's tables", func() bool { return len(states(t, g, gone...)) == 0 })
	g.mu.Lock()
	assert.Len(t, g.cookies, pruneEvery-1, "no prune yet")
	g.mu.Unlock()

	live := dialLocked(t, g, up, true) // the seal that prunes
	s, err := l.Accept()
	require.NoError(t, err)
	defer s.Close()
	g.mu.Lock()
	defer g.mu.Unlock()
	assert.Equal(t, []uint64{cookieOf(t, live)}, keys(g.cookies))
}

func keys(m map[uint64]uint64) []uint64 {
	var out []uint64
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestAbortOfManySockets(t *testing.T) {
	needRoot(t)
	g := openGuard(t, Config{})
	l, up := listen(t, "127.0.0.1")
	const n = 500
	var seal time.Duration
	for range n {
		d := net.Dialer{Control: func(network, _ string, c syscall.RawConn) error { return g.Lock(network, up, c) }}
		c, err := d.Dial("tcp", up.String())
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		rc, err := c.(*net.TCPConn).SyscallConn()
		require.NoError(t, err)
		start := time.Now()
		require.NoError(t, g.Seal(rc))
		seal += time.Since(start)
		s, err := l.Accept()
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
	}
	start := time.Now()
	got, err := g.Abort()
	took := time.Since(start)
	require.NoError(t, err)
	assert.Equal(t, n, got)
	t.Logf("Seal: %v each on average; Abort of %d sockets: %v", seal/n, n, took)
}
