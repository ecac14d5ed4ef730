package egress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/oac/sandbox-agent/internal/safetext"
	"github.com/oac/sandbox-agent/protocol"
)

// Defaults.
const (
	// HTTPAddr and SOCKSAddr are where the proxies listen in the guest.
	HTTPAddr  = "127.0.0.1:3128"
	SOCKSAddr = "127.0.0.1:1080"
	// MaxHeaderBytes bounds an HTTP request head (request line + headers).
	MaxHeaderBytes = 64 << 10
	// HeaderTimeout bounds the wait for a request head or a SOCKS
	// handshake; KeepAliveIdle bounds the wait for the next request on a
	// kept-alive connection.
	HeaderTimeout = 30 * time.Second
	KeepAliveIdle = 120 * time.Second
	// MaxConns bounds concurrent client connections per proxy; the host
	// enforces its own, usually lower, limit on egress streams.
	MaxConns = 1024
)

// GateWait bounds how long a connection waits for one of the session's
// stream slots (protocol.StreamGate) before it is refused with
// ResourceExhausted.
const GateWait = 10 * time.Second

// SessionCarrier carries connections as egress streams of a yamux
// session, through gate: the connections of a workload that opens more
// at once than the session carries wait for a slot, then are refused in
// the guest, never counted against the host's bounds. It always answers:
// it is the last way out.
func SessionCarrier(gate *protocol.StreamGate) Carrier {
	return Carrier{Name: "session", Open: func(ctx context.Context, t Target) (net.Conn, protocol.EgressReply, bool) {
		st, r := openSession(ctx, gate, t.Header())
		return st, r, true
	}}
}

func openSession(ctx context.Context, gate *protocol.StreamGate, h protocol.StreamHeader) (net.Conn, protocol.EgressReply) {
	st, err := OpenGated(ctx, gate, h)
	if errors.Is(err, protocol.ErrGateTimeout) {
		return nil, localFailure(protocol.EgressResourceExhausted, err.Error()+": close some connections first")
	}
	if err != nil {
		return nil, localFailure(protocol.EgressIO, "cannot reach the host broker: "+err.Error())
	}
	stop := context.AfterFunc(ctx, func() { st.Close() })
	defer stop()
	r, err := protocol.ReadEgressReply(st, protocol.EgressReplyTimeout)
	if err != nil {
		st.Close()
		if errors.Is(err, io.EOF) {
			return nil, localFailure(protocol.EgressIO, "the host closed the egress stream without answering (does this host serve egress?)")
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return nil, localFailure(protocol.EgressTimedOut, "the host broker did not answer within "+protocol.EgressReplyTimeout.String())
		}
		return nil, localFailure(protocol.EgressIO, "bad answer from the host broker: "+err.Error())
	}
	if !r.OK() {
		st.Close()
		return nil, r
	}
	return st, r
}

// Abort ends c for good: a stream opened through a StreamGate is aborted
// (the host closes what it carries at once); anything else is closed.
// Call it when the client side of a connection failed (killed, reset),
// not when it ended cleanly.
func Abort(c net.Conn) {
	if a, ok := c.(interface{ Abort() }); ok {
		a.Abort()
		return
	}
	_ = c.Close()
}

// OpenGated opens a stream through gate, waiting at most GateWait.
func OpenGated(ctx context.Context, gate *protocol.StreamGate, h protocol.StreamHeader) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, GateWait)
	defer cancel()
	return gate.Open(ctx, h)
}

// LocalFailure is a refusal the guest makes itself (the host could not be
// asked, or did not answer): what an Opener returns then.
func LocalFailure(code protocol.EgressCode, reason string) protocol.EgressReply {
	return localFailure(code, reason)
}

func localFailure(code protocol.EgressCode, reason string) protocol.EgressReply {
	effect := protocol.EffectNone
	if code == protocol.EgressTimedOut {
		effect = protocol.EffectPossible
	}
	return protocol.EgressReply{Code: code, Error: code.String(), Effect: effect, Reason: sanitize(reason)}
}

func sanitize(s string) string { return safetext.Clean(s, protocol.MaxEgressText-3, ' ') }

// Proxies are the running HTTP and SOCKS5 proxies of a guest.
type Proxies struct {
	HTTPAddr, SOCKSAddr string
	exit                *Exit
	log                 *slog.Logger
	lns                 []net.Listener
	ctx                 context.Context
	cancel              context.CancelFunc
	wg                  sync.WaitGroup
	mu                  sync.Mutex
	conns               map[net.Conn]struct{}
}

// ListenFunc listens like net.Listen (in the workload's network
// namespace: netns.NS.Listen).
type ListenFunc func(network, address string) (net.Listener, error)

// Start listens on httpAddr and socksAddr (loopback addresses; use
// HTTPAddr and SOCKSAddr) and serves until Close, carrying every
// connection out through open.
func Start(open Opener, httpAddr, socksAddr string, log *slog.Logger) (*Proxies, error) {
	return StartWith(net.Listen, NewExit(nil, Opens("open", open)), httpAddr, socksAddr, log)
}

// StartWith is Start with the listeners made by listen and every
// connection an Attempt of exit.
func StartWith(listen ListenFunc, exit *Exit, httpAddr, socksAddr string, log *slog.Logger) (*Proxies, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxies{exit: exit, log: log, ctx: ctx, cancel: cancel, conns: map[net.Conn]struct{}{}}
	hl, err := listen("tcp", httpAddr)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("egress: HTTP proxy: listen on %s: %w (is another process using the port?)", httpAddr, err)
	}
	sl, err := listen("tcp", socksAddr)
	if err != nil {
		hl.Close()
		cancel()
		return nil, fmt.Errorf("egress: SOCKS5 proxy: listen on %s: %w (is another process using the port?)", socksAddr, err)
	}
	p.lns = []net.Listener{hl, sl}
	p.HTTPAddr, p.SOCKSAddr = hl.Addr().String(), sl.Addr().String()
	p.wg.Add(2)
	go p.serve(hl, p.serveHTTP)
	go p.serve(sl, p.serveSOCKS)
	return p, nil
}

// Env returns the proxy environment variables, both cases, and where to
// ask about refusals (RefusalsEnv).
func (p *Proxies) Env() []string { return ProxyEnv(p.HTTPAddr, p.SOCKSAddr) }

// Close stops listening and closes every client connection.
func (p *Proxies) Close() error {
	p.cancel()
	for _, l := range p.lns {
		l.Close()
	}
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return nil
}

func (p *Proxies) serve(ln net.Listener, handle func(net.Conn)) {
	defer p.wg.Done()
	sem := make(chan struct{}, MaxConns)
	for {
		c, err := ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		select {
		case sem <- struct{}{}:
		default:
			p.log.Warn("egress proxy: too many client connections, closing one", "limit", MaxConns)
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer func() { <-sem }()
			defer func() {
				p.mu.Lock()
				delete(p.conns, c)
				p.mu.Unlock()
				c.Close()
			}()
			handle(c)
		}()
	}
}

// ProxyEnv returns HTTP_PROXY, HTTPS_PROXY, ALL_PROXY and NO_PROXY in
// upper and lower case, and OAC_EGRESS_REFUSALS (the URL of the refusal
// list, RefusalsPath on the HTTP proxy). ALL_PROXY uses socks5h: names go
// to the host unresolved (the guest has no resolver).
func ProxyEnv(httpAddr, socksAddr string) []string {
	h := "http://" + httpAddr
	var out []string
	for _, kv := range [][2]string{
		{"HTTP_PROXY", h}, {"HTTPS_PROXY", h}, {"ALL_PROXY", "socks5h://" + socksAddr},
		{"NO_PROXY", "localhost,127.0.0.1,::1"},
	} {
		out = append(out, kv[0]+"="+kv[1], strings.ToLower(kv[0])+"="+kv[1])
	}
	return append(out, RefusalsEnv+"="+h+RefusalsPath)
}

// WithProxyEnv adds vars (KEY=VALUE pairs from ProxyEnv) to env, except
// for a variable the environment already sets in either case: the
// bootstrap's choice wins.
func WithProxyEnv(env, vars []string) []string {
	set := map[string]bool{}
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		set[strings.ToUpper(k)] = true
	}
	out := append([]string(nil), env...)
	for _, kv := range vars {
		k, _, _ := strings.Cut(kv, "=")
		if !set[strings.ToUpper(k)] {
			out = append(out, kv)
		}
	}
	return out
}
