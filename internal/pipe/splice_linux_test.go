package pipe

import (
	"bytes"
	"crypto/rand"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// unixPair returns the two ends of an AF_UNIX stream socketpair, the data
// plane's carrier.
func unixPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "pair")
		defer f.Close()
		c, err := net.FileConn(f)
		require.NoError(t, err)
		return c.(*net.UnixConn)
	}
	a, b := conn(fds[0]), conn(fds[1])
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// ioChars returns the bytes this process moved through read(2) and
// write(2) so far (rchar + wchar of /proc/self/io); splice(2) moves none.
func ioChars(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/io")
	require.NoError(t, err)
	var sum int64
	for _, l := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(l, ": ")
		if k == "rchar" || k == "wchar" {
			n, err := strconv.ParseInt(v, 10, 64)
			require.NoError(t, err)
			sum += n
		}
	}
	return sum
}

func TestSocketsAreJoinedInTheKernelNotCopiedThroughThisProcess(t *testing.T) {
	client, proxyIn := tcpPair(t)    // a workload's connection, as the guest accepted it
	guestEnd, hostEnd := unixPair(t) // the data plane's pair
	require.True(t, Spliced(proxyIn, guestEnd))
	require.False(t, Spliced(guestEnd, hostEnd), "Go splices from and to TCP sockets only")
	require.False(t, Spliced(struct{ net.Conn }{proxyIn}, guestEnd), "a wrapper hides the socket")

	done := make(chan error, 1)
	go func() { _, _, err := Join(proxyIn, guestEnd, nil); done <- err }()
	const n = 64 << 20
	payload := make([]byte, 1<<20)
	_, _ = rand.Read(payload)
	before := ioChars(t)
	// n bytes written by the client and read at the host's end: 2n bytes
	// of read and write calls. A copy loop in between would add 2n more.
	recv := make(chan int64, 1)
	go func() { m, _ := io.CopyBuffer(io.Discard, onlyReader{hostEnd}, make([]byte, 1<<20)); recv <- m }()
	for sent := 0; sent < n; sent += len(payload) {
		_, err := client.Write(payload)
		require.NoError(t, err)
	}
	require.NoError(t, client.(*net.TCPConn).CloseWrite())
	require.Equal(t, int64(n), <-recv, "every byte arrived and the client's half-close reached the far end")
	moved := ioChars(t) - before
	t.Logf("read+write calls moved %d MiB for %d MiB carried", moved>>20, n>>20)
	assert.Less(t, moved, int64(2*n+n/2), "no byte was copied through this process")
	hostEnd.Close()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Join did not end when both directions ended")
	}
	assert.Equal(t, int64(0), BigBuffersInUse())
}

func TestSplicedJoinBetweenTCPAndAPairCarriesBothWaysHalfClosesAndCounts(t *testing.T) {
	client, proxyIn := tcpPair(t)
	guestEnd, hostEnd := unixPair(t)
	require.True(t, Spliced(proxyIn, guestEnd))
	joinCopiesBothWays(t, client, proxyIn, guestEnd, hostEnd)
}

// The broker's idle timeout reads Activity while a spliced copy blocks:
// the kernel's counters of the TCP socket say when bytes last moved.
func TestSplicedActivityFollowsTheTCPSocket(t *testing.T) {
	client, proxyIn := tcpPair(t)
	guestEnd, hostEnd := unixPair(t)
	var act Activity
	done := make(chan struct{})
	go func() { _, _, _ = Join(proxyIn, guestEnd, &act); close(done) }()
	_, err := client.Write([]byte("x"))
	require.NoError(t, err)
	_, err = io.ReadFull(hostEnd, make([]byte, 1))
	require.NoError(t, err)
	// Idle grows while nothing moves...
	require.Eventually(t, func() bool { return act.Idle() >= 300*time.Millisecond }, 5*time.Second, 10*time.Millisecond)
	// ...and drops when bytes cross, with no Touch from a copy loop.
	_, err = hostEnd.Write([]byte("y"))
	require.NoError(t, err)
	_, err = io.ReadFull(client, make([]byte, 1))
	require.NoError(t, err)
	assert.Less(t, act.Idle(), 250*time.Millisecond)
	client.Close()
	hostEnd.Close()
	<-done
}

func TestSplicedJoinEndsBothSidesWhenOneFails(t *testing.T) {
	client, proxyIn := tcpPair(t)
	guestEnd, hostEnd := unixPair(t)
	done := make(chan error, 1)
	go func() { _, _, err := Join(proxyIn, guestEnd, nil); done <- err }()
	// The far side goes away for good while the client keeps sending:
	// the write into the pair fails and the client's connection ends.
	hostEnd.Close()
	buf := bytes.Repeat([]byte("y"), 64<<10)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		_ = client.SetWriteDeadline(time.Now().Add(time.Second))
		if _, err := client.Write(buf); err != nil {
			break
		}
	}
	select {
	case err := <-done:
		assert.Error(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Join did not return after one side failed")
	}
}

// onlyReader hides a reader's WriterTo, so io.CopyBuffer uses the buffer.
type onlyReader struct{ io.Reader }
