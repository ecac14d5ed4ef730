package egress

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/protocol"
)

// namePlan is the outcome of the checks on a name asked on a dns stream
// that need no resolution.
type namePlan struct {
	host Host
	// upstream is the first named upstream with this name (any port).
	upstream *Upstream
	// nameRule is the first name rule covering the name (any port).
	nameRule *Rule
}

// planName decides what a DNS question for rawName needs, without
// resolving: an upstream name is allowed at once; a name no name rule
// covers is denied and never resolved, even when CIDR rules exist (they
// allow addresses, which a program can connect to without DNS; resolving
// every name the guest asks for would let it send any name to the host's
// resolvers). DNS has no port: a name rule for any port covers the name.
func (p *Policy) planName(rawName string) (namePlan, *Failure) {
	h, err := ParseHost(rawName)
	if errors.Is(err, ErrZone) || err == nil && h.IsIP() {
		return namePlan{}, fail(protocol.EgressInvalidArgument, "", "%s is an address, not a name: nothing to resolve", safeText(rawName, 80))
	}
	if err != nil {
		return namePlan{}, fail(protocol.EgressInvalidArgument, "", "%q is not a valid host name", safeText(rawName, 80))
	}
	pl := namePlan{host: h}
	ports := make([]int, 0, len(p.upstreams))
	for k := range p.upstreams {
		if k.name == h.Name {
			ports = append(ports, k.port)
		}
	}
	if len(ports) > 0 {
		slices.Sort(ports)
		u := p.upstreams[upKey{h.Name, ports[0]}]
		pl.upstream = &u
		return pl, nil
	}
	for i := range p.rules {
		if r := &p.rules[i]; r.kind != ruleCIDR && r.matchesName(h.Name) {
			pl.nameRule = r
			break
		}
	}
	if pl.nameRule == nil {
		return pl, fail(protocol.EgressDenied, "", "no rule allows %s on any port; nothing was resolved", h.Name)
	}
	return pl, nil
}

// checkName decides the resolved candidates of a name its name rule
// covers: allowed when at least one address would be allowed on some
// port (a CIDR rule covers it, or it is in no refused class and is not an
// address of this host). Which port and which address is decided again
// at connect time.
func (p *Policy) checkName(pl namePlan, addrs []netip.Addr, own HostAddrs) (string, *Failure) {
	if len(addrs) == 0 {
		return "", fail(protocol.EgressNameNotResolved, "", "%s has no addresses", pl.host)
	}
	cp := plan{host: pl.host, own: own}
	var first *Failure
	for _, a := range addrs {
		a = a.Unmap()
		if why, bad := alwaysRefused(a); bad {
			if first == nil {
				first = fail(protocol.EgressDenied, "", "%s resolves to %s, which is %s: always refused", pl.host, a, why)
			}
			continue
		}
		_, isOwn := cp.owner(a)
		if r := p.cidrAllows(a, 0, isOwn); r != nil {
			return r.String(), nil
		}
		f := cp.refusal(a, pl.nameRule.String(), pl.host.String(), isOwn && p.cidrAllows(a, 0, false) != nil)
		if f == nil {
			return pl.nameRule.String(), nil
		}
		if first == nil {
			first = f
		}
	}
	return "", first
}

// DecideName checks whether name may be resolved in the guest, resolving
// it with lookup only when a rule could allow it; own are this host's
// addresses (nil: none). It dials nothing.
func (p *Policy) DecideName(own HostAddrs, name string, lookup func(name string) ([]netip.Addr, error)) Decision {
	pl, f := p.planName(name)
	d := Decision{Target: pl.host.String(), Failure: f}
	if f != nil {
		d.Rule = f.Rule
		return d
	}
	if pl.upstream != nil {
		d.Rule = "upstream " + pl.upstream.String()
		return d
	}
	d.Lookups++
	addrs, err := lookup(pl.host.Name)
	if err != nil {
		d.Failure = resolveFailure(pl.host.Name, err)
		return d
	}
	d.Rule, d.Failure = p.checkName(pl, addrs, own)
	if d.Failure != nil && d.Rule == "" {
		d.Rule = d.Failure.Rule
	}
	return d
}

// ServeDNS answers one dns stream whose header h has been read: may the
// name in it be resolved in the guest? A name no rule could allow is
// denied without any resolution on the host, so a denied name never
// becomes a DNS packet the host sends; an allowed one is resolved (within
// the connect timeout) so a name that does not exist is NameNotResolved
// and a name whose every address is refused is denied. It owns st and
// closes it; emit gets one egress event (via "dns", the name as target).
func (b *Broker) ServeDNS(ctx context.Context, st net.Conn, h protocol.StreamHeader, emit func(api.Event)) {
	defer st.Close()
	id := b.nextID.Add(1)
	ev := api.Event{Event: api.KindEgress, Conn: id, Via: protocol.ViaDNS, Target: safeText(h.Host, 300)}
	answer := func(rule string, f *Failure) {
		r := protocol.DNSReply{Rule: rule}
		ev.Decision, ev.Rule, ev.Message = DecisionAllowed, rule, "dns allowed"
		if f != nil {
			r = protocol.DNSReply{Code: f.Code, Effect: f.Effect, Reason: f.Reason, Rule: f.Rule}
			ev.Decision = DecisionFailed
			if f.Code == protocol.EgressDenied {
				ev.Decision = DecisionDenied
			}
			ev.Code, ev.Effect, ev.Reason, ev.Rule = f.Code.String(), f.Effect, f.Reason, f.Rule
			ev.Message = "dns " + ev.Decision
		}
		_ = st.SetWriteDeadline(time.Now().Add(5 * time.Second))
		_ = protocol.WriteDNSReply(st, r)
		emit(ev)
	}
	if h.Kind != protocol.KindDNS {
		answer("", fail(protocol.EgressInvalidArgument, "", "stream is not a dns stream"))
		return
	}
	if err := h.Validate(); err != nil {
		answer("", fail(protocol.EgressInvalidArgument, "", "invalid dns header: %s", safeText(err.Error(), 200)))
		return
	}
	select {
	case b.sem <- struct{}{}:
		defer func() { <-b.sem }()
	default:
		answer("", fail(protocol.EgressResourceExhausted, "", "limit of %d concurrent egress connections reached: close some connections first", b.cfg.MaxStreams))
		return
	}
	pol := b.policy.Load()
	dctx, cancel := context.WithTimeout(ctx, b.cfg.ConnectTimeout)
	defer cancel()
	d := pol.DecideName(b.own, h.Host, func(name string) ([]netip.Addr, error) {
		return b.cfg.Resolver.LookupNetIP(dctx, "ip", name)
	})
	if d.Target != "" {
		ev.Target = d.Target
	}
	answer(d.Rule, d.Failure)
}
