package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/oac/sandbox-agent/protocol"
)

// Failure is a refused or failed egress: a failure code of the fixed list
// (docs/contract.md, "Egress"), its effect, a reason in words and the rule that decided, if one did.
type Failure struct {
	Code   protocol.EgressCode
	Effect string
	Reason string
	Rule   string
}

func (f *Failure) Error() string {
	s := f.Code.String() + ": " + f.Reason
	if f.Rule != "" {
		s += " (rule " + f.Rule + ")"
	}
	return s
}

func fail(code protocol.EgressCode, rule, format string, args ...any) *Failure {
	return &Failure{Code: code, Effect: protocol.EffectNone, Rule: rule, Reason: fmt.Sprintf(format, args...)}
}

// plan is the outcome of the checks that need no resolution.
type plan struct {
	host   Host
	port   int
	target string // normalized host:port
	// upstream is set when a named upstream matched.
	upstream *Upstream
	// nameRule is the first name rule covering host and port, if any.
	nameRule *Rule
	// resolve: host is a name whose candidates come from the resolver.
	resolve bool
	// own knows the host's own addresses (nil: none).
	own HostAddrs
}

// plan runs the checks in the order of docs/contract.md up to resolution: the target
// must parse; a named upstream wins; then the port (a denied port resolves
// nothing); an IP literal is its own only candidate.
func (p *Policy) plan(rawHost string, port int, own HostAddrs) (plan, *Failure) {
	if port < 1 || port > 65535 {
		return plan{}, fail(protocol.EgressInvalidArgument, "", "port %d is not within 1..65535", port)
	}
	h, err := ParseHost(rawHost)
	if errors.Is(err, ErrZone) {
		return plan{}, fail(protocol.EgressDenied, "", "%s is an address with a zone: always refused", safeText(rawHost, 80))
	}
	if err != nil {
		return plan{}, fail(protocol.EgressInvalidArgument, "", "%q is not a valid host name or IP address", safeText(rawHost, 80))
	}
	pl := plan{host: h, port: port, target: JoinHostPort(h, port), own: own}
	if !h.IsIP() {
		if u, ok := p.upstreams[upKey{h.Name, port}]; ok {
			pl.upstream = &u
			return pl, nil
		}
	}
	anyPort, cidrPort := false, false
	var nameWrongPort *Rule
	for i := range p.rules {
		r := &p.rules[i]
		if r.hasPort(port) {
			anyPort = true
			if r.kind == ruleCIDR && !r.link {
				cidrPort = true
			}
		}
		if h.IsIP() && r.link && r.prefix.Contains(h.IP) && r.hasPort(port) {
			// The Link's address: allowed as its name would be, after
			// the same class checks.
			if pl.nameRule == nil {
				pl.nameRule = r
			}
			continue
		}
		if !h.IsIP() && r.matchesName(h.Name) {
			if r.hasPort(port) {
				if pl.nameRule == nil {
					pl.nameRule = r
				}
			} else if nameWrongPort == nil {
				nameWrongPort = r
			}
		}
	}
	// The port first: a target no rule could allow on this port is refused
	// before anything is resolved.
	if pl.nameRule == nil && !cidrPort {
		switch {
		case nameWrongPort != nil:
			return pl, fail(protocol.EgressDenied, nameWrongPort.String(), "port %d is not allowed for %s (its rule allows port %s); nothing was resolved",
				port, h, portText(nameWrongPort.lo, nameWrongPort.hi))
		case !anyPort:
			return pl, fail(protocol.EgressDenied, "", "port %d is not allowed by any rule; nothing was resolved%s", port, madeUpNote(h))
		case h.IsIP():
			if f := pl.refusal(h.IP, "", "", false); f != nil {
				return pl, f
			}
		}
		return pl, fail(protocol.EgressDenied, "", "no rule allows %s; nothing was resolved", pl.target)
	}
	pl.resolve = !h.IsIP()
	return pl, nil
}

// madeUpNote explains an IP literal from the range the guest's resolver
// makes addresses up from: the program connected to an address that no
// name holds in the guest (the guest sends a made-up address it can map
// back as its name).
func madeUpNote(h Host) string {
	if !h.IsIP() {
		return ""
	}
	for _, p := range []netip.Prefix{protocol.GuestAddrPrefix, protocol.GuestAddrPrefix6} {
		if p.Contains(h.IP) {
			return fmt.Sprintf(" (%s is one of the addresses the sandbox's resolver makes up for names, %s, and no name holds it now: resolve the name again)", h.IP, p)
		}
	}
	return ""
}

// refusal explains why a, a candidate for pl no CIDR rule allows, is
// refused (nil: it is not in a refused class). rule is the name rule that
// matched, if any.
// A CIDR rule covering a (wide) lifts its class, so the reason is then
// that a is the host's.
func (pl plan) refusal(a netip.Addr, rule, ruleName string, wide bool) *Failure {
	subject := a.String()
	if ruleName != "" {
		subject = fmt.Sprintf("%s resolves to %s, which", ruleName, a)
	}
	cls, bad := refusedClass(a)
	if bad && !wide {
		return fail(protocol.EgressDenied, rule, "%s is %s: refused unless a CIDR rule allows it%s", subject, cls, madeUpNote(Host{IP: a}))
	}
	if iface, own := pl.owner(a); own {
		return fail(protocol.EgressDenied, rule, "%s is an address of this host (%s): refused unless a named upstream or a CIDR rule naming exactly this address allows it", subject, iface)
	}
	if bad {
		return fail(protocol.EgressDenied, rule, "%s is %s: refused unless a CIDR rule allows it", subject, cls)
	}
	return nil
}

// owner reports whether a is an address of this host; a NAT64 address
// (64:ff9b::/96) is the host's when the IPv4 address it carries is (a
// NAT64 gateway would carry the connection back to the host).
func (pl plan) owner(a netip.Addr) (string, bool) {
	if pl.own == nil {
		return "", false
	}
	if iface, ok := pl.own.Owner(a); ok {
		return iface, true
	}
	if a.Is6() && nat64.Contains(a) {
		b := a.As16()
		return pl.own.Owner(netip.AddrFrom4([4]byte(b[12:])))
	}
	return "", false
}

// cidrAllows returns the first CIDR rule allowing a on port (any port when
// port is 0). A rule wider than one address does not open an address of
// this host: only a rule naming exactly that address does.
func (p *Policy) cidrAllows(a netip.Addr, port int, own bool) *Rule {
	for i := range p.rules {
		r := &p.rules[i]
		if r.kind == ruleCIDR && !r.link && (port == 0 || r.hasPort(port)) && r.prefix.Contains(a) && (!own || r.prefix.IsSingleIP()) {
			return r
		}
	}
	return nil
}

// check decides one candidate address for pl: always-refused addresses
// first, then CIDR rules (which may allow a refused class explicitly, and
// an address of this host only by naming it), then the name rule, which
// never allows a refused class or an address of this host.
func (p *Policy) check(pl plan, a netip.Addr) (rule string, f *Failure) {
	a = a.Unmap()
	if why, bad := alwaysRefused(a); bad {
		return "", fail(protocol.EgressDenied, "", "%s is %s: always refused", a, why)
	}
	_, own := pl.owner(a)
	if r := p.cidrAllows(a, pl.port, own); r != nil {
		return r.String(), nil
	}
	wide := own && p.cidrAllows(a, pl.port, false) != nil
	switch {
	case pl.nameRule != nil:
		if f := pl.refusal(a, pl.nameRule.String(), pl.host.String(), wide); f != nil {
			return "", f
		}
		return pl.nameRule.String(), nil
	default:
		if f := pl.refusal(a, "", "", wide); f != nil {
			return "", f
		}
	}
	if pl.host.IsIP() {
		return "", fail(protocol.EgressDenied, "", "no rule allows %s", pl.target)
	}
	return "", fail(protocol.EgressDenied, "", "no rule allows %s (it resolves to %s)", pl.target, a)
}

// pick returns the first permitted candidate, IPv4 before IPv6 (a host
// without IPv6 egress must not dial an AAAA answer first), or the denial.
func (p *Policy) pick(pl plan, addrs []netip.Addr) (netip.Addr, string, *Failure) {
	cands := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		a = a.Unmap()
		if !slices.Contains(cands, a) {
			cands = append(cands, a)
		}
	}
	slices.SortStableFunc(cands, func(x, y netip.Addr) int {
		switch {
		case x.Is4() && !y.Is4():
			return -1
		case !x.Is4() && y.Is4():
			return 1
		}
		return 0
	})
	var first *Failure
	var refused []string
	for _, a := range cands {
		rule, f := p.check(pl, a)
		if f == nil {
			return a, rule, nil
		}
		if first == nil {
			first = f
		}
		refused = append(refused, a.String())
	}
	if first == nil {
		return netip.Addr{}, "", fail(protocol.EgressNameNotResolved, "", "%s has no addresses", pl.host)
	}
	if len(refused) > 1 {
		if len(refused) > 4 {
			refused = append(refused[:4], "...")
		}
		first.Reason += "; every address was refused (" + strings.Join(refused, ", ") + ")"
	}
	return netip.Addr{}, "", first
}

// Decision is the outcome of Decide, for callers that check without
// dialing (tests, a future control API's "would this be allowed").
type Decision struct {
	Target  string
	Rule    string
	Address string // the address that would be dialed
	Failure *Failure
	Lookups int // names resolved to decide
}

// Decide checks host:port against p, resolving names with lookup when the
// port and rules make that necessary; this host's own addresses are
// SystemHostAddrs. It dials nothing.
func (p *Policy) Decide(host string, port int, lookup func(name string) ([]netip.Addr, error)) Decision {
	return p.DecideOn(SystemHostAddrs(), host, port, lookup)
}

// DecideOn is Decide with the host's own addresses given (nil: none).
func (p *Policy) DecideOn(own HostAddrs, host string, port int, lookup func(name string) ([]netip.Addr, error)) Decision {
	pl, f := p.plan(host, port, own)
	d := Decision{Target: pl.target, Failure: f}
	if f != nil {
		return d
	}
	if pl.upstream != nil {
		d.Rule, d.Address = "upstream "+pl.upstream.String(), pl.upstream.Address
		return d
	}
	addrs := []netip.Addr{pl.host.IP}
	if pl.resolve {
		d.Lookups++
		var err error
		if addrs, err = lookup(pl.host.Name); err != nil {
			d.Failure = resolveFailure(pl.host.Name, err)
			return d
		}
	}
	a, rule, f := p.pick(pl, addrs)
	d.Rule, d.Failure = rule, f
	if f == nil {
		d.Address = netip.AddrPortFrom(a, uint16(port)).String()
	} else if d.Rule == "" {
		d.Rule = f.Rule
	}
	return d
}

func itoa(n int) string { return strconv.Itoa(n) }
