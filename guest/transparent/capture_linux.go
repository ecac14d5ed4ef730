package transparent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/oac/sandbox-agent/guest/egress"
	"github.com/oac/sandbox-agent/guest/netns"
	"github.com/oac/sandbox-agent/protocol"
)

// Defaults.
const (
	// DNSAddr is where the resolver listens in the guest.
	DNSAddr = "127.0.0.1:53"
	// MaxCaptured bounds concurrent captured connections (the host's
	// stream limit is usually lower and answers ResourceExhausted).
	MaxCaptured = 1024
	// udpPoll is how often the dropped-UDP counter is read.
	udpPoll = 2 * time.Second
)

// SessionAsker asks over a yamux session, one dns stream per question,
// opened through gate (see egress.SessionOpener).
func SessionAsker(gate *protocol.StreamGate) Asker {
	return func(ctx context.Context, name string) protocol.DNSReply {
		local := func(code protocol.EgressCode, reason string) protocol.DNSReply {
			return protocol.DNSReply{Code: code, Error: code.String(), Effect: protocol.EffectNone, Reason: reason}
		}
		st, err := egress.OpenGated(ctx, gate, protocol.StreamHeader{Kind: protocol.KindDNS, Host: name})
		if errors.Is(err, protocol.ErrGateTimeout) {
			return local(protocol.EgressResourceExhausted, err.Error())
		}
		if err != nil {
			return local(protocol.EgressIO, "cannot reach the host broker: "+err.Error())
		}
		defer st.Close()
		stop := context.AfterFunc(ctx, func() { st.Close() })
		defer stop()
		r, err := protocol.ReadDNSReply(st, protocol.DNSReplyTimeout)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return local(protocol.EgressTimedOut, "the host broker did not answer in time")
			}
			return local(protocol.EgressIO, "bad answer from the host broker: "+err.Error())
		}
		return r
	}
}

// Config configures Start.
type Config struct {
	// Exit carries each captured connection out, the same way out as
	// the proxies'.
	Exit *egress.Exit
	// Open, for tests and benchmarks with no Exit, is the one way out
	// (egress.Opens).
	Open egress.Opener
	Ask  Asker
	Log  *slog.Logger
	// DNSAddr defaults to DNSAddr. Tests and benchmarks use another.
	DNSAddr string
	// Pool defaults to a pool over DefaultPrefix.
	Pool *Pool
	// NoInstall skips the namespace setup (tests and benchmarks set it
	// up themselves or dial the capture listener through their own rules).
	NoInstall bool
	// OnUDPDropped receives the number of UDP datagrams dropped since the
	// last call (polled; only when non-zero).
	OnUDPDropped func(n uint64)
	// NetNS is the workload's network namespace, where the resolver and
	// the capture serve and the rules go; nil is the agent's own.
	NetNS *netns.NS
}

// Transparent is the running resolver and capture of a guest.
type Transparent struct {
	DNS         *DNSServer
	CaptureAddr string
	pool        *Pool
	cfg         Config
	ln          net.Listener
	ctx         context.Context
	cancel      context.CancelFunc
	wg          sync.WaitGroup
	mu          sync.Mutex
	conns       map[net.Conn]struct{}
	installed   bool

	// DNS6 and CaptureAddr6 are their IPv6 twins on [::1] (nil and ""
	// when IPv6 is not captured).
	DNS6         *DNSServer
	CaptureAddr6 string
	ln6          net.Listener
	// Families says which families are captured, for the starting event:
	// "IPv4 and IPv6", or "IPv4 only" and why IPv6 is not.
	Families string
}

// Start runs the resolver and the capture listener, then installs the
// namespace rules that send DNS and every outgoing TCP connection to them.
func Start(cfg Config) (*Transparent, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.DNSAddr == "" {
		cfg.DNSAddr = DNSAddr
	}
	if cfg.Pool == nil {
		cfg.Pool = NewPool(DefaultPrefix)
	}
	if cfg.Exit == nil {
		cfg.Exit = egress.NewExit(cfg.Pool.Unmap, egress.Opens("open", cfg.Open))
	}
	ns := cfg.NetNS
	if !cfg.NoInstall {
		var only bool
		err := ns.Do(func() (err error) { only, err = OnlyLoopback(); return err })
		if err != nil {
			return nil, fmt.Errorf("capture: list interfaces: %w", err)
		}
		if !only {
			return nil, errors.New("capture: the guest has a network interface besides lo; transparent capture only runs where the host broker is the only way out")
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	t := &Transparent{pool: cfg.Pool, cfg: cfg, ctx: ctx, cancel: cancel, conns: map[net.Conn]struct{}{}, Families: "IPv4 only"}
	res := NewResolver(cfg.Ask, cfg.Pool)
	dns, err := ServeDNSIn(ns, res, cfg.DNSAddr, cfg.Log)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("resolver: listen on %s: %w", cfg.DNSAddr, err)
	}
	t.DNS = dns
	ln, err := ns.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		dns.Close()
		cancel()
		return nil, fmt.Errorf("capture: listen: %w", err)
	}
	t.ln, t.CaptureAddr = ln, ln.Addr().String()
	if !cfg.NoInstall {
		_, dp, _ := net.SplitHostPort(dns.Addr)
		dnsPort, _ := strconv.Atoi(dp)
		rules := Rules{Pool: cfg.Pool, CapturePort: uint16(ln.Addr().(*net.TCPAddr).Port), DNSPort: uint16(dnsPort)}
		if err := ns.Do(func() error { return Install(rules) }); err != nil {
			ln.Close()
			dns.Close()
			cancel()
			return nil, err
		}
		t.installed = true
		if err := t.startIPv6(res, rules); err != nil {
			t.Families = "IPv4 only (IPv6 not captured: " + err.Error() + ")"
			cfg.Log.Warn("transparent egress: IPv6 not captured; IPv4 is", "err", err)
		} else {
			t.Families = "IPv4 and IPv6"
		}
		if cfg.OnUDPDropped != nil {
			t.wg.Add(1)
			go t.pollUDP()
		}
	}
	t.wg.Add(1)
	go t.serve(t.ln)
	return t, nil
}

// startIPv6 adds the IPv6 capture beside the IPv4 one: a resolver and a
// capture listener on [::1], the ip6 rules, then AAAA answers. A guest
// whose kernel has no IPv6 (or no IPv6 netfilter) keeps the IPv4 capture
// as it was: AAAA questions keep getting empty answers and nothing of
// IPv6 is left installed.
func (t *Transparent) startIPv6(res *Resolver, rules Rules) (err error) {
	ns := t.cfg.NetNS
	// The IPv4 resolver's port when free (a client naming [::1]:53 finds
	// it); the redirection reaches it on whatever port it has.
	_, dp, _ := net.SplitHostPort(t.DNS.Addr)
	dns, err := ServeDNSIn(ns, res, net.JoinHostPort("::1", dp), t.cfg.Log)
	if err != nil {
		if dns, err = ServeDNSIn(ns, res, "[::1]:0", t.cfg.Log); err != nil {
			return fmt.Errorf("resolver on [::1]: %w", err)
		}
	}
	ln, err := ns.Listen("tcp6", "[::1]:0")
	if err != nil {
		dns.Close()
		return fmt.Errorf("listen on [::1]: %w", err)
	}
	_, dp6, _ := net.SplitHostPort(dns.Addr)
	dnsPort6, _ := strconv.Atoi(dp6)
	rules.CapturePort6, rules.DNSPort6 = uint16(ln.Addr().(*net.TCPAddr).Port), uint16(dnsPort6)
	if err := ns.Do(func() error { return Install6(rules) }); err != nil {
		_ = ns.Do(Uninstall6)
		ln.Close()
		dns.Close()
		return err
	}
	t.DNS6, t.ln6, t.CaptureAddr6 = dns, ln, ln.Addr().String()
	res.SetIPv6(true)
	t.wg.Add(1)
	go t.serve(ln)
	return nil
}

// Close removes the rules, stops listening and closes every captured
// connection.
func (t *Transparent) Close() error {
	t.cancel()
	if t.installed {
		_ = t.cfg.NetNS.Do(Uninstall)
	}
	t.ln.Close()
	t.DNS.Close()
	if t.ln6 != nil {
		t.ln6.Close()
		t.DNS6.Close()
	}
	t.mu.Lock()
	for c := range t.conns {
		c.Close()
	}
	t.mu.Unlock()
	t.wg.Wait()
	return nil
}

func (t *Transparent) pollUDP() {
	defer t.wg.Done()
	tk := time.NewTicker(udpPoll)
	defer tk.Stop()
	for {
		select {
		case <-t.ctx.Done():
			return
		case <-tk.C:
			var n uint64
			err := t.cfg.NetNS.Do(func() (err error) {
				if n, err = UDPDropped(); err == nil && t.ln6 != nil {
					if n6, err6 := UDPDropped6(); err6 == nil {
						n += n6
					}
				}
				return err
			})
			if err == nil && n > 0 {
				t.cfg.OnUDPDropped(n)
			}
		}
	}
}

// serve accepts captured connections on ln (the IPv4 or the IPv6
// listener; each has its own bound).
func (t *Transparent) serve(ln net.Listener) {
	defer t.wg.Done()
	sem := make(chan struct{}, MaxCaptured)
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		select {
		case sem <- struct{}{}:
		default:
			t.cfg.Log.Warn("capture: too many connections, resetting one", "limit", MaxCaptured)
			reset(c)
			continue
		}
		t.mu.Lock()
		t.conns[c] = struct{}{}
		t.mu.Unlock()
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			defer func() { <-sem }()
			defer func() {
				t.mu.Lock()
				delete(t.conns, c)
				t.mu.Unlock()
				c.Close()
			}()
			t.handle(c.(*net.TCPConn))
		}()
	}
}

// Target maps a captured destination back to what the program asked for:
// the name a fake address was handed out for, or the address itself (a
// made-up address no name holds too: the host refuses it, saying why, in
// an egress event).
func (t *Transparent) Target(dst net.Addr) (host string, port int, ok bool) {
	ta, isTCP := dst.(*net.TCPAddr)
	if !isTCP {
		return "", 0, false
	}
	ap := ta.AddrPort()
	return t.pool.Unmap(ap.Addr().Unmap().String()), int(ap.Port()), true
}

func (t *Transparent) handle(c *net.TCPConn) {
	ap, err := originalDst(c)
	if err != nil {
		t.cfg.Log.Warn("capture: no original destination", "err", err)
		reset(c)
		return
	}
	host, port, _ := t.Target(net.TCPAddrFromAddrPort(ap))
	t.Handle(c, host, port)
}

// reset closes c with an RST (SO_LINGER 0).
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}
