package bench

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/sys/unix"

	guestegress "github.com/oac/sandbox-agent/guest/egress"
	"github.com/oac/sandbox-agent/guest/initsys"
	"github.com/oac/sandbox-agent/guest/transparent"
	"github.com/oac/sandbox-agent/internal/yamux"
	"github.com/oac/sandbox-agent/protocol"
)

// guestNS runs closures on a locked thread in a network namespace of its
// own, where the transparent capture is installed: sockets made there (the
// client's) live in the guest's namespace.
type guestNS struct {
	work chan func()
	fake netip.Addr
	// up is an upstream inside the namespace: the direct baseline for a
	// client on the namespace's locked thread.
	up string
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
		gate := protocol.NewStreamGate(sess)
		t, err := transparent.Start(transparent.Config{Exit: guestegress.NewExit(nil, guestegress.SessionCarrier(gate)), Ask: transparent.SessionAsker(gate)})
		if err != nil {
			errc <- err
			return
		}
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
	// The made-up address comes from the resolver, like a program's would.
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

// in runs a measurement on the namespace's thread.
func (g *guestNS) in(f func() (float64, error)) func() (float64, error) {
	return func() (float64, error) {
		var v float64
		var err error
		g.do(func() { v, err = f() })
		return v, err
	}
}

func (g *guestNS) close() { close(g.work) }

// lookupA asks the guest resolver one A question over UDP; NXDOMAIN is an
// error.
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

// dnsLatency returns the median time of n A questions in µs: the same
// allowed name (answered from the guest's cache) or a new denied name each
// time (a round trip to the host broker, which resolves nothing).
func dnsLatency(n int, fresh bool, run int) (float64, error) {
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
	return float64(ds[len(ds)/2].Microseconds()), nil
}

// TransparentFigures measures the transparent path (resolver, nftables
// capture, egress stream, broker) against a direct connection made from
// the same namespace thread, so the thread hop costs both alike.
func TransparentFigures(r *Report, runs, size, conns int) error {
	up, err := upstream()
	if err != nil {
		return err
	}
	_, sess, stop, err := stack(up)
	if err != nil {
		return err
	}
	defer stop()
	g, err := startGuestNS(sess)
	if err != nil {
		return err
	}
	defer g.close()
	capture := func() (net.Conn, error) { return net.Dial("tcp", netip.AddrPortFrom(g.fake, 9).String()) }
	direct := dialDirect(g.up)
	if _, err := g.in(func() (float64, error) { return download(capture, 8<<20) })(); err != nil {
		return fmt.Errorf("transparent warm-up: %w", err)
	}
	pair := func(name, unit string, f func(func() (net.Conn, error)) (float64, error)) (Result, error) {
		b, s, err := Pair(runs, g.in(func() (float64, error) { return f(direct) }), g.in(func() (float64, error) { return f(capture) }))
		if err != nil {
			return Result{}, fmt.Errorf("%s: %w", name, err)
		}
		return NewResult(name, unit, s, "direct loopback TCP from the same namespace thread", b), nil
	}
	res, err := pair("transparent egress, one flow, download", "MB/s", func(d func() (net.Conn, error)) (float64, error) { return download(d, size) })
	if err != nil {
		return err
	}
	r.Add(res.Judge("≥ 0.5x direct", res.Ratio >= 0.5))
	res, err = pair("transparent egress connect + first byte", "µs", func(d func() (net.Conn, error)) (float64, error) {
		l, err := latency(d, conns)
		return float64(l.Microseconds()), err
	})
	if err != nil {
		return err
	}
	r.Add(res.Judge("≤ 2x direct", res.Ratio <= 2))
	var cached, asked []float64
	for i := range runs {
		v, err := g.in(func() (float64, error) { return dnsLatency(conns, false, i) })()
		if err != nil {
			return err
		}
		cached = append(cached, v)
		v, err = g.in(func() (float64, error) { return dnsLatency(conns, true, i) })()
		if err != nil {
			return err
		}
		asked = append(asked, v)
	}
	r.Add(NewResult("guest DNS answer, cached allowed name", "µs", cached, "", nil))
	r.Add(NewResult("guest DNS answer, denied name asked of the host (NXDOMAIN)", "µs", asked, "", nil))
	return nil
}
