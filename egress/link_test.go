package egress

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/protocol"
)

func TestTheLinkRuleIsExactlyTheLinksHostAndPort(t *testing.T) {
	for url, want := range map[string]string{
		"wss://relay.example.com/v1/link":  "link relay.example.com:443",
		"wss://Relay.Example.COM./v1/link": "link relay.example.com:443",
		"wss://relay.example.com:8443/l":   "link relay.example.com:8443",
		"ws://relay.example.com/l":         "link relay.example.com:80",
		"wss://93.184.216.34/l":            "link 93.184.216.34:443",
		"wss://[2606:4700::9]:9443/l":      "link [2606:4700::9]:9443",
	} {
		r, err := LinkRule(url)
		require.NoError(t, err, url)
		assert.Equal(t, want, r.String(), url)
	}
}

func TestALinkAddressNoNameRuleCouldAllowIsNotAllowedByDefault(t *testing.T) {
	for _, url := range []string{
		"wss://10.0.0.5/l", "wss://127.0.0.1/l", "wss://169.254.169.254/l", "wss://[::1]/l",
		"wss://0.0.0.0/l", "wss://[fd00::1]/l", "wss:///l",
	} {
		_, err := LinkRule(url)
		assert.ErrorIs(t, err, ErrLinkNotAllowed, url)
	}
}

func TestTheLinkAllowsItsTargetAndNothingElse(t *testing.T) {
	dns := fakeDNS{"relay.example.com": {"93.184.216.60"}, "private-relay.example.com": {"10.0.0.7"}, "other.example.com": {"93.184.216.61"}}
	r, err := LinkRule("wss://relay.example.com/l")
	require.NoError(t, err)
	p := (&Policy{}).WithLink(r)

	d := p.DecideOn(nil, "relay.example.com", 443, dns.lookup)
	require.Nil(t, d.Failure)
	assert.Equal(t, "link relay.example.com:443", d.Rule)
	assert.Equal(t, "93.184.216.60:443", d.Address)

	d = p.DecideOn(nil, "relay.example.com", 80, dns.lookup)
	require.NotNil(t, d.Failure, "another port of the Link's host")
	assert.Zero(t, d.Lookups, "a denied port resolves nothing")

	d = p.DecideOn(nil, "other.example.com", 443, dns.lookup)
	require.NotNil(t, d.Failure, "another host on the Link's port")
	assert.Zero(t, d.Lookups)

	d = p.DecideOn(nil, "93.184.216.60", 443, dns.lookup)
	assert.NotNil(t, d.Failure, "the Link's name does not open its address")
}

func TestTheLinksNameMeetsTheSameAddressChecksAsAnyRule(t *testing.T) {
	dns := fakeDNS{"relay.example.com": {"10.0.0.7"}}
	r, err := LinkRule("wss://relay.example.com/l")
	require.NoError(t, err)
	d := (&Policy{}).WithLink(r).DecideOn(nil, "relay.example.com", 443, dns.lookup)
	require.NotNil(t, d.Failure)
	assert.Equal(t, protocol.EgressDenied, d.Failure.Code)
	assert.Contains(t, d.Failure.Reason, "private")
}

func TestALinkAddressIsAllowedLikeANameAndOpensNoClass(t *testing.T) {
	r, err := LinkRule("wss://93.184.216.34/l")
	require.NoError(t, err)
	p := (&Policy{}).WithLink(r)
	d := p.DecideOn(nil, "93.184.216.34", 443, fakeDNS{}.lookup)
	require.Nil(t, d.Failure)
	assert.Equal(t, "link 93.184.216.34:443", d.Rule)

	assert.NotNil(t, p.DecideOn(nil, "93.184.216.34", 444, fakeDNS{}.lookup).Failure)
	d = p.DecideOn(nil, "api.example.com", 443, tableDNS.lookup)
	assert.NotNil(t, d.Failure, "a name on the Link's port")
	assert.Zero(t, d.Lookups, "the Link's address is not a CIDR rule: a name on its port resolves nothing")

	own := NewAddrSet()
	own.Add(netip.MustParseAddr("93.184.216.34"), "eth0")
	d = p.DecideOn(own, "93.184.216.34", 443, fakeDNS{}.lookup)
	require.NotNil(t, d.Failure, "an address of this host is never opened by the Link")
}

func TestEveryPolicyKeepsTheLinkAndDescribesItApart(t *testing.T) {
	b := New(Config{HostAddrs: NewAddrSet()})
	rule, err := b.AllowLink("wss://relay.example.com/l")
	require.NoError(t, err)
	assert.Equal(t, "link relay.example.com:443", rule)

	p, err := ParsePolicy([]string{"api.example.com:443"}, nil)
	require.NoError(t, err)
	b.SetPolicy(p)
	assert.Equal(t, []string{"api.example.com:443"}, b.Policy().Rules(), "the operator's rules only")
	assert.Equal(t, []string{"api.example.com:443", "link relay.example.com:443"}, b.Policy().Describe())
	n, _ := b.Policy().Len()
	assert.Equal(t, 1, n)
	assert.Nil(t, b.Policy().DecideOn(nil, "relay.example.com", 443, fakeDNS{"relay.example.com": {"93.184.216.60"}}.lookup).Failure)

	_, err = b.AllowLink("wss://relay2.example.com/l")
	require.NoError(t, err)
	assert.Equal(t, []string{"api.example.com:443", "link relay2.example.com:443"}, b.Policy().Describe(), "a new Link replaces the old")
	b.SetPolicy(nil)
	assert.Equal(t, []string{"link relay2.example.com:443"}, b.Policy().Describe(), "a policy that denies everything still lets the Link through")
}

func TestTheLinkIsNeverAnAddressOfThisHost(t *testing.T) {
	own := NewAddrSet()
	own.Add(netip.MustParseAddr("93.184.216.34"), "eth0")
	b := New(Config{HostAddrs: own})
	_, err := b.AllowLink("wss://93.184.216.34/l")
	assert.ErrorIs(t, err, ErrLinkNotAllowed)
	assert.Empty(t, b.Policy().Describe())
}
