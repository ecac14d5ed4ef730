// Command egress measures the egress path against a direct loopback TCP
// connection, side by side in one run: bulk throughput each way and
// connect-plus-first-byte latency.
//
// The path is the real one minus the namespaces: a client on loopback ->
// the guest's HTTP proxy (CONNECT) -> an egress stream of a yamux session
// over an AF_UNIX socketpair (the bwrap transport is an AF_UNIX socket) ->
// the host broker (policy, dial) -> an upstream on 127.0.0.1. Runs
// alternate between direct and broker so drift hits both alike.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"

	guestegress "github.com/oac/sandbox-agent/guest/egress"
	"github.com/oac/sandbox-agent/host/egress"
	"github.com/oac/sandbox-agent/host/events"
	"github.com/oac/sandbox-agent/internal/pipe"
	"github.com/oac/sandbox-agent/protocol"
)

func main() {
	runs := flag.Int("runs", 9, "runs per measurement (median, min, max over runs)")
	size := flag.Int("mib", 256, "MiB per throughput run")
	conns := flag.Int("conns", 200, "connections per latency run")
	flag.Parse()
	if err := run(*runs, *size<<20, *conns); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// upstream serves: "d" then N bytes down; "u" reads until EOF and answers
// the count; "l" writes one byte at once (latency).
func upstream() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	buf := make([]byte, 256<<10)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var cmd [9]byte
				if _, err := io.ReadFull(c, cmd[:1]); err != nil {
					return
				}
				switch cmd[0] {
				case 'l':
					_, _ = c.Write([]byte{1})
				case 'd':
					if _, err := io.ReadFull(c, cmd[1:]); err != nil {
						return
					}
					n := int64(0)
					for i := 1; i < 9; i++ {
						n = n<<8 | int64(cmd[i])
					}
					local := make([]byte, len(buf))
					for n > 0 {
						w, err := c.Write(local[:min(int64(len(local)), n)])
						if err != nil {
							return
						}
						n -= int64(w)
					}
				case 'u':
					n, _ := io.CopyBuffer(io.Discard, onlyReader{c}, make([]byte, 256<<10))
					fmt.Fprintf(c, "%d", n)
				}
			}()
		}
	}()
	return ln.Addr().String(), nil
}

type onlyReader struct{ io.Reader }

// stack starts the broker and the guest proxy over a yamux session on a
// socketpair and returns the proxy's address.
func stack(upAddr string) (string, func(), error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return "", nil, err
	}
	mk := func(fd int, name string) (net.Conn, error) {
		f := os.NewFile(uintptr(fd), name)
		defer f.Close()
		return net.FileConn(f)
	}
	gc, err := mk(fds[0], "guest")
	if err != nil {
		return "", nil, err
	}
	hc, err := mk(fds[1], "host")
	if err != nil {
		return "", nil, err
	}
	gs, err := yamux.Client(gc, protocol.MuxConfig(nil))
	if err != nil {
		return "", nil, err
	}
	hs, err := yamux.Server(hc, protocol.MuxConfig(nil))
	if err != nil {
		return "", nil, err
	}
	pol, err := egress.ParsePolicy(nil, []string{"bench.test:9=" + upAddr})
	if err != nil {
		return "", nil, err
	}
	b := egress.New(egress.Config{Policy: pol, MaxStreams: 4096})
	go func() {
		for {
			st, err := hs.AcceptStream()
			if err != nil {
				return
			}
			go func() {
				h, err := protocol.ReadStreamHeader(st, 5*time.Second)
				if err != nil {
					st.Close()
					return
				}
				b.Serve(context.Background(), st, h, func(events.Event) {})
			}()
		}
	}()
	px, err := guestegress.Start(guestegress.SessionOpener(gs), "127.0.0.1:0", "127.0.0.1:0", nil)
	if err != nil {
		return "", nil, err
	}
	return px.HTTPAddr, func() { px.Close(); gs.Close(); hs.Close() }, nil
}

// dialDirect and dialBroker return a connection to the upstream.
func dialDirect(up string) func() (net.Conn, error) {
	return func() (net.Conn, error) { return net.Dial("tcp", up) }
}

func dialBroker(proxy string) func() (net.Conn, error) {
	return func() (net.Conn, error) {
		c, err := net.Dial("tcp", proxy)
		if err != nil {
			return nil, err
		}
		if _, err := io.WriteString(c, "CONNECT bench.test:9 HTTP/1.1\r\nHost: bench.test:9\r\n\r\n"); err != nil {
			c.Close()
			return nil, err
		}
		br := bufio.NewReaderSize(c, 64)
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
		if err != nil || resp.StatusCode != 200 {
			c.Close()
			return nil, fmt.Errorf("CONNECT: %v %v", resp, err)
		}
		if br.Buffered() > 0 {
			c.Close()
			return nil, fmt.Errorf("unexpected bytes after the CONNECT answer")
		}
		return c, nil
	}
}

func download(dial func() (net.Conn, error), n int) (float64, error) {
	c, err := dial()
	if err != nil {
		return 0, err
	}
	defer c.Close()
	start := time.Now()
	cmd := []byte{'d', 0, 0, 0, 0, 0, 0, 0, 0}
	for i := 0; i < 8; i++ {
		cmd[8-i] = byte(int64(n) >> (8 * i))
	}
	if _, err := c.Write(cmd); err != nil {
		return 0, err
	}
	got, err := io.CopyBuffer(io.Discard, onlyReader{c}, make([]byte, 256<<10))
	if err != nil || got != int64(n) {
		return 0, fmt.Errorf("download got %d of %d bytes: %v", got, n, err)
	}
	return float64(n) / time.Since(start).Seconds() / 1e6, nil
}

func upload(dial func() (net.Conn, error), n int) (float64, error) {
	c, err := dial()
	if err != nil {
		return 0, err
	}
	defer c.Close()
	start := time.Now()
	if _, err := c.Write([]byte{'u'}); err != nil {
		return 0, err
	}
	buf := make([]byte, 256<<10)
	for left := n; left > 0; {
		w, err := c.Write(buf[:min(len(buf), left)])
		if err != nil {
			return 0, err
		}
		left -= w
	}
	_ = c.(*net.TCPConn).CloseWrite()
	ans, err := io.ReadAll(c)
	if err != nil || string(ans) != fmt.Sprint(n+0) {
		return 0, fmt.Errorf("upload: upstream counted %q of %d: %v", ans, n, err)
	}
	return float64(n) / time.Since(start).Seconds() / 1e6, nil
}

// latency returns the median connect+first-byte time of conns connections.
func latency(dial func() (net.Conn, error), conns int) (time.Duration, error) {
	var ds []time.Duration
	for range conns {
		start := time.Now()
		c, err := dial()
		if err != nil {
			return 0, err
		}
		if _, err := c.Write([]byte{'l'}); err != nil {
			c.Close()
			return 0, err
		}
		var b [1]byte
		if _, err := io.ReadFull(c, b[:]); err != nil {
			c.Close()
			return 0, err
		}
		ds = append(ds, time.Since(start))
		c.Close()
	}
	slices.Sort(ds)
	return ds[len(ds)/2], nil
}

type stat struct{ med, lo, hi float64 }

func summarize(v []float64) stat {
	s := slices.Clone(v)
	slices.Sort(s)
	return stat{s[len(s)/2], s[0], s[len(s)-1]}
}

func run(runs, size, conns int) error {
	up, err := upstream()
	if err != nil {
		return err
	}
	proxy, stop, err := stack(up)
	if err != nil {
		return err
	}
	defer stop()
	direct, broker := dialDirect(up), dialBroker(proxy)
	// Warm up both paths.
	if _, err := download(broker, 8<<20); err != nil {
		return err
	}
	if _, err := download(direct, 8<<20); err != nil {
		return err
	}
	type series struct{ direct, broker []float64 }
	var down, upl, lat series
	for i := 0; i < runs; i++ {
		for _, m := range []struct {
			s    *series
			f    func(func() (net.Conn, error)) (float64, error)
			name string
		}{
			{&down, func(d func() (net.Conn, error)) (float64, error) { return download(d, size) }, "download"},
			{&upl, func(d func() (net.Conn, error)) (float64, error) { return upload(d, size) }, "upload"},
			{&lat, func(d func() (net.Conn, error)) (float64, error) {
				l, err := latency(d, conns)
				return float64(l.Microseconds()), err
			}, "latency"},
		} {
			a, err := m.f(direct)
			if err != nil {
				return fmt.Errorf("%s direct: %w", m.name, err)
			}
			b, err := m.f(broker)
			if err != nil {
				return fmt.Errorf("%s broker: %w", m.name, err)
			}
			m.s.direct = append(m.s.direct, a)
			m.s.broker = append(m.s.broker, b)
		}
	}
	fmt.Printf("egress bench: %d runs, %d MiB per throughput run, %d connections per latency run; large buffers held after the run: %d\n",
		runs, size>>20, conns, pipe.BigBuffersInUse())
	fmt.Printf("%-34s %10s %10s %10s\n", "", "median", "min", "max")
	row := func(name, unit string, v []float64) {
		s := summarize(v)
		fmt.Printf("%-34s %10.0f %10.0f %10.0f  %s\n", name, s.med, s.lo, s.hi, unit)
	}
	row("download, direct loopback TCP", "MB/s", down.direct)
	row("download, through the broker", "MB/s", down.broker)
	row("upload, direct loopback TCP", "MB/s", upl.direct)
	row("upload, through the broker", "MB/s", upl.broker)
	row("connect+first byte, direct", "us (median of each run)", lat.direct)
	row("connect+first byte, broker", "us (median of each run)", lat.broker)
	fmt.Printf("ratio broker/direct: download %.2f, upload %.2f (median throughput); latency %.1fx (median)\n",
		summarize(down.broker).med/summarize(down.direct).med,
		summarize(upl.broker).med/summarize(upl.direct).med,
		summarize(lat.broker).med/summarize(lat.direct).med)
	return nil
}
