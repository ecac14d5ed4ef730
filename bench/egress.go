//go:build linux

package bench

// Egress figures: the path is the real one minus the namespaces: a client
// on loopback -> the guest's HTTP proxy (CONNECT) -> an egress stream of a
// yamux session over an AF_UNIX socketpair (the bwrap transport is an
// AF_UNIX socket) -> the host broker (policy, dial) -> an upstream on
// 127.0.0.1. Runs alternate between direct and broker so drift hits both
// alike.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/egress"
	guestegress "github.com/oac/sandbox-agent/guest/egress"
	"github.com/oac/sandbox-agent/host/muxguard"
	"github.com/oac/sandbox-agent/internal/pipe"
	"github.com/oac/sandbox-agent/internal/yamux"
	"github.com/oac/sandbox-agent/protocol"
)

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
				case 'e':
					echo(c)
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

// stack starts the broker and the guest proxy over a yamux session on a
// socketpair and returns the proxy's address and the guest's session.
func stack(upAddr string) (string, *yamux.Session, func(), error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return "", nil, nil, err
	}
	mk := func(fd int, name string) (net.Conn, error) {
		f := os.NewFile(uintptr(fd), name)
		defer f.Close()
		return net.FileConn(f)
	}
	gc, err := mk(fds[0], "guest")
	if err != nil {
		return "", nil, nil, err
	}
	hc, err := mk(fds[1], "host")
	if err != nil {
		return "", nil, nil, err
	}
	// As oac-guest and oac-shim build the session: socket buffers, each
	// frame in one write, the host's side guarded and its streams tracked.
	protocol.TuneTransport(gc)
	protocol.TuneTransport(hc)
	gs, err := yamux.Client(protocol.Coalesce(gc), protocol.MuxConfig(nil))
	if err != nil {
		return "", nil, nil, err
	}
	guard := muxguard.New(protocol.Coalesce(hc), muxguard.DefaultLimits())
	hs, err := yamux.Server(guard, protocol.MuxConfig(nil))
	if err != nil {
		return "", nil, nil, err
	}
	pol, err := egress.ParsePolicy(nil, []string{"bench.test:9=" + upAddr})
	if err != nil {
		return "", nil, nil, err
	}
	b := egress.New(egress.Config{Policy: pol, MaxStreams: 4096})
	go func() {
		for {
			yst, err := hs.AcceptStream()
			if err != nil {
				return
			}
			st := guard.Track(yst)
			go func() {
				h, err := protocol.ReadStreamHeader(st, 5*time.Second)
				if err != nil {
					st.Close()
					return
				}
				if h.Kind == protocol.KindDNS {
					b.ServeDNS(context.Background(), st, h, func(api.Event) {})
					return
				}
				b.Serve(context.Background(), st, h, func(api.Event) {})
			}()
		}
	}()
	px, err := guestegress.StartWith(net.Listen, guestegress.NewExit(nil, guestegress.SessionCarrier(protocol.NewStreamGate(gs))), "127.0.0.1:0", "127.0.0.1:0", nil)
	if err != nil {
		return "", nil, nil, err
	}
	return px.HTTPAddr, gs, func() { px.Close(); gs.Close(); hs.Close() }, nil
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

// EgressFigures measures the egress tunnel against direct loopback TCP,
// over the session (yamux) and, where the process may run one (root), on
// the data plane's fd channel.
func EgressFigures(r *Report, runs, size, conns int) error {
	up, err := upstream()
	if err != nil {
		return err
	}
	proxy, _, stop, err := stack(up)
	if err != nil {
		return err
	}
	defer stop()
	if err := tunnelFigures(r, "egress tunnel", up, proxy, runs, size, conns, false); err != nil {
		return err
	}
	held := float64(pipe.BigBuffersInUse())
	r.Add(NewResult("large copy buffers still held after the runs", "buffers", []float64{held}, "", nil).Judge("0", held == 0))
	if err := idleMemory(r, proxy, "", true); err != nil {
		return err
	}
	dproxy, dstop, err := dataStack(up)
	if err != nil {
		r.Skip("egress tunnel on the data plane", err.Error())
		return nil
	}
	defer dstop()
	if err := tunnelFigures(r, "egress tunnel on the data plane (fd channel, spliced)", up, dproxy, runs, size, conns, true); err != nil {
		return err
	}
	return idleMemory(r, dproxy, " on the data plane", false)
}

// tunnelFigures measures one tunnel (the proxy at proxy) against direct
// loopback TCP. dataPlane judges by the data plane's goals.
func tunnelFigures(r *Report, label, up, proxy string, runs, size, conns int, dataPlane bool) error {
	direct, broker := dialDirect(up), dialBroker(proxy)
	for _, d := range []func() (net.Conn, error){direct, broker} { // warm up
		if _, err := download(d, 8<<20); err != nil {
			return err
		}
	}
	pair := func(name, unit string, f func(func() (net.Conn, error)) (float64, error)) (Result, error) {
		b, s, err := Pair(runs, func() (float64, error) { return f(direct) }, func() (float64, error) { return f(broker) })
		if err != nil {
			return Result{}, fmt.Errorf("%s: %w", name, err)
		}
		return NewResult(name, unit, s, "direct loopback TCP", b), nil
	}
	type goal struct {
		text string
		ok   func(float64) bool
	}
	at := func(min float64) goal {
		return goal{fmt.Sprintf("≥ %gx direct", min), func(x float64) bool { return x >= min }}
	}
	below := func(max float64) goal {
		return goal{fmt.Sprintf("≤ %gx direct", max), func(x float64) bool { return x <= max }}
	}
	goals := []goal{at(0.5), at(0.5), at(0.4), below(2), below(2.5)}
	if dataPlane {
		goals = []goal{at(0.8), at(0.8), at(0.7), below(1.5), below(1.5)}
	}
	rows := []struct {
		name, unit string
		f          func(func() (net.Conn, error)) (float64, error)
	}{
		{"one flow, download", "MB/s", func(d func() (net.Conn, error)) (float64, error) { return download(d, size) }},
		{"one flow, upload", "MB/s", func(d func() (net.Conn, error)) (float64, error) { return upload(d, size) }},
		{"8 flows at once, download (sum)", "MB/s", func(d func() (net.Conn, error)) (float64, error) {
			return flows(8, func() (float64, error) { return download(d, size/8) })
		}},
		{"connect + first byte (median of each run)", "µs", func(d func() (net.Conn, error)) (float64, error) {
			// The guest paces its stream opens (protocol.StreamGate, a
			// bucket of GuestStreamOpenBurst refilled at
			// GuestStreamOpenRate a second): runs back to back open
			// more than that, and from the sixth run on each open waited
			// about 1 ms for the pace, which the median then measured.
			// Let the bucket refill what the last run took.
			time.Sleep(time.Duration(conns) * time.Second / protocol.GuestStreamOpenRate)
			l, err := latency(d, conns)
			return float64(l.Microseconds()), err
		}},
		{"steady 64-byte round trip p50", "µs", func(d func() (net.Conn, error)) (float64, error) { return steadyRTT(d, 2000) }},
	}
	for i, row := range rows {
		res, err := pair(label+", "+row.name, row.unit, row.f)
		if err != nil {
			return err
		}
		r.Add(res.Judge(goals[i].text, goals[i].ok(res.Ratio)))
	}
	return nil
}

// flows runs f on n connections at once and returns the summed MB/s.
func flows(n int, f func() (float64, error)) (float64, error) {
	var wg sync.WaitGroup
	rates := make([]float64, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() { defer wg.Done(); rates[i], errs[i] = f() }()
	}
	wg.Wait()
	sum := 0.0
	for i := range n {
		if errs[i] != nil {
			return 0, errs[i]
		}
		sum += rates[i]
	}
	return sum, nil
}

// steadyRTT opens one connection to the upstream's echo mode and returns
// the p50 of n 64-byte round trips, in µs.
func steadyRTT(dial func() (net.Conn, error), n int) (float64, error) {
	c, err := dial()
	if err != nil {
		return 0, err
	}
	defer c.Close()
	if _, err := c.Write([]byte{'e'}); err != nil {
		return 0, err
	}
	return roundTrips(c, n, 64)
}

// heap returns the bytes the process holds for heap and stacks after a GC.
func heap() float64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return float64(m.HeapInuse + m.StackInuse)
}

// idleMemory measures what idle proxied connections through proxy cost
// (and, with streams, idle yamux streams). Both ends live in this
// process, so the cost per side is half. It is the process's heap and
// stacks: the kernel's socket and pipe buffers are not in it.
func idleMemory(r *Report, proxy, label string, streams bool) error {
	// Under the guest's stream gate (protocol.MaxGuestStreams less its
	// reserve): the session carries at most that many connections.
	const n = 400
	if streams {
		if err := idleStreams(r, n); err != nil {
			return err
		}
	}
	before := heap()
	var conns []net.Conn
	for range n {
		c, err := dialBroker(proxy)()
		if err != nil {
			return fmt.Errorf("idle connection %d: %w", len(conns), err)
		}
		if _, err := c.Write([]byte{'e'}); err != nil {
			return err
		}
		conns = append(conns, c)
	}
	time.Sleep(1500 * time.Millisecond) // past the pipe's idle buffer release
	per := (heap() - before) / n / 2 / 1024
	for _, c := range conns {
		c.Close()
	}
	r.Add(NewResult("memory per idle proxied connection"+label+", per side (guest proxy + host broker + upstream)", "KB", []float64{per}, "", nil).Judge("≤ 80 KB", per <= 80))
	return nil
}

// idleStreams measures what an idle yamux stream costs.
func idleStreams(r *Report, n int) error {
	a, b, err := socketPair()
	if err != nil {
		return err
	}
	cs, _ := yamux.Client(a, protocol.MuxConfig(nil))
	ss, _ := yamux.Server(b, protocol.MuxConfig(nil))
	defer cs.Close()
	defer ss.Close()
	go func() {
		for {
			if _, err := ss.Accept(); err != nil {
				return
			}
		}
	}()
	before := heap()
	var streams []net.Conn
	for range n {
		st, err := cs.Open()
		if err != nil {
			return err
		}
		if _, err := st.Write([]byte{0}); err != nil { // SYN goes out with data
			return err
		}
		streams = append(streams, st)
	}
	time.Sleep(200 * time.Millisecond)
	per := (heap() - before) / float64(n) / 2 / 1024
	for _, st := range streams {
		st.Close()
	}
	r.Add(NewResult("memory per idle yamux stream, per side", "KB", []float64{per}, "", nil).Judge("≤ 3 KB", per <= 3))
	return nil
}
