package egress

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/net/publicsuffix"
)

// Policy limits.
const (
	MaxRules      = 256
	MaxUpstreams  = 256
	MaxPolicyFile = 1 << 20
	// Shortest CIDR prefixes accepted: there is no allow-all, not even
	// spelled as 0.0.0.0/1 plus 128.0.0.0/1.
	MinPrefix4 = 8
	MinPrefix6 = 16
	// MaxPortSpan is the most ports the port ranges of one host, suffix
	// or prefix may cover together: more amounts to every port. Single
	// ports (one rule each, the operator naming them) do not count.
	MaxPortSpan = 1024
)

// ErrRule is wrapped by every rule, upstream and policy file error.
var ErrRule = errors.New("egress policy")

type ruleKind int

const (
	ruleHost ruleKind = iota
	ruleSuffix
	ruleCIDR
)

// Rule allows one host, every name under a suffix, or a CIDR prefix, on a
// port or a port range.
type Rule struct {
	kind   ruleKind
	name   string // exact name, or the suffix without "*."
	prefix netip.Prefix
	lo, hi uint16
	// link marks the rule the bootstrap's Link URL makes (LinkRule): an
	// address it names never lifts a refused class, as a name would not.
	link bool
}

// String returns the rule in the syntax ParseRule accepts, normalized.
func (r Rule) String() string {
	var h string
	switch r.kind {
	case ruleHost:
		h = r.name
	case ruleSuffix:
		h = "*." + r.name
	case ruleCIDR:
		h = r.prefix.String()
		if r.link {
			h = r.prefix.Addr().String()
		}
		if r.prefix.Addr().Is6() {
			h = "[" + h + "]"
		}
	}
	if r.link {
		return "link " + h + ":" + portText(r.lo, r.hi)
	}
	return h + ":" + portText(r.lo, r.hi)
}

func (r Rule) hasPort(p int) bool { return p >= int(r.lo) && p <= int(r.hi) }

// matchesName reports whether a name rule covers name.
func (r Rule) matchesName(name string) bool {
	switch r.kind {
	case ruleHost:
		return name == r.name
	case ruleSuffix:
		return strings.HasSuffix(name, "."+r.name)
	}
	return false
}

// ParseRule parses one allow rule:
//
//	api.example.com:443          exact name (normalized: case, trailing dot, IDNA)
//	*.example.com:8000-8100      every name under example.com (not example.com itself)
//	203.0.113.0/24:443           CIDR prefix; an address alone is a /32 or /128
//	[2001:db8::/32]:443          IPv6 in brackets
//
// The port is required: one port or LO-HI within 1..65535.
func ParseRule(s string) (Rule, error) {
	host, ports, err := splitPorts(s)
	if err != nil {
		return Rule{}, err
	}
	var r Rule
	if r.lo, r.hi, err = parsePorts(ports); err != nil {
		return Rule{}, err
	}
	if span := int(r.hi) - int(r.lo) + 1; span > MaxPortSpan {
		return Rule{}, fmt.Errorf("%w: rule %q: a range of %d ports amounts to every port: at most %d ports per host, suffix or prefix in ranges; name each port (one rule each) or a narrower range",
			ErrRule, safeText(s, 80), span, MaxPortSpan)
	}
	switch {
	case strings.Contains(host, "/"):
		p, err := netip.ParsePrefix(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"))
		if err != nil {
			return Rule{}, fmt.Errorf("%w: rule %q: not a CIDR prefix such as 203.0.113.0/24", ErrRule, safeText(s, 80))
		}
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		p = p.Masked()
		if p.Addr().Is4() && p.Bits() < MinPrefix4 || p.Addr().Is6() && p.Bits() < MinPrefix6 {
			return Rule{}, fmt.Errorf("%w: rule %q: prefixes shorter than /%d (IPv4) or /%d (IPv6) are refused: there is no allow-all", ErrRule, safeText(s, 80), MinPrefix4, MinPrefix6)
		}
		r.kind, r.prefix = ruleCIDR, p
	case strings.HasPrefix(host, "*."):
		h, err := ParseHost(host[2:])
		if err != nil || h.IsIP() {
			return Rule{}, fmt.Errorf("%w: rule %q: *. must be followed by a DNS name", ErrRule, safeText(s, 80))
		}
		if ps, _ := publicsuffix.PublicSuffix(h.Name); ps == h.Name {
			return Rule{}, fmt.Errorf("%w: rule %q: %s is a public suffix (anyone can register a name under it), so *.%s would allow much of the internet: there is no allow-all; allow the names themselves, or *.DOMAIN for a domain registered under %s",
				ErrRule, safeText(s, 80), h.Name, h.Name, h.Name)
		}
		r.kind, r.name = ruleSuffix, h.Name
	default:
		if strings.Contains(host, "*") {
			return Rule{}, fmt.Errorf("%w: rule %q: '*' is only allowed as a leading '*.' (there is no allow-all)", ErrRule, safeText(s, 80))
		}
		h, err := ParseHost(host)
		if err != nil {
			return Rule{}, fmt.Errorf("%w: rule %q: %v", ErrRule, safeText(s, 80), err)
		}
		if h.IsIP() {
			r.kind, r.prefix = ruleCIDR, netip.PrefixFrom(h.IP, h.IP.BitLen())
		} else {
			r.kind, r.name = ruleHost, h.Name
		}
	}
	return r, nil
}

func splitPorts(s string) (host, ports string, err error) {
	i := strings.LastIndexByte(s, ':')
	if i <= 0 || i == len(s)-1 {
		return "", "", fmt.Errorf("%w: %q: want HOST:PORT or HOST:LO-HI (IPv6 in brackets)", ErrRule, safeText(s, 80))
	}
	host, ports = s[:i], s[i+1:]
	if strings.Contains(host, ":") && !(strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]")) {
		return "", "", fmt.Errorf("%w: %q: put IPv6 addresses in brackets, e.g. [2001:db8::/32]:443", ErrRule, safeText(s, 80))
	}
	return host, ports, nil
}

func parsePorts(s string) (lo, hi uint16, err error) {
	a, b, isRange := strings.Cut(s, "-")
	l, err1 := parsePort(a)
	h := l
	var err2 error
	if isRange {
		h, err2 = parsePort(b)
	}
	if err1 != nil || err2 != nil || l > h {
		return 0, 0, fmt.Errorf("%w: port %q: want a port or LO-HI within 1..65535", ErrRule, safeText(s, 20))
	}
	return l, h, nil
}

func parsePort(s string) (uint16, error) {
	if s == "" || len(s) > 5 || strings.TrimLeft(s, "0123456789") != "" {
		return 0, errors.New("bad port")
	}
	v, _ := strconv.Atoi(s)
	if v < 1 || v > 65535 {
		return 0, errors.New("bad port")
	}
	return uint16(v), nil
}

// Upstream maps a name and port the guest asks for to an address the host
// dials: the configured upstreams such as the LLM gateway. The address is
// trusted: it may be loopback or private, and a name in it is resolved
// without class checks.
type Upstream struct {
	Name    string
	Port    int
	Address string // host:port
}

// String returns NAME:PORT=ADDR.
func (u Upstream) String() string { return u.Name + ":" + strconv.Itoa(u.Port) + "=" + u.Address }

// ParseUpstream parses NAME:PORT=ADDR, e.g. llm-gateway:443=127.0.0.1:8443.
func ParseUpstream(s string) (Upstream, error) {
	left, addr, ok := strings.Cut(s, "=")
	if !ok {
		return Upstream{}, fmt.Errorf("%w: upstream %q: want NAME:PORT=ADDR, e.g. llm-gateway:443=127.0.0.1:8443", ErrRule, safeText(s, 80))
	}
	name, port, err := net.SplitHostPort(left)
	p, perr := parsePort(port)
	if err != nil || perr != nil {
		return Upstream{}, fmt.Errorf("%w: upstream %q: NAME:PORT must be a DNS name and a port", ErrRule, safeText(s, 80))
	}
	h, err := ParseHost(name)
	if err != nil || h.IsIP() {
		return Upstream{}, fmt.Errorf("%w: upstream %q: NAME must be a DNS name", ErrRule, safeText(s, 80))
	}
	ah, ap, err := net.SplitHostPort(addr)
	if _, perr := parsePort(ap); err != nil || perr != nil || ah == "" {
		return Upstream{}, fmt.Errorf("%w: upstream %q: ADDR must be HOST:PORT (IPv6 in brackets)", ErrRule, safeText(s, 80))
	}
	if ip, err := netip.ParseAddr(ah); err == nil {
		if ip.Zone() != "" || ip.Unmap() == zeroV4 || ip == zeroV6 {
			return Upstream{}, fmt.Errorf("%w: upstream %q: ADDR may not be unspecified or carry a zone", ErrRule, safeText(s, 80))
		}
	} else if hh, err := ParseHost(ah); err != nil || hh.IsIP() {
		return Upstream{}, fmt.Errorf("%w: upstream %q: ADDR host must be an IP address or a DNS name", ErrRule, safeText(s, 80))
	}
	return Upstream{Name: h.Name, Port: int(p), Address: addr}, nil
}

type upKey struct {
	name string
	port int
}

// Policy is an immutable set of rules and upstreams. The zero value and
// an empty policy deny everything.
type Policy struct {
	rules     []Rule
	upstreams map[upKey]Upstream
}

// NewPolicy builds a policy; it refuses more than MaxRules rules or
// MaxUpstreams upstreams, and two upstreams for the same NAME:PORT.
func NewPolicy(rules []Rule, ups []Upstream) (*Policy, error) {
	if len(rules) > MaxRules {
		return nil, fmt.Errorf("%w: %d rules, at most %d", ErrRule, len(rules), MaxRules)
	}
	if len(ups) > MaxUpstreams {
		return nil, fmt.Errorf("%w: %d upstreams, at most %d", ErrRule, len(ups), MaxUpstreams)
	}
	if err := checkPortSpans(rules); err != nil {
		return nil, err
	}
	p := &Policy{rules: append([]Rule(nil), rules...), upstreams: make(map[upKey]Upstream, len(ups))}
	for _, u := range ups {
		k := upKey{u.Name, u.Port}
		if _, dup := p.upstreams[k]; dup {
			return nil, fmt.Errorf("%w: upstream %s:%d is defined twice", ErrRule, u.Name, u.Port)
		}
		p.upstreams[k] = u
	}
	return p, nil
}

// checkPortSpans refuses rules whose port ranges for one host, suffix or
// prefix together cover more than MaxPortSpan ports: many narrow ranges
// can amount to every port as well as one wide one.
func checkPortSpans(rules []Rule) error {
	ranges := map[string][][2]int{}
	for _, r := range rules {
		if r.lo != r.hi {
			k := r.String()
			k = k[:strings.LastIndexByte(k, ':')]
			ranges[k] = append(ranges[k], [2]int{int(r.lo), int(r.hi)})
		}
	}
	for target, rs := range ranges {
		slices.SortFunc(rs, func(a, b [2]int) int { return a[0] - b[0] })
		total, end := 0, 0
		for _, r := range rs {
			lo := max(r[0], end+1)
			if r[1] >= lo {
				total += r[1] - lo + 1
				end = r[1]
			}
		}
		if total > MaxPortSpan {
			return fmt.Errorf("%w: the port ranges for %s cover %d ports, which amounts to every port: at most %d in ranges; name each port (one rule each)",
				ErrRule, target, total, MaxPortSpan)
		}
	}
	return nil
}

// ParsePolicy builds a policy from rule and upstream strings.
func ParsePolicy(rules, upstreams []string) (*Policy, error) {
	var rs []Rule
	var us []Upstream
	for _, s := range rules {
		r, err := ParseRule(s)
		if err != nil {
			return nil, err
		}
		rs = append(rs, r)
	}
	for _, s := range upstreams {
		u, err := ParseUpstream(s)
		if err != nil {
			return nil, err
		}
		us = append(us, u)
	}
	return NewPolicy(rs, us)
}

// Rules returns the operator's rules as strings (not the Link's).
func (p *Policy) Rules() []string {
	var out []string
	for _, r := range p.rules {
		if !r.link {
			out = append(out, r.String())
		}
	}
	return out
}

// Describe returns the rules, the Link's ("link H:P"), and then the
// upstreams ("upstream N:P=A").
func (p *Policy) Describe() []string {
	out := p.Rules()
	if r := p.linkRule(); r != nil {
		out = append(out, r.String())
	}
	keys := make([]string, 0, len(p.upstreams))
	for _, u := range p.upstreams {
		keys = append(keys, "upstream "+u.String())
	}
	slices.Sort(keys)
	return append(out, keys...)
}

// Len returns the number of the operator's rules and upstreams.
func (p *Policy) Len() (rules, upstreams int) {
	n := len(p.rules)
	if p.linkRule() != nil {
		n--
	}
	return n, len(p.upstreams)
}

func (p *Policy) linkRule() *Rule {
	if n := len(p.rules); n > 0 && p.rules[n-1].link {
		return &p.rules[n-1]
	}
	return nil
}

// ErrLinkNotAllowed is returned by LinkRule for a Link the default cannot
// allow; the message says why and which rule would.
var ErrLinkNotAllowed = errors.New("the Link is not allowed by default")

// LinkRule returns the rule that allows exactly the host and port of a
// Link URL (ws:// port 80, wss:// port 443 unless the URL names one).
// A name's addresses meet the same checks as any name rule's when it is
// resolved; an address literal in a refused class, or always refused, is
// not allowed by default (ErrLinkNotAllowed): only an operator's CIDR rule
// opens such an address.
func LinkRule(linkURL string) (Rule, error) {
	u, err := url.Parse(linkURL)
	if err != nil || u.Hostname() == "" {
		return Rule{}, fmt.Errorf("%w: the link_url has no host", ErrLinkNotAllowed)
	}
	port := 443
	if u.Scheme == "ws" {
		port = 80
	}
	if ps := u.Port(); ps != "" {
		n, err := parsePort(ps)
		if err != nil {
			return Rule{}, fmt.Errorf("%w: the link_url's port is not within 1..65535", ErrLinkNotAllowed)
		}
		port = int(n)
	}
	h, err := ParseHost(u.Hostname())
	if err != nil {
		return Rule{}, fmt.Errorf("%w: the link_url's host is not a valid host name or address", ErrLinkNotAllowed)
	}
	r := Rule{kind: ruleHost, name: h.Name, lo: uint16(port), hi: uint16(port), link: true}
	if h.IsIP() {
		if why, bad := alwaysRefused(h.IP); bad {
			return Rule{}, fmt.Errorf("%w: %s is %s", ErrLinkNotAllowed, h.IP, why)
		}
		if cls, bad := refusedClass(h.IP); bad {
			return Rule{}, fmt.Errorf("%w: %s is %s; a CIDR rule naming it allows it", ErrLinkNotAllowed, h.IP, cls)
		}
		r.kind, r.name, r.prefix = ruleCIDR, "", netip.PrefixFrom(h.IP, h.IP.BitLen())
	}
	return r, nil
}

// WithLink returns a copy of p that also allows the Link's rule (from
// LinkRule), replacing the Link rule p had.
func (p *Policy) WithLink(r Rule) *Policy {
	rules := p.rules
	if p.linkRule() != nil {
		rules = rules[:len(rules)-1]
	}
	r.link = true
	return &Policy{rules: append(slices.Clone(rules), r), upstreams: p.upstreams}
}

// File is the policy file format (version 1), decoded strictly.
//
//	{"version": 1,
//	 "allow": ["api.example.com:443", "*.example.org:8000-8100", "203.0.113.0/24:443"],
//	 "upstreams": ["llm-gateway:443=127.0.0.1:8443"]}
type File struct {
	Version   int      `json:"version"`
	Allow     []string `json:"allow"`
	Upstreams []string `json:"upstreams"`
}

// DecodeFile reads a policy file strictly: at most MaxPolicyFile bytes,
// version 1, no unknown fields, no trailing data.
func DecodeFile(r io.Reader) (*File, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxPolicyFile+1))
	if err != nil {
		return nil, fmt.Errorf("%w file: %v", ErrRule, err)
	}
	if len(data) > MaxPolicyFile {
		return nil, fmt.Errorf("%w file: larger than %d bytes", ErrRule, MaxPolicyFile)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var f File
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%w file: %s", ErrRule, jsonError(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w file: trailing data after the object", ErrRule)
	}
	if f.Version != 1 {
		return nil, fmt.Errorf("%w file: version must be 1", ErrRule)
	}
	return &f, nil
}

func jsonError(err error) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("syntax error at byte %d", se.Offset)
	case errors.As(err, &te):
		return fmt.Sprintf("field %q has the wrong type", te.Field)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return "unknown field " + strings.TrimPrefix(err.Error(), "json: unknown field ")
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "unexpected end of input"
	}
	return "invalid document"
}

// LoadPolicy builds a policy from an optional file plus extra rules and
// upstreams (the command line's --allow and --upstream).
func LoadPolicy(path string, rules, upstreams []string) (*Policy, error) {
	if path != "" {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("read egress policy: %w", err)
		}
		pf, err := DecodeFile(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", path, err)
		}
		rules = append(append([]string(nil), pf.Allow...), rules...)
		upstreams = append(append([]string(nil), pf.Upstreams...), upstreams...)
	}
	return ParsePolicy(rules, upstreams)
}
