package egress

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/protocol"
)

// Every IPv6 way of naming a destination the broker refuses is refused:
// as a literal (bare and bracketed, as the guest's capture and proxies
// send it) and behind a name a rule allows, whose DNS an attacker runs.
func TestIPv6FormsOfRefusedDestinationsAreRefused(t *testing.T) {
	pol, err := ParsePolicy([]string{"*.attacker.example:443"}, nil)
	require.NoError(t, err)
	for _, c := range []struct{ addr, class string }{
		{"::1", "loopback"},
		{"fe80::1", "link-local (fe80::/10)"},
		{"fe80::fc:ff:fe00:1", "link-local (fe80::/10)"},
		{"fc00::1", "unique local (fc00::/7)"},
		{"fd00::2", "unique local (fc00::/7)"},
		{"fd2c:6ff4:6006::c612:5", "unique local (fc00::/7)"}, // the guest's made-up range
		{"::ffff:127.0.0.1", "loopback"},                      // unmapped: 127.0.0.1
		{"::ffff:169.254.169.254", "cloud metadata"},
		{"::ffff:10.1.2.3", "private (RFC 1918)"},
		{"64:ff9b::7f00:1", "loopback embedded in IPv6"},
		{"64:ff9b::a9fe:a9fe", "cloud metadata (link-local) embedded in IPv6"},
		{"64:ff9b::c0a8:101", "private (RFC 1918) embedded in IPv6"},
		{"64:ff9b::c612:2", "benchmarking (198.18.0.0/15) embedded in IPv6"},
		{"64:ff9b:1::7f00:1", "local-use NAT64"},
		{"::127.0.0.1", "IPv4-compatible"},
		{"::ffff:0:7f00:1", "IPv4-translated"},
		{"ff02::1", "multicast"},
		{"ff0e::1", "multicast"},
		{"fec0::1", "site-local"},
		{"2001:db8::1", "documentation (2001:db8::/32)"},
		{"3fff::1", "documentation (3fff::/20)"},
		{"2002:7f00:1::1", "6to4"},
		{"2002:808:808::1", "6to4"}, // a public IPv4 inside: 6to4 is refused as a whole
		{"2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo"},
		{"2001:2::1", "benchmarking (2001:2::/48)"},
		{"100::1", "discard-only"},
	} {
		a := netip.MustParseAddr(c.addr)
		for _, lit := range []string{c.addr, "[" + c.addr + "]"} {
			d := pol.DecideOn(nil, lit, 443, nil)
			if assert.NotNil(t, d.Failure, "%s must be refused", lit) {
				assert.Equal(t, protocol.EgressDenied, d.Failure.Code, lit)
				assert.Contains(t, d.Failure.Reason, c.class, lit)
			}
		}
		resolve := func(string) ([]netip.Addr, error) { return []netip.Addr{a}, nil }
		d := pol.DecideOn(nil, "x.attacker.example", 443, resolve)
		if assert.NotNil(t, d.Failure, "x.attacker.example resolving to %s", a) {
			assert.Contains(t, d.Failure.Reason, c.class, c.addr)
		}
		assert.NotNil(t, pol.DecideName(nil, "x.attacker.example", resolve).Failure, "%s over DNS", c.addr)
	}
	// Zones are refused whatever the address.
	for _, lit := range []string{"fe80::1%eth0", "[fe80::1%25lo]", "2606:4700::1%1"} {
		d := pol.DecideOn(nil, lit, 443, nil)
		assert.NotNil(t, d.Failure, lit)
	}
}

// A made-up IPv6 address that no name holds in the guest is refused
// saying what it is, as a made-up IPv4 address is.
func TestAMadeUpIPv6AddressIsRefusedSayingSo(t *testing.T) {
	pol, err := ParsePolicy([]string{"api.example.com:443"}, nil)
	require.NoError(t, err)
	a := netip.MustParseAddr("fd2c:6ff4:6006::c612:9")
	require.True(t, protocol.GuestAddrPrefix6.Contains(a))
	d := pol.DecideOn(nil, a.String(), 443, nil)
	require.NotNil(t, d.Failure)
	assert.Equal(t, protocol.EgressDenied, d.Failure.Code)
	assert.Contains(t, d.Failure.Reason, "one of the addresses the sandbox's resolver makes up for names, fd2c:6ff4:6006::/96")
	// Its range is refused as a destination however a name reaches it.
	cls, bad := refusedClass(protocol.GuestAddrPrefix6.Addr())
	assert.True(t, bad)
	assert.Equal(t, "unique local (fc00::/7)", cls)
}

// The NAT64 form of one of the host's IPv4 addresses is the host's: a
// NAT64 gateway would carry the connection back to it.
func TestTheNAT64FormOfAHostAddressIsTheHosts(t *testing.T) {
	own := NewAddrSet()
	own.Add(netip.MustParseAddr("93.184.216.34"), "eth0")
	pol, err := ParsePolicy([]string{"*.attacker.example:443", "[64:ff9b::/96]:443"}, nil)
	require.NoError(t, err)
	nat := netip.MustParseAddr("64:ff9b::5db8:d822")
	d := pol.DecideOn(own, "x.attacker.example", 443, func(string) ([]netip.Addr, error) { return []netip.Addr{nat}, nil })
	if assert.NotNil(t, d.Failure) {
		assert.Contains(t, d.Failure.Reason, "is an address of this host (eth0)")
	}
	d = pol.DecideOn(own, nat.String(), 443, nil)
	if assert.NotNil(t, d.Failure, "a CIDR rule wider than the address does not open the host") {
		assert.Contains(t, d.Failure.Reason, "is an address of this host (eth0)")
	}
	assert.Nil(t, pol.DecideOn(own, "64:ff9b::5db8:d823", 443, nil).Failure, "another public address in NAT64 form is allowed by the rule")
	assert.Nil(t, pol.DecideOn(nil, nat.String(), 443, nil).Failure, "on a host that does not hold it")
}
