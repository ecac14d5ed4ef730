package muxguard

// Benchmarks of the session's stream as production builds it: the guest's
// yamux client on protocol.Coalesce(transport), the host's yamux server on
// the guard over protocol.Coalesce(transport), host streams read through
// Track. Over an AF_UNIX socketpair (bwrap, WSL's bridge) and over two
// pipes (stdio, virtio-serial). `go test -bench . -run '^$'
// ./host/muxguard/`; docs/benchmarks.md ("Session stream") has the figures.

import (
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/internal/pipe"
	"github.com/oac/sandbox-agent/internal/yamux"
	"github.com/oac/sandbox-agent/protocol"
	"github.com/oac/sandbox-agent/protocol/transport"
)

func benchSocketpair(b *testing.B) (net.Conn, net.Conn) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	require.NoError(b, err)
	conv := func(fd int) net.Conn {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		c, err := net.FileConn(f)
		require.NoError(b, err)
		return c
	}
	return conv(fds[0]), conv(fds[1])
}

func benchPipes(b *testing.B) (net.Conn, net.Conn) {
	r1, w1, err := os.Pipe()
	require.NoError(b, err)
	r2, w2, err := os.Pipe()
	require.NoError(b, err)
	return transport.StreamConn(r1, w2, "guest"), transport.StreamConn(r2, w1, "host")
}

// benchSession returns one guest-opened stream as each side sees it.
func benchSession(b *testing.B, pair func(*testing.B) (net.Conn, net.Conn)) (guest, host net.Conn) {
	gc, hc := pair(b)
	gs, err := yamux.Client(protocol.Coalesce(gc), protocol.MuxConfig(nil))
	require.NoError(b, err)
	g := New(protocol.Coalesce(hc), DefaultLimits())
	hs, err := yamux.Server(g, protocol.MuxConfig(nil))
	require.NoError(b, err)
	b.Cleanup(func() { gs.Close(); hs.Close() })
	gst, err := gs.OpenStream()
	require.NoError(b, err)
	_, err = gst.Write([]byte{0}) // yamux's SYN goes out with data
	require.NoError(b, err)
	hst, err := hs.AcceptStream()
	require.NoError(b, err)
	host = g.Track(hst)
	_, err = io.ReadFull(host, make([]byte, 1))
	require.NoError(b, err)
	return gst, host
}

var benchPairs = []struct {
	name string
	pair func(*testing.B) (net.Conn, net.Conn)
}{{"socketpair", benchSocketpair}, {"pipes", benchPipes}}

// BenchmarkStreamThroughput moves bytes one way through pipe.Copy on both
// ends, as the guest's proxy and the host's broker do: b.N times 256 KiB.
func BenchmarkStreamThroughput(b *testing.B) {
	for _, p := range benchPairs {
		for _, dir := range []string{"up", "down"} {
			b.Run(p.name+"/"+dir, func(b *testing.B) {
				guest, host := benchSession(b, p.pair)
				src, dst := guest, host
				if dir == "down" {
					src, dst = host, guest
				}
				const chunk = 256 << 10
				b.SetBytes(chunk)
				done := make(chan error, 1)
				go func() {
					_, err := pipe.Copy(io.Discard, dst, nil)
					done <- err
				}()
				buf := make([]byte, chunk)
				b.ResetTimer()
				for range b.N {
					if _, err := src.Write(buf); err != nil {
						b.Fatal(err)
					}
				}
				src.Close() // a half-close: dst reads to EOF
				require.NoError(b, <-done)
			})
		}
	}
}

// BenchmarkStreamRoundTrip sends 64 bytes from the guest, which the host
// echoes: one op is one round trip.
func BenchmarkStreamRoundTrip(b *testing.B) {
	for _, p := range benchPairs {
		b.Run(p.name, func(b *testing.B) {
			guest, host := benchSession(b, p.pair)
			go func() {
				buf := make([]byte, 4<<10)
				for {
					n, err := host.Read(buf)
					if err != nil {
						return
					}
					if _, err := host.Write(buf[:n]); err != nil {
						return
					}
				}
			}()
			msg := make([]byte, 64)
			got := make([]byte, 64)
			b.ResetTimer()
			for range b.N {
				if _, err := guest.Write(msg); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(guest, got); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
