//go:build linux

package bench

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/oac/sandbox-agent/host/muxguard"
	"github.com/oac/sandbox-agent/internal/yamux"
	"github.com/oac/sandbox-agent/protocol"
	"github.com/oac/sandbox-agent/protocol/transport"
)

// socketPair returns a connected AF_UNIX stream pair.
func socketPair() (net.Conn, net.Conn, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	conv := func(fd int) (net.Conn, error) {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		return net.FileConn(f)
	}
	a, err := conv(fds[0])
	if err != nil {
		return nil, nil, err
	}
	b, err := conv(fds[1])
	if err != nil {
		a.Close()
		return nil, nil, err
	}
	return a, b, nil
}

// pipePair returns two net.Conns joined by two os.Pipes (how stdio and
// virtio-serial transports look).
func pipePair() (net.Conn, net.Conn, error) {
	r1, w1, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	r2, w2, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	return transport.StreamConn(r1, w2, "a"), transport.StreamConn(r2, w1, "b"), nil
}

// overYamux wraps a raw pair in a yamux session as the binaries build it
// (a is the guest's side, b the host's: socket buffers, each frame in one
// write, the host's side guarded and its stream tracked) and returns one
// stream per side, plus a closer.
func overYamux(a, b net.Conn) (net.Conn, net.Conn, func(), error) {
	protocol.TuneTransport(a)
	protocol.TuneTransport(b)
	cs, err := yamux.Client(protocol.Coalesce(a), protocol.MuxConfig(nil))
	if err != nil {
		return nil, nil, nil, err
	}
	guard := muxguard.New(protocol.Coalesce(b), muxguard.DefaultLimits())
	ss, err := yamux.Server(guard, protocol.MuxConfig(nil))
	if err != nil {
		return nil, nil, nil, err
	}
	type acc struct {
		c   net.Conn
		err error
	}
	ch := make(chan acc, 1)
	go func() {
		st, err := ss.AcceptStream()
		if err != nil {
			ch <- acc{nil, err}
			return
		}
		ch <- acc{guard.Track(st), nil}
	}()
	c, err := cs.Open()
	if err != nil {
		return nil, nil, nil, err
	}
	// yamux sends SYN lazily with the first write.
	if _, err := c.Write([]byte{0}); err != nil {
		return nil, nil, nil, err
	}
	r := <-ch
	if r.err != nil {
		return nil, nil, nil, r.err
	}
	one := make([]byte, 1)
	if _, err := io.ReadFull(r.c, one); err != nil {
		return nil, nil, nil, err
	}
	return c, r.c, func() { cs.Close(); ss.Close() }, nil
}

// throughput sends size bytes from a to b in chunk-sized writes and returns
// MB/s.
func throughput(a, b net.Conn, size, chunk int) (float64, error) {
	buf := make([]byte, chunk)
	done := make(chan error, 1)
	go func() {
		rb := make([]byte, chunk)
		_, err := io.CopyBuffer(onlyWriter{io.Discard}, io.LimitReader(onlyReader{b}, int64(size)), rb)
		done <- err
	}()
	start := time.Now()
	for sent := 0; sent < size; sent += chunk {
		if _, err := a.Write(buf); err != nil {
			return 0, err
		}
	}
	if err := <-done; err != nil {
		return 0, err
	}
	return float64(size) / 1e6 / time.Since(start).Seconds(), nil
}

// onlyReader hides WriterTo/ReaderFrom so io.CopyBuffer uses our buffer.
type onlyReader struct{ io.Reader }

// onlyWriter hides io.Discard's ReaderFrom, which reads 8 KiB at a time
// with a buffer of its own (a stream read that way frees and reallocates
// its receive buffer per frame: muxguard keeps it for bulk readers).
type onlyWriter struct{ io.Writer }

// echo serves b: every byte read is written back.
func echo(b net.Conn) {
	buf := make([]byte, 4<<10)
	for {
		n, err := b.Read(buf)
		if err != nil {
			return
		}
		if _, err := b.Write(buf[:n]); err != nil {
			return
		}
	}
}

// roundTrips returns the p50 of n round trips of size bytes, in µs.
func roundTrips(a net.Conn, n, size int) (float64, error) {
	msg := make([]byte, size)
	got := make([]byte, size)
	lat := make([]float64, 0, n)
	for range n {
		t := time.Now()
		if _, err := a.Write(msg); err != nil {
			return 0, err
		}
		if _, err := io.ReadFull(a, got); err != nil {
			return 0, err
		}
		lat = append(lat, float64(time.Since(t).Microseconds()))
	}
	return Percentile(lat, 50), nil
}

// MuxFigures measures the yamux layer against the raw transports.
func MuxFigures(r *Report, runs int) error {
	const size, chunk = 64 << 20, 256 << 10
	for _, tr := range []struct {
		name string
		pair func() (net.Conn, net.Conn, error)
	}{{"AF_UNIX socketpair", socketPair}, {"pipes", pipePair}} {
		raw := func() (float64, error) {
			a, b, err := tr.pair()
			if err != nil {
				return 0, err
			}
			defer a.Close()
			defer b.Close()
			return throughput(a, b, size, chunk)
		}
		mux := func() (float64, error) {
			a, b, err := tr.pair()
			if err != nil {
				return 0, err
			}
			sa, sb, closeAll, err := overYamux(a, b)
			if err != nil {
				return 0, err
			}
			defer closeAll()
			return throughput(sa, sb, size, chunk)
		}
		base, subj, err := Pair(runs, raw, mux)
		if err != nil {
			return fmt.Errorf("yamux throughput over %s: %w", tr.name, err)
		}
		r.Add(NewResult("yamux stream throughput over "+tr.name, "MB/s", subj, "raw "+tr.name, base))
	}

	rtt := func(wrap bool) func() (float64, error) {
		return func() (float64, error) {
			a, b, err := socketPair()
			if err != nil {
				return 0, err
			}
			if wrap {
				sa, sb, closeAll, err := overYamux(a, b)
				if err != nil {
					return 0, err
				}
				defer closeAll()
				a, b = sa, sb
			} else {
				defer a.Close()
				defer b.Close()
			}
			go echo(b)
			return roundTrips(a, 2000, 64)
		}
	}
	base, subj, err := Pair(runs, rtt(false), rtt(true))
	if err != nil {
		return fmt.Errorf("round trips: %w", err)
	}
	res := NewResult("64-byte round trip p50, yamux over AF_UNIX", "µs", subj, "raw AF_UNIX", base)
	r.Add(res)

	open, err := openFigure(runs)
	if err != nil {
		return err
	}
	r.Add(open)
	return nil
}

// openFigure compares opening a yamux stream plus the first round trip to a
// TCP loopback connect plus the first round trip.
func openFigure(runs int) (Result, error) {
	const ops = 200
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return Result{}, err
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { echo(c); c.Close() }()
		}
	}()
	a, b, err := socketPair()
	if err != nil {
		return Result{}, err
	}
	cs, _ := yamux.Client(a, protocol.MuxConfig(nil))
	ss, _ := yamux.Server(b, protocol.MuxConfig(nil))
	defer cs.Close()
	defer ss.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ss.Accept()
			if err != nil {
				return
			}
			go func() { echo(c); c.Close() }()
		}
	}()
	firstRTT := func(c net.Conn) error {
		one := []byte{1}
		if _, err := c.Write(one); err != nil {
			return err
		}
		_, err := io.ReadFull(c, one)
		return err
	}
	tcp := func() (float64, error) {
		t := time.Now()
		for range ops {
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				return 0, err
			}
			if err := firstRTT(c); err != nil {
				return 0, err
			}
			c.Close()
		}
		return float64(time.Since(t).Microseconds()) / ops, nil
	}
	ymx := func() (float64, error) {
		t := time.Now()
		for range ops {
			c, err := cs.Open()
			if err != nil {
				return 0, err
			}
			if err := firstRTT(c); err != nil {
				return 0, err
			}
			c.Close()
		}
		return float64(time.Since(t).Microseconds()) / ops, nil
	}
	base, subj, err := Pair(runs, tcp, ymx)
	if err != nil {
		return Result{}, fmt.Errorf("stream open: %w", err)
	}
	res := NewResult("yamux stream open + first round trip", "µs", subj, "TCP loopback connect + first round trip", base)
	return res.Judge("≤ 0.6x TCP connect", res.Ratio <= 0.6), nil
}

var errNoReady = errors.New("no ready event")
