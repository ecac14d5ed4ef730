package egress

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/protocol"
)

// fakeDNS answers from a table; names not in it do not exist.
type fakeDNS map[string][]string

func (f fakeDNS) lookup(name string) ([]netip.Addr, error) {
	if name == "timeout.test" {
		return nil, &net.DNSError{Err: "i/o timeout", Name: name, IsTimeout: true}
	}
	if name == "servfail.test" {
		return nil, &net.DNSError{Err: "server misbehaving", Name: name, IsTemporary: true}
	}
	as, ok := f[name]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: name, IsNotFound: true}
	}
	var out []netip.Addr
	for _, a := range as {
		out = append(out, netip.MustParseAddr(a))
	}
	return out, nil
}

func (f fakeDNS) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	return f.lookup(host)
}

var tableDNS = fakeDNS{
	"api.example.com":       {"93.184.216.34"},
	"example.org":           {"93.184.216.34"},
	"evil-example.org":      {"93.184.216.36"},
	"www.example.org":       {"93.184.216.40"},
	"a.b.example.org":       {"93.184.216.41"},
	"foo_bar.example.org":   {"93.184.216.42"},
	"loopback.test":         {"127.0.0.1"},
	"metadata.test":         {"169.254.169.254"},
	"mixed.test":            {"127.0.0.1", "2606:4700::9", "93.184.216.35"},
	"v6only.test":           {"2606:4700::1"},
	"mapped.test":           {"::ffff:127.0.0.1"},
	"private.test":          {"10.1.2.3"},
	"zero.test":             {"0.0.0.0"},
	"nat64.test":            {"64:ff9b::7f00:1"},
	"allrefused.test":       {"10.0.0.1", "192.168.0.1", "::1"},
	"localhost":             {"127.0.0.1", "::1"},
	"xn--bcher-kva.example": {"93.184.216.50"},
	"db.internal":           {"10.9.3.4"},
}

var tablePolicy = []string{
	"api.example.com:443",
	"*.example.org:443",
	"*.example.org:8000-8100",
	"loopback.test:80", "metadata.test:80", "mixed.test:443", "v6only.test:443", "mapped.test:80",
	"private.test:80", "zero.test:80", "nat64.test:80", "nx.test:443", "timeout.test:443", "servfail.test:443",
	"allrefused.test:80", "db.internal:5432",
	"203.0.113.0/24:443",
	"[2001:db8::/32]:443",
	"10.9.0.0/16:5432",
	"127.0.0.1:8080",
	"0.0.0.0/8:7",
	"Bücher.example:443",
}

func TestPolicyTable(t *testing.T) {
	pol, err := ParsePolicy(tablePolicy, []string{"llm:443=127.0.0.1:9999", "gw.internal:8443=[::1]:8443"})
	require.NoError(t, err)
	const (
		ok      = protocol.EgressOK
		invalid = protocol.EgressInvalidArgument
		denied  = protocol.EgressDenied
		nx      = protocol.EgressNameNotResolved
		dnsfail = protocol.EgressNameResolutionFailed
	)
	cases := []struct {
		host    string
		port    int
		code    protocol.EgressCode
		want    string // address dialed (ok) or a reason fragment (refused)
		lookups int
	}{
		// Allowed names, odd spellings of them.
		{"api.example.com", 443, ok, "93.184.216.34:443", 1},
		{"API.Example.COM", 443, ok, "93.184.216.34:443", 1},
		{"api.example.com.", 443, ok, "93.184.216.34:443", 1},
		{"www.example.org", 443, ok, "93.184.216.40:443", 1},
		{"a.b.example.org", 8050, ok, "93.184.216.41:8050", 1},
		{"a.b.example.org", 8000, ok, "93.184.216.41:8000", 1},
		{"a.b.example.org", 8100, ok, "93.184.216.41:8100", 1},
		{"foo_bar.example.org", 443, ok, "93.184.216.42:443", 1},
		{"bücher.example", 443, ok, "93.184.216.50:443", 1},
		{"BÜCHER.example", 443, ok, "93.184.216.50:443", 1},
		{"xn--bcher-kva.example", 443, ok, "93.184.216.50:443", 1},
		{"mixed.test", 443, ok, "93.184.216.35:443", 1},
		{"v6only.test", 443, ok, "[2606:4700::1]:443", 1},
		// Named upstreams: no resolution, the configured address.
		{"llm", 443, ok, "127.0.0.1:9999", 0},
		{"LLM.", 443, ok, "127.0.0.1:9999", 0},
		{"gw.internal", 8443, ok, "[::1]:8443", 0},
		// CIDR rules, literals in every spelling.
		{"203.0.113.7", 443, ok, "203.0.113.7:443", 0},
		{"203.000.113.007", 443, ok, "203.0.113.7:443", 0},
		{"0xcb.0x0.0x71.0x7", 443, ok, "203.0.113.7:443", 0},
		{"3405803783", 443, ok, "203.0.113.7:443", 0},
		{"[::ffff:203.0.113.7]", 443, ok, "203.0.113.7:443", 0},
		{"2001:db8::5", 443, ok, "[2001:db8::5]:443", 0},
		{"[2001:DB8::5]", 443, ok, "[2001:db8::5]:443", 0},
		{"10.9.1.1", 5432, ok, "10.9.1.1:5432", 0},
		{"db.internal", 5432, ok, "10.9.3.4:5432", 1},
		{"127.0.0.1", 8080, ok, "127.0.0.1:8080", 0},
		{"127.1", 8080, ok, "127.0.0.1:8080", 0},
		{"１２７.０.０.１", 8080, ok, "127.0.0.1:8080", 0},
		{"localhost", 8080, ok, "127.0.0.1:8080", 1},
		{"0.1.2.3", 7, ok, "0.1.2.3:7", 0},
		// Denied ports: nothing is resolved.
		{"api.example.com", 80, denied, "port 80 is not allowed for api.example.com", 0},
		{"api.example.com", 25, denied, "port 25 is not allowed for api.example.com", 0},
		{"x.example.org", 8101, denied, "port 8101 is not allowed for x.example.org", 0},
		{"unknown.test", 25, denied, "port 25 is not allowed by any rule", 0},
		{"203.0.113.7", 444, denied, "port 444 is not allowed by any rule", 0},
		{"10.9.1.1", 5433, denied, "port 5433 is not allowed by any rule", 0},
		{"llm", 80, denied, "no rule allows llm:80", 0},
		{"nx.test", 80, denied, "port 80 is not allowed for nx.test", 0},
		// Names that resolve where no rule allows.
		{"example.org", 443, denied, "no rule allows example.org:443 (it resolves to 93.184.216.34)", 1},
		{"evil-example.org", 443, denied, "no rule allows evil-example.org:443", 1},
		{"93.184.216.34", 443, denied, "no rule allows 93.184.216.34:443", 0},
		// Allowed names resolving into refused classes.
		{"loopback.test", 80, denied, "resolves to 127.0.0.1, which is loopback", 1},
		{"metadata.test", 80, denied, "169.254.169.254, which is cloud metadata", 1},
		{"mapped.test", 80, denied, "resolves to 127.0.0.1, which is loopback", 1},
		{"private.test", 80, denied, "private (RFC 1918)", 1},
		{"zero.test", 80, denied, "0.0.0.0 is the unspecified address 0.0.0.0: always refused", 1},
		{"nat64.test", 80, denied, "loopback embedded in IPv6", 1},
		{"allrefused.test", 80, denied, "every address was refused (10.0.0.1, 192.168.0.1, ::1)", 1},
		{"localhost", 443, denied, "127.0.0.1 is loopback: refused unless a CIDR rule allows it; every address was refused (127.0.0.1, ::1)", 1},
		// Refused classes as literals, in odd spellings.
		{"127.0.0.1", 443, denied, "127.0.0.1 is loopback", 0},
		{"127.1", 443, denied, "127.0.0.1 is loopback", 0},
		{"0x7f.0.0.1", 443, denied, "127.0.0.1 is loopback", 0},
		{"0x7f000001", 443, denied, "127.0.0.1 is loopback", 0},
		{"2130706433", 443, denied, "127.0.0.1 is loopback", 0},
		{"017700000001", 443, denied, "127.0.0.1 is loopback", 0},
		{"0177.0.0.01", 443, denied, "127.0.0.1 is loopback", 0},
		{"127.0.0.1.", 443, denied, "127.0.0.1 is loopback", 0},
		{"169.254.169.254", 443, denied, "cloud metadata", 0},
		{"0xa9fea9fe", 443, denied, "169.254.169.254 is cloud metadata", 0},
		{"169.254.1.1", 443, denied, "link-local", 0},
		{"10.0.0.1", 443, denied, "private (RFC 1918)", 0},
		{"172.16.5.4", 443, denied, "private (RFC 1918)", 0},
		{"192.168.1.1", 443, denied, "private (RFC 1918)", 0},
		{"100.64.0.1", 443, denied, "CGNAT", 0},
		{"192.0.0.8", 443, denied, "the IPv4 dummy address", 0},
		{"192.0.0.200", 443, denied, "192.0.0.0/24", 0},
		{"192.0.2.2", 443, denied, "TEST-NET-1", 0},
		{"198.18.0.1", 443, denied, "benchmarking", 0},
		{"198.19.255.255", 443, denied, "benchmarking", 0},
		{"224.0.0.1", 443, denied, "multicast", 0},
		{"255.255.255.255", 443, denied, "broadcast", 0},
		{"240.0.0.1", 443, denied, "reserved", 0},
		{"0.0.0.0", 443, denied, "0.0.0.0", 0},
		{"0", 443, denied, "0.0.0.0", 0},
		{"0x", 443, denied, "0.0.0.0", 0},
		{"0.0.0.0", 7, denied, "always refused", 0},
		{"::", 443, denied, "unspecified", 0},
		{"::1", 443, denied, "::1 is loopback", 0},
		{"[::1]", 443, denied, "::1 is loopback", 0},
		{"::ffff:127.0.0.1", 443, denied, "127.0.0.1 is loopback", 0},
		{"::ffff:7f00:1", 443, denied, "127.0.0.1 is loopback", 0},
		{"::ffff:169.254.169.254", 443, denied, "cloud metadata", 0},
		{"::127.0.0.1", 443, denied, "IPv4-compatible", 0},
		{"::a9fe:a9fe", 443, denied, "IPv4-compatible", 0},
		{"64:ff9b::7f00:1", 443, denied, "loopback embedded in IPv6", 0},
		{"2002:a9fe:a9fe::1", 443, denied, "6to4 (2002::/16)", 0},
		{"::ffff:0:7f00:1", 443, denied, "IPv4-translated IPv6", 0},
		{"64:ff9b:1::7f00:1", 443, denied, "local-use NAT64", 0},
		{"fc00::1", 443, denied, "unique local", 0},
		{"fd12:3456::1", 443, denied, "unique local", 0},
		{"fe80::1", 443, denied, "link-local", 0},
		{"fec0::1", 443, denied, "site-local", 0},
		{"ff02::1", 443, denied, "multicast", 0},
		{"fe80::1%eth0", 443, denied, "zone: always refused", 0},
		{"[fe80::1%eth0]", 443, denied, "zone: always refused", 0},
		{"127.0.0.1%lo", 443, denied, "zone: always refused", 0},
		// Resolution failures.
		{"nx.test", 443, nx, "does not resolve", 1},
		{"timeout.test", 443, dnsfail, "timed out", 1},
		{"servfail.test", 443, dnsfail, "server misbehaving", 1},
		// Not a target at all.
		{"", 443, invalid, "not a valid host", 0},
		{"a..b", 443, invalid, "not a valid host", 0},
		{"-a.example.org", 443, invalid, "not a valid host", 0},
		{"exa mple.org", 443, invalid, "not a valid host", 0},
		{"example.com:443", 443, invalid, "not a valid host", 0},
		{"*.example.org", 443, invalid, "not a valid host", 0},
		{"1.2.3.4.5", 443, invalid, "not a valid host", 0},
		{"256.1.1.1", 443, invalid, "not a valid host", 0},
		{"1.2.3.256", 443, invalid, "not a valid host", 0},
		{"1.2.65536", 443, invalid, "not a valid host", 0},
		{"example.123", 443, invalid, "not a valid host", 0},
		{"08.1.1.1", 443, invalid, "not a valid host", 0},
		{strings.Repeat("a.", 127) + "org", 443, invalid, "not a valid host", 0},
		{"api.example.com", 0, invalid, "port 0", 0},
		{"api.example.com", 70000, invalid, "port 70000", 0},
	}
	require.GreaterOrEqual(t, len(cases), 60)
	for _, c := range cases {
		lookups := 0
		d := pol.DecideOn(nil, c.host, c.port, func(name string) ([]netip.Addr, error) {
			lookups++
			return tableDNS.lookup(name)
		})
		name := c.host + " port " + itoa(c.port)
		assert.Equal(t, c.lookups, lookups, "%s: lookups", name)
		assert.Equal(t, d.Lookups, lookups, "%s: Decision.Lookups", name)
		if c.code == ok {
			if assert.Nil(t, d.Failure, "%s", name) {
				assert.Equal(t, c.want, d.Address, "%s", name)
				assert.NotEmpty(t, d.Rule, "%s: an allowed target names its rule", name)
			}
			continue
		}
		if assert.NotNil(t, d.Failure, "%s: want %s, allowed to %s by %s", name, c.code, d.Address, d.Rule) {
			assert.Equal(t, c.code, d.Failure.Code, "%s: %s", name, d.Failure.Reason)
			assert.Contains(t, d.Failure.Reason, c.want, "%s", name)
			assert.Equal(t, protocol.EffectNone, d.Failure.Effect, "%s", name)
		}
	}
}

func TestParseHostNormalizesOddSpellings(t *testing.T) {
	for in, want := range map[string]string{
		"Example.COM.":          "example.com",
		"bücher.example":        "xn--bcher-kva.example",
		"XN--BCHER-KVA.example": "xn--bcher-kva.example",
		"１２７.０.０.１":             "127.0.0.1",
		"127.1":                 "127.0.0.1",
		"10.1":                  "10.0.0.1",
		"10.1.1":                "10.1.0.1",
		"0x0a.0x01.0x0.1":       "10.1.0.1",
		"4294967295":            "255.255.255.255",
		"::FFFF:10.0.0.1":       "10.0.0.1",
		"[2001:db8::1]":         "2001:db8::1",
	} {
		h, err := ParseHost(in)
		if assert.NoError(t, err, in) {
			assert.Equal(t, want, h.String(), in)
		}
	}
	for _, in := range []string{"4294967296", "0x100000000", "a_b-.c", "[1.2.3.4]", "foo.-bar", "1.2.3.4..", "a\x00b"} {
		_, err := ParseHost(in)
		assert.Error(t, err, in)
	}
}

func TestParseRule(t *testing.T) {
	for in, want := range map[string]string{
		"API.example.com:443":     "api.example.com:443",
		"*.Example.org.:1-1024":   "*.example.org:1-1024",
		"*.example.co.uk:443":     "*.example.co.uk:443",
		"*.me.github.io:443":      "*.me.github.io:443",
		"com:443":                 "com:443",
		"203.0.113.9/24:443":      "203.0.113.0/24:443",
		"[2001:db8::/32]:443":     "[2001:db8::/32]:443",
		"[::ffff:10.0.0.0/104]:1": "10.0.0.0/8:1",
		"127.0.0.1:8080":          "127.0.0.1/32:8080",
		"[::1]:8080":              "[::1/128]:8080",
		"bücher.example:443":      "xn--bcher-kva.example:443",
	} {
		r, err := ParseRule(in)
		if assert.NoError(t, err, in) {
			assert.Equal(t, want, r.String(), in)
		}
	}
	for _, in := range []string{
		"example.com", "example.com:", ":443", "example.com:0", "example.com:65536", "example.com:443-80",
		"example.com:http", "*:443", "*.:443", "*.*.example.com:443", "ex*ample.com:443",
		"0.0.0.0/0:443", "[::/0]:443", "0.0.0.0/1:443", "128.0.0.0/7:443", "[2000::/3]:443",
		"2001:db8::/32:443", "10.0.0.0/33:443", "*.10.0.0.1:443", "a b:443", "example.com:1-2-3",
	} {
		_, err := ParseRule(in)
		assert.ErrorIs(t, err, ErrRule, in)
	}
}

func TestParseUpstream(t *testing.T) {
	u, err := ParseUpstream("LLM-Gateway:443=127.0.0.1:8443")
	require.NoError(t, err)
	assert.Equal(t, Upstream{Name: "llm-gateway", Port: 443, Address: "127.0.0.1:8443"}, u)
	assert.Equal(t, "llm-gateway:443=127.0.0.1:8443", u.String())
	_, err = ParseUpstream("gw:443=[::1]:8443")
	assert.NoError(t, err)
	_, err = ParseUpstream("gw:443=gateway.internal:8443")
	assert.NoError(t, err)
	for _, in := range []string{
		"gw:443", "gw=1.2.3.4:80", "gw:0=1.2.3.4:80", "1.2.3.4:443=1.2.3.4:80", "gw:443=1.2.3.4",
		"gw:443=0.0.0.0:80", "gw:443=[::]:80", "gw:443=[fe80::1%eth0]:80", "gw:443=:80", "g w:443=1.2.3.4:80",
	} {
		_, err := ParseUpstream(in)
		assert.ErrorIs(t, err, ErrRule, in)
	}
	_, err = ParsePolicy(nil, []string{"gw:443=1.2.3.4:80", "GW:443=1.2.3.5:80"})
	assert.ErrorIs(t, err, ErrRule, "the same NAME:PORT twice")
}

func TestPolicyLimitsAndEmptyPolicy(t *testing.T) {
	rules := make([]string, MaxRules+1)
	for i := range rules {
		rules[i] = "h" + itoa(i) + ".example.com:443"
	}
	_, err := ParsePolicy(rules, nil)
	assert.ErrorIs(t, err, ErrRule)
	assert.Contains(t, err.Error(), "at most 256")
	p, err := ParsePolicy(rules[:MaxRules], nil)
	require.NoError(t, err)
	n, _ := p.Len()
	assert.Equal(t, MaxRules, n)

	empty, err := ParsePolicy(nil, nil)
	require.NoError(t, err)
	for _, target := range []string{"api.example.com", "127.0.0.1", "93.184.216.34"} {
		d := empty.Decide(target, 443, func(string) ([]netip.Addr, error) {
			t.Fatal("an empty policy resolves nothing")
			return nil, nil
		})
		require.NotNil(t, d.Failure)
		assert.Equal(t, protocol.EgressDenied, d.Failure.Code)
	}
	var zero Policy
	assert.NotNil(t, zero.Decide("a.example", 443, nil).Failure)
}

func TestDecodeFileIsStrict(t *testing.T) {
	f, err := DecodeFile(strings.NewReader(`{"version":1,"allow":["api.example.com:443"],"upstreams":["llm:443=127.0.0.1:9"]}`))
	require.NoError(t, err)
	assert.Equal(t, []string{"api.example.com:443"}, f.Allow)
	for _, in := range []string{
		`{"version":2,"allow":[]}`,
		`{"version":1,"allow":[],"allow_all":true}`,
		`{"version":1,"Allow":[]}x`,
		`{"version":1} {}`,
		`{"version":1,"allow":"api.example.com:443"}`,
		`[]`,
		``,
	} {
		_, err := DecodeFile(strings.NewReader(in))
		assert.ErrorIs(t, err, ErrRule, in)
	}
	_, err = DecodeFile(strings.NewReader(`{"version":1,"allow":["` + strings.Repeat("a", MaxPolicyFile) + `"]}`))
	assert.ErrorIs(t, err, ErrRule)
	_, err = DecodeFile(strings.NewReader(`{"version":1,"allow":["secret-token-value"]}`))
	require.NoError(t, err)
	_, err = LoadPolicy("", []string{"secret-token-value"}, nil)
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrRule))
}

func FuzzParseHost(f *testing.F) {
	for _, s := range []string{"example.com", "127.1", "0x7f.1", "bücher.example", "[::1]", "fe80::1%eth0", "１２７.０.０.１", "a..b", "0x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		h, err := ParseHost(s)
		if err != nil {
			return
		}
		// Normalization is idempotent and yields either a name or an IP.
		h2, err := ParseHost(h.String())
		require.NoError(t, err, "normalized %q from %q", h.String(), s)
		require.Equal(t, h, h2)
		require.True(t, h.IsIP() != (h.Name != ""))
		if !h.IsIP() {
			require.LessOrEqual(t, len(h.Name), MaxName)
		}
	})
}

func FuzzParseRule(f *testing.F) {
	for _, s := range tablePolicy {
		f.Add(s)
	}
	f.Add("0.0.0.0/0:443")
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRule(s)
		if err != nil {
			return
		}
		r2, err := ParseRule(r.String())
		require.NoError(t, err)
		require.Equal(t, r.String(), r2.String())
		if r.kind == ruleCIDR {
			require.GreaterOrEqual(t, r.prefix.Bits(), MinPrefix4)
		}
	})
}

// FuzzPlan feeds guest-chosen egress targets (StreamHeader host and port)
// through the checks that need no resolution: never a panic, a failure
// always carries a valid code and a bounded printable reason, and an
// accepted target is either a named upstream, an IP literal or a name.
func FuzzPlan(f *testing.F) {
	for _, s := range []string{"example.com", "127.0.0.1", "169.254.169.254", "::", "fe80::1%eth0", "0x7f.1", "bücher.example", "up", "a..b", ""} {
		f.Add(s, 443)
	}
	f.Add("example.com", 0)
	f.Add("example.com", 70000)
	pol, err := ParsePolicy([]string{"*.example.com:443", "example.com:80-443", "10.0.0.0/8:1-1024"}, []string{"up:443=127.0.0.1:9"})
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, host string, port int) {
		pl, fl := pol.plan(host, port, nil)
		if fl != nil {
			require.True(t, fl.Code.Valid() && fl.Code != protocol.EgressOK)
			require.LessOrEqual(t, len(fl.Reason), 400)
			require.True(t, utf8.ValidString(fl.Reason))
			require.False(t, strings.ContainsFunc(fl.Reason, func(r rune) bool { return r < 0x20 || r == 0x7f }))
			return
		}
		require.True(t, pl.upstream != nil || pl.host.IsIP() || pl.resolve, "%+v", pl)
		if pl.host.IsIP() && pl.upstream == nil {
			_, _, _ = pol.pick(pl, []netip.Addr{pl.host.IP})
		}
	})
}
