// Command egress measures the two egress paths against a direct loopback
// TCP connection, side by side in one run: bulk throughput each way and
// connect-plus-first-byte latency, plus the guest resolver's answer time.
//
// The proxy path is the real one minus the namespaces: a client on
// loopback -> the guest's HTTP proxy (CONNECT) -> an egress stream of a
// yamux session over an AF_UNIX socketpair (the bwrap transport is an
// AF_UNIX socket) -> the host broker (policy, dial) -> an upstream on
// 127.0.0.1. The transparent path runs its guest half in a network
// namespace of its own (a thread that unshared CLONE_NEWNET; needs root),
// exactly as a guest has it: a proxy-unaware client connects to the fake
// address the guest resolver handed out for the name, the agent's
// nftables rules redirect it to the capture listener, which opens the
// same kind of egress stream (via "transparent") over the same session.
// Runs alternate between direct, proxy and transparent so drift hits all
// alike.
package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"syscall"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/sys/unix"

	"github.com/hashicorp/yamux"

	guestegress "github.com/oac/sandbox-agent/guest/egress"
	"github.com/oac/sandbox-agent/guest/initsys"
	"github.com/oac/sandbox-agent/guest/transparent"
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
	gs, err := yamux.Client(gc, protocol.MuxConfig(nil))
	if err != nil {
		return "", nil, nil, err
	}
	hs, err := yamux.Server(hc, protocol.MuxConfig(nil))
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
				if h.Kind == protocol.KindDNS {
					b.ServeDNS(context.Background(), st, h, func(events.Event) {})
					return
				}
				b.Serve(context.Background(), st, h, func(events.Event) {})
			}()
		}
	}()
	px, err := guestegress.Start(guestegress.SessionOpener(gs), "127.0.0.1:0", "127.0.0.1:0", nil)
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

// guestNS runs closures on a locked thread in a network namespace of its
// own, where the transparent capture is installed: sockets made there
// (the client's) live in the guest's namespace.
type guestNS struct {
	work chan func()
	fake netip.Addr
	// up is an upstream inside the namespace: the direct baseline for a
	// client on the namespace's locked thread.
	up string
	t  *transparent.Transparent
}

func startGuestNS(sess *yamux.Session) (*guestNS, error) {
	g := &guestNS{work: make(chan func())}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with it
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare network namespace (needs root): %w", err)
			return
		}
		if _, err := initsys.LoopbackUp(); err != nil {
			errc <- err
			return
		}
		t, err := transparent.Start(transparent.Config{Open: guestegress.SessionOpener(sess), Ask: transparent.SessionAsker(sess)})
		if err != nil {
			errc <- err
			return
		}
		g.t = t
		if g.up, err = upstream(); err != nil {
			errc <- err
			return
		}
		errc <- nil
		for f := range g.work {
			f()
		}
		t.Close()
	}()
	if err := <-errc; err != nil {
		return nil, err
	}
	// The fake address comes from the resolver, like a program's would.
	var err error
	g.do(func() {
		var ans []netip.Addr
		ans, err = lookupA("bench.test", 0)
		if err == nil && len(ans) == 1 {
			g.fake = ans[0]
		} else if err == nil {
			err = fmt.Errorf("bench.test: %d answers", len(ans))
		}
	})
	return g, err
}

func (g *guestNS) do(f func()) {
	done := make(chan struct{})
	g.work <- func() { f(); close(done) }
	<-done
}

func (g *guestNS) close() { close(g.work) }

// lookupA asks the guest resolver (127.0.0.1:53 in the namespace) one A
// question over UDP and returns the answers; rcode NXDOMAIN is an error.
func lookupA(name string, id uint16) ([]netip.Addr, error) {
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, RecursionDesired: true})
	_ = b.StartQuestions()
	_ = b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name + "."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	q, err := b.Finish()
	if err != nil {
		return nil, err
	}
	c, err := net.Dial("udp", transparent.DNSAddr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(q); err != nil {
		return nil, err
	}
	buf := make([]byte, 1500)
	n, err := c.Read(buf)
	if err != nil {
		return nil, err
	}
	var m dnsmessage.Message
	if err := m.Unpack(buf[:n]); err != nil {
		return nil, err
	}
	if m.Header.RCode != dnsmessage.RCodeSuccess {
		return nil, fmt.Errorf("%s: %s", name, m.Header.RCode)
	}
	var out []netip.Addr
	for _, a := range m.Answers {
		if r, ok := a.Body.(*dnsmessage.AResource); ok {
			out = append(out, netip.AddrFrom4(r.A))
		}
	}
	return out, nil
}

// dnsLatency returns the median time of n A questions: the same allowed
// name (answered from the guest's cache) or a new denied name each time
// (a round trip to the host broker, which resolves nothing).
func dnsLatency(n int, fresh bool, run int) (time.Duration, error) {
	var ds []time.Duration
	for i := range n {
		name := "bench.test"
		if fresh {
			name = fmt.Sprintf("r%d-%d.denied.bench", run, i)
		}
		start := time.Now()
		_, err := lookupA(name, uint16(i))
		d := time.Since(start)
		if fresh && (err == nil || !bytes.Contains([]byte(err.Error()), []byte("RCodeNameError"))) {
			return 0, fmt.Errorf("a denied name: want NXDOMAIN, got %v", err)
		} else if !fresh && err != nil {
			return 0, err
		}
		ds = append(ds, d)
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
	proxy, sess, stop, err := stack(up)
	if err != nil {
		return err
	}
	defer stop()
	direct, broker := dialDirect(up), dialBroker(proxy)
	g, gerr := startGuestNS(sess)
	if gerr != nil {
		fmt.Printf("transparent path not measured: %v\n", gerr)
	} else {
		defer g.close()
	}
	var capture func() (net.Conn, error)
	// inGuest runs a measurement on the namespace's thread, where the
	// client's sockets must be made.
	inGuest := func(f func() (float64, error)) (float64, error) {
		var v float64
		var err error
		g.do(func() { v, err = f() })
		return v, err
	}
	if g != nil {
		target := netip.AddrPortFrom(g.fake, 9).String()
		capture = func() (net.Conn, error) { return net.Dial("tcp", target) }
	}
	// Warm up every path.
	for _, d := range []func() (net.Conn, error){broker, direct} {
		if _, err := download(d, 8<<20); err != nil {
			return err
		}
	}
	if g != nil {
		if _, err := inGuest(func() (float64, error) { return download(capture, 8<<20) }); err != nil {
			return fmt.Errorf("transparent warm-up: %w", err)
		}
	}
	type series struct{ direct, broker, transparent, guestDirect []float64 }
	var down, upl, lat series
	var dnsCached, dnsHost []float64
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
				return fmt.Errorf("%s proxy: %w", m.name, err)
			}
			m.s.direct = append(m.s.direct, a)
			m.s.broker = append(m.s.broker, b)
			if g != nil {
				c, err := inGuest(func() (float64, error) { return m.f(capture) })
				if err != nil {
					return fmt.Errorf("%s transparent: %w", m.name, err)
				}
				m.s.transparent = append(m.s.transparent, c)
				d, err := inGuest(func() (float64, error) { return m.f(dialDirect(g.up)) })
				if err != nil {
					return fmt.Errorf("%s direct in the namespace: %w", m.name, err)
				}
				m.s.guestDirect = append(m.s.guestDirect, d)
			}
		}
		if g != nil {
			for _, d := range []struct {
				fresh bool
				s     *[]float64
			}{{false, &dnsCached}, {true, &dnsHost}} {
				v, err := inGuest(func() (float64, error) {
					l, err := dnsLatency(conns, d.fresh, i)
					return float64(l.Microseconds()), err
				})
				if err != nil {
					return fmt.Errorf("dns: %w", err)
				}
				*d.s = append(*d.s, v)
			}
		}
	}
	fmt.Printf("egress bench: %d runs, %d MiB per throughput run, %d connections per latency run; large buffers held after the run: %d\n",
		runs, size>>20, conns, pipe.BigBuffersInUse())
	fmt.Printf("%-44s %10s %10s %10s\n", "", "median", "min", "max")
	row := func(name, unit string, v []float64) {
		if len(v) == 0 {
			return
		}
		s := summarize(v)
		fmt.Printf("%-44s %10.0f %10.0f %10.0f  %s\n", name, s.med, s.lo, s.hi, unit)
	}
	row("download, direct loopback TCP", "MB/s", down.direct)
	row("download, proxy (CONNECT) through the broker", "MB/s", down.broker)
	row("download, transparent through the broker", "MB/s", down.transparent)
	row("download, direct, client on the netns thread", "MB/s", down.guestDirect)
	row("upload, direct loopback TCP", "MB/s", upl.direct)
	row("upload, proxy (CONNECT) through the broker", "MB/s", upl.broker)
	row("upload, transparent through the broker", "MB/s", upl.transparent)
	row("upload, direct, client on the netns thread", "MB/s", upl.guestDirect)
	row("connect+first byte, direct", "us (median of each run)", lat.direct)
	row("connect+first byte, proxy", "us (median of each run)", lat.broker)
	row("connect+first byte, transparent", "us (median of each run)", lat.transparent)
	row("connect+first byte, direct, netns thread", "us (median of each run)", lat.guestDirect)
	row("DNS answer, name cached in the guest", "us (median of each run)", dnsCached)
	row("DNS answer, asking the host broker", "us (median of each run)", dnsHost)
	fmt.Printf("ratio proxy/direct: download %.2f, upload %.2f (median throughput); latency %.1fx (median)\n",
		summarize(down.broker).med/summarize(down.direct).med,
		summarize(upl.broker).med/summarize(upl.direct).med,
		summarize(lat.broker).med/summarize(lat.direct).med)
	if g != nil {
		fmt.Printf("ratio transparent/direct: download %.2f, upload %.2f (median throughput); latency %.1fx (median)\n",
			summarize(down.transparent).med/summarize(down.direct).med,
			summarize(upl.transparent).med/summarize(upl.direct).med,
			summarize(lat.transparent).med/summarize(lat.direct).med)
	}
	return nil
}
