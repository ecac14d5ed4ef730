package egress

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/internal/pipe"
	"github.com/oac/sandbox-agent/protocol"
)

// Defaults for Config.
const (
	DefaultMaxStreams     = 256
	DefaultConnectTimeout = 10 * time.Second
	DefaultIdleTimeout    = 10 * time.Minute
)

// Event decisions.
const (
	DecisionAllowed = "allowed"
	DecisionDenied  = "denied"
	DecisionFailed  = "failed"
)

// Resolver resolves names on the host; *net.Resolver implements it.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Config configures a Broker.
type Config struct {
	// Policy is the initial policy; nil denies everything.
	Policy *Policy
	// MaxStreams bounds concurrent egress streams (default 256); the one
	// over the limit is answered ResourceExhausted.
	MaxStreams int
	// ConnectTimeout bounds resolution plus dial (default 10s): TimedOut.
	ConnectTimeout time.Duration
	// IdleTimeout closes a connection no byte crossed for that long
	// (default 10m); its close event says TimedOut.
	IdleTimeout time.Duration
	// Resolver defaults to net.DefaultResolver.
	Resolver Resolver
	// HostAddrs are this host's own addresses, refused unless a named
	// upstream or a CIDR rule naming the address allows them; default
	// SystemHostAddrs.
	HostAddrs HostAddrs
	// Log receives the broker's own diagnostics (never payloads).
	Log *slog.Logger
}

// Broker answers the egress streams of one sandbox.
type Broker struct {
	cfg    Config
	own    HostAddrs
	policy atomic.Pointer[Policy]
	// mu orders policy replacements with the Link's rule, which every
	// policy keeps (AllowLink).
	mu     sync.Mutex
	link   *Rule
	sem    chan struct{}
	nextID atomic.Uint64
	// dialHook, when set (tests), replaces the Control hook's final check.
	dialed func(network, address string)
}

// New returns a broker; zero fields of cfg get their defaults.
func New(cfg Config) *Broker {
	if cfg.MaxStreams <= 0 {
		cfg.MaxStreams = DefaultMaxStreams
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = DefaultConnectTimeout
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.Resolver == nil {
		cfg.Resolver = net.DefaultResolver
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.HostAddrs == nil {
		cfg.HostAddrs = SystemHostAddrs()
	}
	b := &Broker{cfg: cfg, own: cfg.HostAddrs, sem: make(chan struct{}, cfg.MaxStreams)}
	p := cfg.Policy
	if p == nil {
		p = &Policy{}
	}
	b.policy.Store(p)
	return b
}

// SetPolicy replaces the policy atomically: connected streams keep
// running, every decision after the call uses p. nil denies everything.
// The Link's rule (AllowLink) stays.
func (b *Broker) SetPolicy(p *Policy) {
	if p == nil {
		p = &Policy{}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.link != nil {
		p = p.WithLink(*b.link)
	}
	b.policy.Store(p)
}

// AllowLink allows exactly the host and port of the bootstrap's Link URL,
// the one destination oac-sandbox-io must reach, under every policy from
// now on (replacing an earlier Link), and returns the rule as the policy
// describes it. It refuses (ErrLinkNotAllowed, saying why) an address
// literal no name rule could allow: a refused class, or an address of
// this host.
func (b *Broker) AllowLink(linkURL string) (string, error) {
	r, err := LinkRule(linkURL)
	if err != nil {
		return "", err
	}
	if r.kind == ruleCIDR {
		if iface, own := b.own.Owner(r.prefix.Addr()); own {
			return "", fmt.Errorf("%w: %s is an address of this host (%s); a CIDR rule naming exactly it allows it", ErrLinkNotAllowed, r.prefix.Addr(), iface)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.link = &r
	b.policy.Store(b.policy.Load().WithLink(r))
	return r.String(), nil
}

// PolicyEvent describes the current policy as an egress_policy event.
func (b *Broker) PolicyEvent(msg string) api.Event {
	p := b.policy.Load()
	n, u := p.Len()
	rules := p.Describe()
	if rules == nil {
		rules = []string{}
	}
	return api.Event{Event: api.KindEgressPolicy, Rules: rules,
		Message: fmt.Sprintf("%s: deny by default; %d rules, %d upstreams", msg, n, u)}
}

// Policy returns the current policy.
func (b *Broker) Policy() *Policy { return b.policy.Load() }

// MaxStreams returns the limit of concurrent egress streams.
func (b *Broker) MaxStreams() int { return b.cfg.MaxStreams }

// Active returns the number of egress streams being served.
func (b *Broker) Active() int { return len(b.sem) }

// Serve answers one egress stream whose header h has been read (and may be
// invalid: Serve re-validates it), then carries its bytes until either side
// ends. It owns st and closes it. emit receives one decision event and,
// for an allowed stream, one close event; Serve fills in the event kind
// and egress fields, the caller's emit adds time and sandbox.
func (b *Broker) Serve(ctx context.Context, st net.Conn, h protocol.StreamHeader, emit func(api.Event)) {
	defer st.Close()
	a := b.Open(ctx, h, emit)
	defer a.Close()
	_ = st.SetWriteDeadline(time.Now().Add(5 * time.Second))
	err := protocol.WriteEgressReply(st, a.Reply())
	_ = st.SetWriteDeadline(time.Time{})
	if !a.Answered(err) {
		return
	}
	guest := &abortable{Conn: st}
	a.Carry(guest, guest.abort, nil)
}

// ErrGuestAborted is the cause of an egress connection whose guest side
// went away for good (the workload's client was killed or reset it): the
// close event gives it as the reason.
var ErrGuestAborted = errors.New("the guest aborted the connection (its client went away)")

// Attempt is one egress connection the broker decided: the same decision,
// events and limits whichever carrier brings the guest's side (an egress
// stream of the session, or the data plane). The carrier sends Reply to
// the guest, reports with Answered whether it arrived, and, when the
// attempt is OK, hands the guest's side to Carry. Close releases whatever
// was not carried.
type Attempt struct {
	b       *Broker
	ctx     context.Context
	emit    func(api.Event)
	id      uint64
	start   time.Time
	ev      api.Event
	fail    *Failure
	up      net.Conn
	rule    string
	release func()
	early   int64
	direct  bool
	addr    string // the upstream's address, once connected
}

// Open decides h (re-validated: it may come straight from the guest), takes
// one of the broker's stream slots and dials the upstream. It emits
// nothing: Answered emits the decision once the guest has the answer.
func (b *Broker) Open(ctx context.Context, h protocol.StreamHeader, emit func(api.Event)) *Attempt {
	return b.open(ctx, h, emit, nil)
}

// Lock prepares the upstream socket of a direct attempt before it
// connects (its remote address is final by then): direct mode's host
// binds it and locks it to that peer (package host/dataplane).
type Lock func(network string, remote netip.AddrPort, c syscall.RawConn) error

// OpenDirect is Open for a direct attempt: the same decision, slot and
// dial, with lock run on the upstream socket before it connects. Give
// then hands the connected upstream to the caller.
func (b *Broker) OpenDirect(ctx context.Context, h protocol.StreamHeader, emit func(api.Event), lock Lock) *Attempt {
	return b.open(ctx, h, emit, lock)
}

func (b *Broker) open(ctx context.Context, h protocol.StreamHeader, emit func(api.Event), lock Lock) *Attempt {
	a := &Attempt{b: b, ctx: ctx, emit: emit, id: b.nextID.Add(1), start: time.Now(), release: func() {}}
	// Via is the guest's word: it goes into the event once the header
	// is valid (an unknown via is refused, and not echoed).
	a.ev = api.Event{Event: api.KindEgress, Conn: a.id, Target: safeText(joinRaw(h.Host, h.Port), 300)}
	if h.Kind != protocol.KindEgress {
		a.fail = fail(protocol.EgressInvalidArgument, "", "stream is not an egress stream")
		return a
	}
	if err := h.Validate(); err != nil {
		a.fail = fail(protocol.EgressInvalidArgument, "", "invalid egress header: %s", safeText(err.Error(), 200))
		return a
	}
	a.ev.Via, a.ev.SourcePort = h.Via, h.SrcPort
	select {
	case b.sem <- struct{}{}:
		a.release = sync.OnceFunc(func() { <-b.sem })
	default:
		a.fail = fail(protocol.EgressResourceExhausted, "", "limit of %d concurrent egress connections reached: close some connections first", b.cfg.MaxStreams)
		return a
	}
	dctx, cancel := context.WithTimeout(ctx, b.cfg.ConnectTimeout)
	up, target, rule, f := b.connect(dctx, h.Host, h.Port, lock)
	cancel()
	if target != "" {
		a.ev.Target = target
	}
	if f != nil {
		a.fail = f
		a.release()
		return a
	}
	a.up, a.rule, a.direct, a.addr = up, rule, lock != nil, up.RemoteAddr().String()
	return a
}

// OK reports whether the upstream is connected and waits for the guest.
func (a *Attempt) OK() bool { return a.fail == nil }

// Reply is the answer for the guest.
func (a *Attempt) Reply() protocol.EgressReply {
	if f := a.fail; f != nil {
		return protocol.EgressReply{Code: f.Code, Effect: f.Effect, Reason: f.Reason, Rule: f.Rule}
	}
	return protocol.EgressReply{Code: protocol.EgressOK, Rule: a.rule}
}

// Fail turns an OK attempt into a failure the carrier met before
// answering (it could not make the guest's side): the upstream is closed.
func (a *Attempt) Fail(code protocol.EgressCode, reason string) {
	if a.fail != nil {
		return
	}
	a.fail = fail(code, a.rule, "%s", reason)
	a.fail.Effect = protocol.EffectPossible // the upstream saw a connect
	if a.up != nil {
		a.up.Close()
		a.up = nil
	}
	a.release()
}

// Answered emits the decision event now that the guest has the answer (or
// could not be given it: werr), and reports whether bytes may flow.
func (a *Attempt) Answered(werr error) bool {
	ev := a.ev
	if f := a.fail; f != nil {
		ev.Decision = DecisionFailed
		if f.Code == protocol.EgressDenied {
			ev.Decision = DecisionDenied
		}
		ev.Code, ev.Effect, ev.Reason, ev.Rule = f.Code.String(), f.Effect, f.Reason, f.Rule
		ev.Message = "egress " + ev.Decision
		a.emit(ev)
		return false
	}
	ev.Decision, ev.Rule, ev.Address, ev.Message = DecisionAllowed, a.rule, a.addr, "egress allowed"
	if a.direct {
		ev.Message = "egress allowed, direct: the workload holds the host's socket, locked to this upstream (no egress_closed follows)"
	}
	if werr != nil {
		ev.Decision, ev.Code, ev.Effect, ev.Reason = DecisionFailed, protocol.EgressIO.String(), protocol.EffectNone, "the guest went away before the answer"
		if a.early > 0 {
			// What the client sent ahead went upstream before the answer.
			ev.Effect = protocol.EffectPossible
		}
		a.emit(ev)
		a.Close()
		return false
	}
	a.ev = ev
	a.emit(ev)
	return true
}

// SendUpstream writes b to the upstream of an OK attempt before Carry
// (what the guest's client sent before the answer, on a carrier that
// hands the client's own socket over), within the write timeout of an
// answer; the bytes count in the close event.
func (a *Attempt) SendUpstream(b []byte) error {
	if a.up == nil || len(b) == 0 {
		return nil
	}
	_ = a.up.SetWriteDeadline(time.Now().Add(5 * time.Second))
	n, err := a.up.Write(b)
	_ = a.up.SetWriteDeadline(time.Time{})
	a.early += int64(n)
	return err
}

// Carry joins the guest's side to the upstream until both directions end
// (or the idle timeout, or the sandbox stopping, ends them), emits the
// close event and releases the slot. abort ends the guest's side for good
// (a yamux stream's Close is only a half-close). gone, when not nil, is
// asked when the connection failed, before either side is closed: it
// reports whether the guest's side went away while the upstream was still
// there (ErrGuestAborted), which a carrier without an abort message learns
// from its sockets.
func (a *Attempt) Carry(guest net.Conn, abort func(), gone func(guest, up net.Conn) bool) {
	defer a.Close()
	up := a.up
	var act pipe.Activity
	act.Touch()
	var idled atomic.Bool
	stopIdle := a.b.watchIdle(&act, func() {
		idled.Store(true)
		abort()
		up.Close()
	})
	// The sandbox stopping ends the connection at once, both sides.
	stopOnCancel := context.AfterFunc(a.ctx, func() {
		abort()
		up.Close()
	})
	var guestGone atomic.Bool
	out, in, err := pipe.JoinThen(guest, up, &act, func(error) {
		if gone != nil && gone(guest, up) {
			guestGone.Store(true)
		}
	})
	stopOnCancel()
	stopIdle()
	out += a.early
	ev, ctx := a.ev, a.ctx
	closed := api.Event{Event: api.KindEgressClosed, Conn: a.id, SourcePort: ev.SourcePort, Via: ev.Via, Target: ev.Target, Rule: a.rule, Address: ev.Address,
		BytesOut: &out, BytesIn: &in, DurationMS: ptr(time.Since(a.start).Milliseconds()), Message: "egress closed"}
	switch {
	case idled.Load():
		closed.Code, closed.Effect, closed.Reason = protocol.EgressTimedOut.String(), protocol.EffectPossible,
			fmt.Sprintf("no byte crossed for %s (idle timeout)", a.b.cfg.IdleTimeout)
	case guestGone.Load():
		closed.Code, closed.Effect, closed.Reason = protocol.EgressCancelled.String(), protocol.EffectPossible, ErrGuestAborted.Error()
	case ctx.Err() != nil:
		closed.Code, closed.Effect, closed.Reason = protocol.EgressCancelled.String(), protocol.EffectPossible, "the sandbox is stopping"
		if c := context.Cause(ctx); c != nil && !errors.Is(c, context.Canceled) {
			closed.Reason = safeText(c.Error(), 200)
		}
	case err != nil:
		closed.Code, closed.Effect, closed.Reason = protocol.EgressIO.String(), protocol.EffectPossible, safeText(err.Error(), 200)
	}
	a.emit(closed)
}

// Give hands the connected upstream of an answered direct attempt to the
// caller, who passes it on and closes its copy: the broker keeps nothing
// of it and releases the slot (the workload's descriptor table bounds
// these connections, not the host's). It returns nil for any other
// attempt.
func (a *Attempt) Give() net.Conn {
	if !a.direct || a.up == nil {
		return nil
	}
	up := a.up
	a.up = nil
	a.release()
	return up
}

// Close releases the slot and closes an upstream nothing carried; safe to
// call more than once.
func (a *Attempt) Close() {
	if a.up != nil {
		a.up.Close()
	}
	a.release()
}

func ptr[T any](v T) *T { return &v }

// abortable is the guest's side of a connection the broker may end on its
// own (idle timeout). Closing a yamux stream only half-closes it: a read
// still waits for the guest's FIN, which a hostile or wedged guest never
// sends, so the connection would linger until the session's
// StreamCloseTimeout. abort closes the stream and fails every read from
// then on, now and after any read deadline the copy loop sets.
type abortable struct {
	net.Conn
	aborted atomic.Bool
}

func (c *abortable) abort() {
	c.aborted.Store(true)
	_ = c.Conn.Close()
	_ = c.Conn.SetReadDeadline(time.Now())
}

func (c *abortable) Read(b []byte) (int, error) {
	if c.aborted.Load() {
		return 0, net.ErrClosed
	}
	n, err := c.Conn.Read(b)
	if err != nil && c.aborted.Load() {
		return n, net.ErrClosed
	}
	return n, err
}

func (c *abortable) SetReadDeadline(t time.Time) error {
	if c.aborted.Load() {
		t = time.Now()
	}
	return c.Conn.SetReadDeadline(t)
}

// Shrink passes the copy loop's "idle" on to the stream (a guarded
// session's stream then frees its receive buffer and gives back the slot
// that kept it, see muxguard.Conn.Track); the embedded interface would
// hide it.
func (c *abortable) Shrink() {
	if s, ok := c.Conn.(interface{ Shrink() }); ok {
		s.Shrink()
	}
}

// joinRaw formats an unvalidated host and port for an event.
func joinRaw(host string, port int) string {
	return net.JoinHostPort(host, itoa(port))
}

// watchIdle calls onIdle once when act has been idle for the idle timeout;
// the returned func stops watching.
func (b *Broker) watchIdle(act *pipe.Activity, onIdle func()) func() {
	var mu sync.Mutex
	stopped := false
	var t *time.Timer
	var check func()
	check = func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		if idle := act.Idle(); idle < b.cfg.IdleTimeout {
			t.Reset(b.cfg.IdleTimeout - idle)
			return
		}
		stopped = true
		go onIdle()
	}
	mu.Lock()
	t = time.AfterFunc(b.cfg.IdleTimeout, check)
	mu.Unlock()
	return func() {
		mu.Lock()
		stopped = true
		t.Stop()
		mu.Unlock()
	}
}

// connect decides and dials. It returns the normalized target, the rule
// that allowed it, and the connection or the failure.
func (b *Broker) connect(ctx context.Context, host string, port int, lock Lock) (net.Conn, string, string, *Failure) {
	pol := b.policy.Load()
	pl, f := pol.plan(host, port, b.own)
	if f != nil {
		return nil, pl.target, f.Rule, f
	}
	if u := pl.upstream; u != nil {
		rule := "upstream " + u.String()
		c, f := b.dialUpstream(ctx, u, lock)
		if f != nil {
			f.Rule = rule
			return nil, pl.target, rule, f
		}
		return c, pl.target, rule, nil
	}
	addrs := []netip.Addr{pl.host.IP}
	if pl.resolve {
		var err error
		addrs, err = b.cfg.Resolver.LookupNetIP(ctx, "ip", pl.host.Name)
		if err != nil {
			f := resolveFailure(pl.host.Name, err)
			if pl.nameRule != nil {
				f.Rule = pl.nameRule.String()
			}
			return nil, pl.target, f.Rule, f
		}
	}
	a, rule, f := pol.pick(pl, addrs)
	if f != nil {
		return nil, pl.target, f.Rule, f
	}
	c, f := b.dialChecked(ctx, netip.AddrPortFrom(a, uint16(port)), func() *Failure {
		_, f := pol.check(pl, a)
		return f
	}, lock)
	if f != nil {
		f.Rule = rule
		return nil, pl.target, rule, f
	}
	return c, pl.target, rule, nil
}

// dialChecked dials exactly ap: an IP literal, so nothing is resolved, and
// the Control hook refuses any socket whose address is not ap (no second
// resolution, no rebinding window, no surprise from a future dialer). The
// hook also runs recheck, the policy's check of ap, once more: an address
// that became one of this host's since it was checked is refused at the
// moment of the dial.
func (b *Broker) dialChecked(ctx context.Context, ap netip.AddrPort, recheck func() *Failure, lock Lock) (net.Conn, *Failure) {
	d := net.Dialer{Control: func(network, address string, rc syscall.RawConn) error {
		if b.dialed != nil {
			b.dialed(network, address)
		}
		got, err := netip.ParseAddrPort(address)
		if err != nil || got.Addr().Unmap() != ap.Addr() || got.Port() != ap.Port() {
			return fmt.Errorf("dial of %s refused: only the checked address %s may be dialed", address, ap)
		}
		if f := recheck(); f != nil {
			return f
		}
		if lock != nil {
			return lockFailure(lock(network, ap, rc))
		}
		return nil
	}}
	c, err := d.DialContext(ctx, "tcp", ap.String())
	if err != nil {
		var f *Failure
		if errors.As(err, &f) {
			return nil, f
		}
		return nil, dialFailure(ctx, ap.String(), err)
	}
	return c, nil
}

// dialUpstream dials a configured upstream: trusted, so its address may be
// loopback or private and a name in it is resolved normally.
func (b *Broker) dialUpstream(ctx context.Context, u *Upstream, lock Lock) (net.Conn, *Failure) {
	var d net.Dialer
	if lock != nil {
		d.Control = func(network, address string, rc syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return err
			}
			return lockFailure(lock(network, netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), rc))
		}
	}
	c, err := d.DialContext(ctx, "tcp", u.Address)
	if err != nil {
		var f *Failure
		if errors.As(err, &f) {
			return nil, f
		}
		var de *net.DNSError
		if errors.As(err, &de) {
			return nil, resolveFailure(u.Address, err)
		}
		return nil, dialFailure(ctx, u.Address, err)
	}
	return c, nil
}

// lockFailure is a direct attempt whose socket could not be locked: the
// host's fault, never a reason to connect unlocked.
func lockFailure(err error) error {
	if err == nil {
		return nil
	}
	return fail(protocol.EgressResourceExhausted, "", "the host could not lock the direct connection's socket: %s", safeText(err.Error(), 200))
}

func resolveFailure(name string, err error) *Failure {
	var de *net.DNSError
	switch {
	case errors.As(err, &de) && de.IsNotFound:
		return fail(protocol.EgressNameNotResolved, "", "%s does not resolve on the host", name)
	case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &de) && de.IsTimeout:
		return fail(protocol.EgressNameResolutionFailed, "", "resolving %s on the host timed out", name)
	case errors.Is(err, context.Canceled):
		return fail(protocol.EgressCancelled, "", "cancelled while resolving %s", name)
	}
	return fail(protocol.EgressNameResolutionFailed, "", "resolving %s on the host failed: %s", name, safeText(errText(err), 160))
}

func errText(err error) string {
	var de *net.DNSError
	if errors.As(err, &de) {
		return de.Err
	}
	return err.Error()
}

func dialFailure(ctx context.Context, addr string, err error) *Failure {
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return fail(protocol.EgressConnectionRefused, "", "%s refused the connection", addr)
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		// A connect that binds no port itself: no local port is free
		// (for a direct connection, the sandbox's share of them).
		return fail(protocol.EgressResourceExhausted, "", "the host has no free local port to reach %s: close some connections (a closed one may hold its port for a minute)", addr)
	case errors.Is(err, syscall.ENETUNREACH), errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.EAFNOSUPPORT):
		return fail(protocol.EgressUnreachable, "", "%s is unreachable from the host", addr)
	case errors.Is(err, syscall.EMFILE), errors.Is(err, syscall.ENFILE), errors.Is(err, syscall.ENOBUFS):
		return fail(protocol.EgressResourceExhausted, "", "the host is out of sockets dialing %s", addr)
	case ctx.Err() == context.DeadlineExceeded || isTimeout(err):
		f := fail(protocol.EgressTimedOut, "", "connecting to %s timed out", addr)
		f.Effect = protocol.EffectPossible
		return f
	case errors.Is(err, context.Canceled):
		f := fail(protocol.EgressCancelled, "", "cancelled while connecting to %s", addr)
		f.Effect = protocol.EffectPossible
		return f
	}
	f := fail(protocol.EgressIO, "", "connecting to %s failed: %s", addr, safeText(err.Error(), 160))
	f.Effect = protocol.EffectPossible
	return f
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
