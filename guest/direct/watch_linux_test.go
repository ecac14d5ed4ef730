package direct

import (
	"encoding/binary"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// tcpWatch counts TCP segments to a port on this namespace's lo (the
// host's, in these tests): what a host socket made to reach a host
// service would send, SYN or data, whether or not a handshake completes.
type tcpWatch struct {
	fd   int
	n    atomic.Int64
	quit atomic.Bool
	wg   sync.WaitGroup
}

func watchTCP(t *testing.T, port uint16) *tcpWatch {
	t.Helper()
	proto := int(htons(unix.ETH_P_IP))
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, proto)
	require.NoError(t, err, "a packet socket on lo (root)")
	lo, err := net.InterfaceByName("lo")
	require.NoError(t, err)
	require.NoError(t, unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: lo.Index}))
	require.NoError(t, unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 50_000}))
	w := &tcpWatch{fd: fd}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		buf := make([]byte, 128)
		for !w.quit.Load() {
			n, _, err := unix.Recvfrom(fd, buf, unix.MSG_TRUNC)
			if err != nil || n < 24 {
				continue
			}
			ihl := int(buf[0]&0xf) * 4
			if buf[9] != unix.IPPROTO_TCP || len(buf) < ihl+4 {
				continue
			}
			if binary.BigEndian.Uint16(buf[ihl+2:]) == port {
				w.n.Add(1)
			}
		}
	}()
	t.Cleanup(func() { w.stop() })
	return w
}

// stop ends the watch once every segment sent so far was read (lo
// delivers as it sends), and returns the count.
func (w *tcpWatch) stop() int64 {
	if !w.quit.Swap(true) {
		w.wg.Wait()
		unix.Close(w.fd)
	}
	return w.n.Load()
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// listening reports whether a TCP socket of this namespace listens on
// addr (host:port, IPv4).
func listening(t *testing.T, addr string) bool {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	p, err := strconv.Atoi(port)
	require.NoError(t, err)
	b, err := os.ReadFile("/proc/net/tcp")
	require.NoError(t, err)
	want := strings.ToUpper(strconv.FormatUint(uint64(p), 16))
	for len(want) < 4 {
		want = "0" + want
	}
	_ = host
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) > 3 && strings.HasSuffix(f[1], ":"+want) && f[3] == "0A" {
			return true
		}
	}
	return false
}
