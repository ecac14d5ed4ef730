package transparent

import (
	"context"
	"encoding/binary"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/sync/singleflight"

	"github.com/oac/sandbox-agent/protocol"
)

// Asker asks the host whether a name may be resolved in the guest.
type Asker func(ctx context.Context, name string) protocol.DNSReply

// DNS limits and lifetimes.
const (
	// MaxDNSMessage bounds a query read over UDP or TCP.
	MaxDNSMessage = 4096
	// AllowedTTL is the TTL of an answer with a fake address and how long
	// the host's yes is remembered; DeniedTTL how long a no is.
	AllowedTTL = 30 * time.Second
	DeniedTTL  = 5 * time.Second
	// maxCache bounds the remembered answers (cleared when full).
	maxCache = 4096
	// maxEDEText bounds the reason put in an Extended DNS Error.
	maxEDEText = 200
	// ednsSize is the UDP payload size this resolver advertises.
	ednsSize = 1232
)

// Extended DNS Error codes (RFC 8914) and the EDNS option carrying them.
const (
	optEDE       = 15
	edeOther     = 0
	edeBlocked   = 15
	edeNetwork   = 23
	edeNoReach   = 22
	reverseV4Sfx = ".in-addr.arpa."
	reverseV6Sfx = ".ip6.arpa."
)

// Resolver answers DNS in the guest. An A question for a name the host
// allows gets a fake address from the pool; an AAAA question gets the
// name's fake IPv6 address once SetIPv6 said the capture carries IPv6,
// and an empty answer before (the host dials whichever family it reaches
// behind either address, so a guest without IPv6 capture gives Happy
// Eyeballs nothing to stall on); the other types of an allowed name get
// an empty answer; a denied or nonexistent name gets NXDOMAIN at once,
// with the host's reason as an Extended DNS Error when the client speaks
// EDNS; a host that cannot answer gives SERVFAIL, never silence.
type Resolver struct {
	ask  Asker
	pool *Pool
	now  func() time.Time
	// v6: the capture carries IPv6, so AAAA questions get addresses.
	v6 atomic.Bool

	sf    singleflight.Group
	mu    sync.Mutex
	cache map[string]cached
}

type cached struct {
	r       protocol.DNSReply
	expires time.Time
}

// NewResolver returns a resolver asking the host with ask and handing out
// addresses from pool.
func NewResolver(ask Asker, pool *Pool) *Resolver {
	return &Resolver{ask: ask, pool: pool, now: time.Now, cache: map[string]cached{}}
}

// SetIPv6 says whether the capture carries IPv6 (AAAA questions get the
// made-up IPv6 address of an allowed name, localhost's is ::1).
func (r *Resolver) SetIPv6(on bool) { r.v6.Store(on) }

// decide returns the host's answer for name, remembered for its TTL;
// concurrent questions for one name ask once.
func (r *Resolver) decide(ctx context.Context, name string) protocol.DNSReply {
	r.mu.Lock()
	c, ok := r.cache[name]
	r.mu.Unlock()
	if ok && r.now().Before(c.expires) {
		return c.r
	}
	v, _, _ := r.sf.Do(name, func() (any, error) {
		rep := r.ask(ctx, name)
		ttl := DeniedTTL
		switch {
		case rep.OK():
			ttl = AllowedTTL
		case rep.Code != protocol.EgressDenied && rep.Code != protocol.EgressNameNotResolved && rep.Code != protocol.EgressInvalidArgument:
			ttl = 0 // transient: ask again next time
		}
		if ttl > 0 {
			r.mu.Lock()
			if len(r.cache) >= maxCache {
				clear(r.cache)
			}
			r.cache[name] = cached{rep, r.now().Add(ttl)}
			r.mu.Unlock()
		}
		return rep, nil
	})
	return v.(protocol.DNSReply)
}

// Handle answers one DNS message. It returns nil when nothing should be
// sent (the input is not a query with a readable header). maxLen is the
// transport's limit (512 for UDP without EDNS); answers never exceed it.
func (r *Resolver) Handle(ctx context.Context, msg []byte, udp bool) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(msg)
	if err != nil || h.Response {
		return nil
	}
	reply := dnsmessage.Header{ID: h.ID, Response: true, OpCode: h.OpCode, RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	if h.OpCode != 0 {
		reply.RCode = dnsmessage.RCodeNotImplemented
		return pack(reply, nil, nil, nil, udp, 512)
	}
	qs, err := p.AllQuestions()
	if err != nil || len(qs) != 1 {
		reply.RCode = dnsmessage.RCodeFormatError
		return pack(reply, nil, nil, nil, udp, 512)
	}
	q := qs[0]
	// EDNS: find the client's OPT record, if any, in the additional section.
	edns, limit := false, 512
	if err := p.SkipAllAnswers(); err == nil {
		if err := p.SkipAllAuthorities(); err == nil {
			for {
				ah, err := p.AdditionalHeader()
				if err != nil {
					break
				}
				if ah.Type == dnsmessage.TypeOPT {
					edns = true
					limit = max(512, min(int(ah.Class), ednsSize))
				}
				if err := p.SkipAdditional(); err != nil {
					break
				}
			}
		}
	}
	if !udp {
		limit = 65535
	}
	answers, rcode, ede := r.answer(ctx, q)
	reply.RCode = rcode
	if !edns {
		ede = nil
	}
	return pack(reply, []dnsmessage.Question{q}, answers, &ednsOpt{on: edns, ede: ede}, udp, limit)
}

type ednsOpt struct {
	on  bool
	ede *dnsmessage.Option
}

// answer decides one question.
func (r *Resolver) answer(ctx context.Context, q dnsmessage.Question) ([]dnsmessage.Resource, dnsmessage.RCode, *dnsmessage.Option) {
	if q.Class != dnsmessage.ClassINET && q.Class != dnsmessage.ClassANY {
		return nil, dnsmessage.RCodeRefused, nil
	}
	name := strings.ToLower(q.Name.String())
	hdr := func(t dnsmessage.Type, ttl time.Duration) dnsmessage.ResourceHeader {
		return dnsmessage.ResourceHeader{Name: q.Name, Type: t, Class: dnsmessage.ClassINET, TTL: uint32(ttl / time.Second)}
	}
	switch {
	case name == "localhost." || strings.HasSuffix(name, ".localhost."):
		if q.Type == dnsmessage.TypeA {
			return []dnsmessage.Resource{{Header: hdr(dnsmessage.TypeA, time.Hour), Body: &dnsmessage.AResource{A: [4]byte{127, 0, 0, 1}}}}, dnsmessage.RCodeSuccess, nil
		}
		if q.Type == dnsmessage.TypeAAAA && r.v6.Load() {
			return []dnsmessage.Resource{{Header: hdr(dnsmessage.TypeAAAA, time.Hour), Body: &dnsmessage.AAAAResource{AAAA: netip.IPv6Loopback().As16()}}}, dnsmessage.RCodeSuccess, nil
		}
		return nil, dnsmessage.RCodeSuccess, nil
	case strings.HasSuffix(name, ".arpa."):
		// Reverse lookups never leave the guest: a fake address maps back
		// to its name, anything else does not exist here.
		if q.Type == dnsmessage.TypePTR {
			a, ok := parseReverseV4(name)
			if !ok {
				a, ok = parseReverseV6(name)
			}
			if ok {
				if n, ok := r.pool.Name(a); ok {
					if pn, err := dnsmessage.NewName(n + "."); err == nil {
						return []dnsmessage.Resource{{Header: hdr(dnsmessage.TypePTR, AllowedTTL), Body: &dnsmessage.PTRResource{PTR: pn}}}, dnsmessage.RCodeSuccess, nil
					}
				}
			}
		}
		return nil, dnsmessage.RCodeNameError, nil
	case name == ".":
		return nil, dnsmessage.RCodeRefused, nil
	}
	host := strings.TrimSuffix(name, ".")
	if (protocol.StreamHeader{Kind: protocol.KindDNS, Host: host}).Validate() != nil {
		return nil, dnsmessage.RCodeNameError, nil
	}
	rep := r.decide(ctx, host)
	switch {
	case rep.OK():
	case rep.Code == protocol.EgressDenied:
		return nil, dnsmessage.RCodeNameError, edeOption(edeBlocked, "sandbox egress policy: "+rep.Reason)
	case rep.Code == protocol.EgressNameNotResolved, rep.Code == protocol.EgressInvalidArgument:
		return nil, dnsmessage.RCodeNameError, edeOption(edeOther, rep.Reason)
	case rep.Code == protocol.EgressTimedOut, rep.Code == protocol.EgressNameResolutionFailed:
		return nil, dnsmessage.RCodeServerFailure, edeOption(edeNoReach, rep.Reason)
	default:
		return nil, dnsmessage.RCodeServerFailure, edeOption(edeNetwork, rep.Reason)
	}
	var out []dnsmessage.Resource
	if q.Type == dnsmessage.TypeA || q.Type == dnsmessage.TypeALL {
		a := r.pool.Addr(host)
		out = append(out, dnsmessage.Resource{Header: hdr(dnsmessage.TypeA, AllowedTTL), Body: &dnsmessage.AResource{A: a.As4()}})
	}
	if (q.Type == dnsmessage.TypeAAAA || q.Type == dnsmessage.TypeALL) && r.v6.Load() {
		a := r.pool.Addr6(host)
		out = append(out, dnsmessage.Resource{Header: hdr(dnsmessage.TypeAAAA, AllowedTTL), Body: &dnsmessage.AAAAResource{AAAA: a.As16()}})
	}
	return out, dnsmessage.RCodeSuccess, nil
}

func edeOption(code uint16, text string) *dnsmessage.Option {
	if len(text) > maxEDEText {
		text = text[:maxEDEText]
	}
	text = strings.ToValidUTF8(text, "?")
	d := make([]byte, 2, 2+len(text))
	binary.BigEndian.PutUint16(d, code)
	return &dnsmessage.Option{Code: optEDE, Data: append(d, text...)}
}

// pack builds the reply; when it is over limit it is sent again without
// the EDE text, then truncated (TC) without answers.
func pack(h dnsmessage.Header, qs []dnsmessage.Question, ans []dnsmessage.Resource, e *ednsOpt, udp bool, limit int) []byte {
	build := func(ans []dnsmessage.Resource, ede *dnsmessage.Option) []byte {
		m := dnsmessage.Message{Header: h, Questions: qs, Answers: ans}
		if e != nil && e.on {
			var rh dnsmessage.ResourceHeader
			_ = rh.SetEDNS0(ednsSize, dnsmessage.RCodeSuccess, false)
			opt := &dnsmessage.OPTResource{}
			if ede != nil {
				opt.Options = []dnsmessage.Option{*ede}
			}
			m.Additionals = []dnsmessage.Resource{{Header: rh, Body: opt}}
		}
		b, err := m.Pack()
		if err != nil {
			return nil
		}
		return b
	}
	var ede *dnsmessage.Option
	if e != nil {
		ede = e.ede
	}
	b := build(ans, ede)
	if b != nil && len(b) <= limit {
		return b
	}
	if ede != nil {
		if b = build(ans, nil); b != nil && len(b) <= limit {
			return b
		}
	}
	h.Truncated = udp
	return build(nil, nil)
}

// parseReverseV4 turns "4.3.2.1.in-addr.arpa." into 1.2.3.4.
func parseReverseV4(name string) (netip.Addr, bool) {
	s, ok := strings.CutSuffix(name, reverseV4Sfx)
	if !ok {
		return netip.Addr{}, false
	}
	parts := strings.Split(s, ".")
	if len(parts) != 4 {
		return netip.Addr{}, false
	}
	var b [4]byte
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 || n > 255 || (len(p) > 1 && p[0] == '0') {
			return netip.Addr{}, false
		}
		b[3-i] = byte(n)
	}
	return netip.AddrFrom4(b), true
}

// parseReverseV6 turns the 32 nibble labels of "b.a.9.8...ip6.arpa."
// (lowest nibble first) into the address.
func parseReverseV6(name string) (netip.Addr, bool) {
	s, ok := strings.CutSuffix(name, reverseV6Sfx)
	if !ok || len(s) != 63 {
		return netip.Addr{}, false
	}
	var b [16]byte
	for i := 0; i < 32; i++ {
		c := s[2*i]
		if i < 31 && s[2*i+1] != '.' {
			return netip.Addr{}, false
		}
		var v byte
		switch {
		case c >= '0' && c <= '9':
			v = c - '0'
		case c >= 'a' && c <= 'f':
			v = c - 'a' + 10
		default:
			return netip.Addr{}, false
		}
		// Label i is nibble 31-i of the address, from the top.
		n := 31 - i
		if n%2 == 0 {
			b[n/2] |= v << 4
		} else {
			b[n/2] |= v
		}
	}
	return netip.AddrFrom16(b), true
}
