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
}

// plan runs the checks in the order of docs/contract.md up to resolution: the target
// must parse; a named upstream wins; then the port (a denied port resolves
// nothing); an IP literal is its own only candidate.
func (p *Policy) plan(rawHost string, port int) (plan, *Failure) {
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
	pl := plan{host: h, port: port, target: JoinHostPort(h, port)}
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
			if r.kind == ruleCIDR {
				cidrPort = true
			}
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
			return pl, fail(protocol.EgressDenied, "", "port %d is not allowed by any rule; nothing was resolved", port)
		case h.IsIP():
			if cls, bad := refusedClass(h.IP); bad {
				return pl, fail(protocol.EgressDenied, "", "%s is %s: refused unless a CIDR rule allows it", h.IP, cls)
			}
		}
		return pl, fail(protocol.EgressDenied, "", "no rule allows %s; nothing was resolved", pl.target)
	}
	pl.resolve = !h.IsIP()
	return pl, nil
}

// check decides one candidate address for pl: always-refused addresses
// first, then CIDR rules (which may allow a refused class explicitly),
// then the name rule, which never allows a refused class.
func (p *Policy) check(pl plan, a netip.Addr) (rule string, f *Failure) {
	a = a.Unmap()
	if why, bad := alwaysRefused(a); bad {
		return "", fail(protocol.EgressDenied, "", "%s is %s: always refused", a, why)
	}
	for i := range p.rules {
		r := &p.rules[i]
		if r.kind == ruleCIDR && r.hasPort(pl.port) && r.prefix.Contains(a) {
			return r.String(), nil
		}
	}
	cls, refused := refusedClass(a)
	switch {
	case pl.nameRule != nil && refused:
		return "", fail(protocol.EgressDenied, pl.nameRule.String(),
			"%s resolves to %s, which is %s: refused unless a CIDR rule allows it", pl.host, a, cls)
	case pl.nameRule != nil:
		return pl.nameRule.String(), nil
	case refused:
		return "", fail(protocol.EgressDenied, "", "%s is %s: refused unless a CIDR rule allows it", a, cls)
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
// port and rules make that necessary. It dials nothing.
func (p *Policy) Decide(host string, port int, lookup func(name string) ([]netip.Addr, error)) Decision {
	pl, f := p.plan(host, port)
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
