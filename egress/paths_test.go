//go:build linux

package egress

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	gegress "github.com/oac/sandbox-agent/guest/egress"
	"github.com/oac/sandbox-agent/guest/transparent"
	"github.com/oac/sandbox-agent/internal/yamux"
	"github.com/oac/sandbox-agent/protocol"
)

// guestAndHost joins the guest's proxies, resolver and capture handler to
// a broker over a real yamux session, as in a sandbox.
type guestAndHost struct {
	proxies *gegress.Proxies
	tr      *transparent.Transparent
	pool    *transparent.Pool
	broker  *Broker
	mu      sync.Mutex
	events  []api.Event
}

func startGuestAndHost(t *testing.T, b *Broker) *guestAndHost {
	t.Helper()
	gc, hc := net.Pipe()
	gs, err := yamux.Client(gc, protocol.MuxConfig(io.Discard))
	require.NoError(t, err)
	hs, err := yamux.Server(hc, protocol.MuxConfig(io.Discard))
	require.NoError(t, err)
	g := &guestAndHost{broker: b, pool: transparent.NewPool(transparent.DefaultPrefix)}
	emit := func(e api.Event) { g.mu.Lock(); g.events = append(g.events, e); g.mu.Unlock() }
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			st, err := hs.AcceptStream()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				h, err := protocol.ReadStreamHeader(st, 5*time.Second)
				if err != nil {
					st.Close()
					return
				}
				if h.Kind == protocol.KindDNS {
					b.ServeDNS(context.Background(), st, h, emit)
					return
				}
				b.Serve(context.Background(), st, h, emit)
			}()
		}
	}()
	gate := protocol.NewStreamGate(gs)
	exit := gegress.NewExit(g.pool.Unmap, gegress.SessionCarrier(gate))
	g.proxies, err = gegress.StartWith(net.Listen, exit, "127.0.0.1:0", "127.0.0.1:0", nil)
	require.NoError(t, err)
	g.tr, err = transparent.Start(transparent.Config{Exit: exit, Ask: transparent.SessionAsker(gate),
		Pool: g.pool, DNSAddr: "127.0.0.1:0", NoInstall: true})
	require.NoError(t, err)
	t.Cleanup(func() {
		g.proxies.Close()
		g.tr.Close()
		gs.Close()
		hs.Close()
		wg.Wait()
	})
	return g
}

// connect asks the HTTP proxy for a CONNECT tunnel and returns the status line.
func (g *guestAndHost) connect(t *testing.T, host string, port int) string {
	c, err := net.Dial("tcp", g.proxies.HTTPAddr)
	require.NoError(t, err)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	target := net.JoinHostPort(host, itoa(port))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	line, _ := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line)
}

// socks runs a SOCKS5 CONNECT for a domain (remote resolution) or an
// address (the client resolved the name itself) and returns the reply code.
func (g *guestAndHost) socks(t *testing.T, host string, port int) byte {
	c, err := net.Dial("tcp", g.proxies.SOCKSAddr)
	require.NoError(t, err)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	req := []byte{5, 1, 0, 5, 1, 0}
	if a, err := netip.ParseAddr(host); err == nil && a.Is4() {
		req = append(append(req, 1), a.AsSlice()...)
	} else if err == nil {
		req = append(append(req, 4), a.AsSlice()...)
	} else {
		req = append(append(req, 3, byte(len(host))), host...)
	}
	req = append(req, byte(port>>8), byte(port))
	_, err = c.Write(req)
	require.NoError(t, err)
	var rep [12]byte
	_, err = io.ReadFull(c, rep[:12])
	require.NoError(t, err)
	return rep[3]
}

// resolve asks the guest's resolver for host's IPv4 addresses.
func (g *guestAndHost) resolve(host string) ([]netip.Addr, error) {
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "udp", g.tr.DNS.Addr)
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return r.LookupNetIP(ctx, "ip4", host)
}

// captured hands a connection to the capture as if a program had
// connected to dst, and returns what the program reads before the end.
func (g *guestAndHost) captured(t *testing.T, dst netip.AddrPort) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	s, err := ln.Accept()
	require.NoError(t, err)
	host, port, _ := g.tr.Target(net.TCPAddrFromAddrPort(dst))
	go g.tr.Handle(s, host, port)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	b, _ := io.ReadAll(c)
	return string(b)
}

// listeners binds port on every address of addrs it can, counting what
// reaches them.
func listenAll(t *testing.T, addrs []netip.Addr) (int, *atomic.Int32) {
	t.Helper()
	var reached atomic.Int32
	for range 20 {
		var lns []net.Listener
		first, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		port := first.Addr().(*net.TCPAddr).Port
		lns = append(lns, first)
		ok := true
		for _, a := range addrs {
			if a == netip.MustParseAddr("127.0.0.1") {
				continue
			}
			ln, err := net.Listen("tcp", netip.AddrPortFrom(a, uint16(port)).String())
			if err != nil {
				ok = false
				break
			}
			lns = append(lns, ln)
		}
		if !ok {
			for _, ln := range lns {
				ln.Close()
			}
			continue
		}
		for _, ln := range lns {
			t.Cleanup(func() { ln.Close() })
			go countAccepted(ln, &reached)
		}
		return port, &reached
	}
	t.Fatal("no port free on every address of this host")
	return 0, nil
}

// hostAddrs returns this machine's addresses a listener can bind (not
// IPv6 link-local, which needs a zone).
func hostAddrs(t *testing.T) []netip.Addr {
	ias, err := net.InterfaceAddrs()
	require.NoError(t, err)
	var out []netip.Addr
	for _, ia := range ias {
		if ipn, ok := ia.(*net.IPNet); ok {
			a, _ := netip.AddrFromSlice(ipn.IP)
			if a = a.Unmap(); !(a.Is6() && a.IsLinkLocalUnicast()) {
				out = append(out, a)
			}
		}
	}
	return out
}

// Every refused IANA entry and every address of this machine, through the
// HTTP proxy, SOCKS5 with remote and with local resolution, the guest's
// resolver and the capture: each is refused, and nothing reaches a
// listener bound to this machine's addresses on the port (nor does the
// broker create a socket for any refused address).
func TestEveryRefusedAddressOnEveryPathReachesNothing(t *testing.T) {
	own := hostAddrs(t)
	port, reached := listenAll(t, own)
	var targets []target
	for _, row := range specialPurpose {
		p := netip.MustParsePrefix(row.prefix)
		for _, a := range samples(p) {
			if c, _ := narrowest(a); c.prefix == p {
				if _, bad := refusedClass(a); bad {
					targets = append(targets, target{a, row.name + " (" + row.source + ")"})
				}
				break
			}
		}
	}
	require.Greater(t, len(targets), 45)
	pol, err := ParsePolicy([]string{"*.attacker.example:" + itoa(port)}, nil)
	require.NoError(t, err)
	refusedOnEveryPath(t, pol, targets, port, reached)

	// This machine's addresses, with CIDR rules for their subnets lifting
	// their classes: only the host check stands in the way.
	targets = nil
	rules := []string{"*.attacker.example:" + itoa(port)}
	for _, a := range own {
		targets = append(targets, target{a, "an address of this machine"})
		bits := 24
		if a.Is6() {
			bits = 64
		}
		p := netip.PrefixFrom(a, bits).Masked().String()
		if a.Is6() {
			p = "[" + p + "]"
		}
		rules = append(rules, p+":"+itoa(port))
	}
	pol, err = ParsePolicy(rules, nil)
	require.NoError(t, err)
	refusedOnEveryPath(t, pol, targets, port, reached)
}

type target struct {
	addr netip.Addr
	what string
}

func refusedOnEveryPath(t *testing.T, pol *Policy, targets []target, port int, reached *atomic.Int32) {
	dns := fakeDNS{}
	for i, tg := range targets {
		dns[fmt.Sprintf("e%d.attacker.example", i)] = []string{tg.addr.String()}
	}
	b := New(Config{Policy: pol, Resolver: dns, HostAddrs: SystemHostAddrs()})
	var sockets atomic.Int32
	b.dialed = func(string, string) { sockets.Add(1) }
	g := startGuestAndHost(t, b)

	for i, tg := range targets {
		name := fmt.Sprintf("e%d.attacker.example", i)
		why := fmt.Sprintf("%s (%s) via %s", tg.addr, tg.what, name)
		assert.Equal(t, "HTTP/1.1 403 Forbidden", g.connect(t, name, port), "proxy: %s", why)
		assert.Equal(t, "HTTP/1.1 403 Forbidden", g.connect(t, tg.addr.String(), port), "proxy, literal: %s", why)
		assert.Equal(t, byte(0x02), g.socks(t, name, port), "socks5h: %s", why)
		assert.Equal(t, byte(0x02), g.socks(t, tg.addr.String(), port), "socks5, the address itself: %s", why)
		_, err := g.resolve(name)
		var de *net.DNSError
		if assert.ErrorAs(t, err, &de, "the guest's resolver: %s", why) {
			assert.True(t, de.IsNotFound, "NXDOMAIN: %s", why)
		}
		// The name was allowed before and its made-up address is still in
		// the program's hands: it rebinds to the refused address.
		fake := g.pool.Addr(name)
		assert.Equal(t, byte(0x02), g.socks(t, fake.String(), port), "socks5 with local resolution: %s", why)
		assert.Equal(t, "HTTP/1.1 403 Forbidden", g.connect(t, fake.String(), port), "proxy with local resolution: %s", why)
		assert.Empty(t, g.captured(t, netip.AddrPortFrom(fake, uint16(port))), "capture, by name: %s", why)
		if tg.addr.Is4() {
			assert.Empty(t, g.captured(t, netip.AddrPortFrom(tg.addr, uint16(port))), "capture, the literal: %s", why)
		}
	}
	// Each decision is emitted after its answer.
	assert.Eventually(t, func() bool { return len(g.egressEvents()) >= 7*len(targets) }, 10*time.Second, 10*time.Millisecond)
	for _, e := range g.egressEvents() {
		assert.Equal(t, DecisionDenied, e.Decision, "%+v", e)
	}
	assert.Zero(t, reached.Load(), "nothing reached a listener on this machine's addresses")
	assert.Zero(t, sockets.Load(), "the broker created no socket")
}

func (g *guestAndHost) egressEvents() []api.Event {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []api.Event
	for _, e := range g.events {
		if e.Event == api.KindEgress {
			out = append(out, e)
		}
	}
	return out
}

// A name resolved locally (curl --socks5, or any client that resolves and
// then gives the proxy an address) works: the guest maps its made-up
// address back to the name, and a made-up address no name holds is
// refused by the host with an event saying why.
func TestLocallyResolvedNamesWorkThroughEveryPath(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, "hello from upstream\n")
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	pol, err := ParsePolicy(nil, []string{"api.allowed.example:" + itoa(port) + "=" + ln.Addr().String()})
	require.NoError(t, err)
	g := startGuestAndHost(t, New(Config{Policy: pol, HostAddrs: NewAddrSet()}))
	as, err := g.resolve("api.allowed.example")
	require.NoError(t, err)
	require.Len(t, as, 1)
	assert.True(t, protocol.GuestAddrPrefix.Contains(as[0]), "a made-up address: %s", as[0])
	assert.Equal(t, byte(0), g.socks(t, as[0].String(), port), "SOCKS5 with the address the client resolved")
	assert.Equal(t, "HTTP/1.1 200 Connection established", g.connect(t, as[0].String(), port))
	assert.Equal(t, "hello from upstream\n", g.captured(t, netip.AddrPortFrom(as[0], uint16(port))))

	stray := netip.MustParseAddr("198.19.200.1")
	assert.Equal(t, byte(0x02), g.socks(t, stray.String(), port))
	assert.Empty(t, g.captured(t, netip.AddrPortFrom(stray, uint16(port))))
	count := func() (allowed, strays int) {
		for _, e := range g.egressEvents() {
			if e.Target == "api.allowed.example:"+itoa(port) && e.Decision == DecisionAllowed {
				allowed++
			}
			if e.Target == stray.String()+":"+itoa(port) {
				strays++
				assert.Equal(t, DecisionDenied, e.Decision)
				assert.Contains(t, e.Reason, "one of the addresses the sandbox's resolver makes up for names")
				assert.Contains(t, e.Reason, "no name holds it now")
			}
		}
		return
	}
	// socks5, CONNECT and capture each named the name; each stray
	// connection is an egress event with its reason. Each decision is
	// emitted after its answer.
	assert.Eventually(t, func() bool { a, s := count(); return a == 3 && s == 2 }, 10*time.Second, 10*time.Millisecond)
}
