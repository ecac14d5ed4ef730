package transparent

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/dns/dnsmessage"
)

func TestAnAllowedNameHasAnIPv6AddressCarryingItsIPv4One(t *testing.T) {
	p := NewPool(DefaultPrefix)
	a4 := p.Addr("api.example.test")
	a6 := p.Addr6("api.example.test")
	assert.Equal(t, "198.18.0.2", a4.String())
	assert.Equal(t, "fd2c:6ff4:6006::c612:2", a6.String())
	assert.Equal(t, "fd2c:6ff4:6006::c612:1", p.Self6().String(), "the guest's own, beside 198.18.0.1")
	assert.Equal(t, a6, p.Addr6("api.example.test"), "stable")

	for _, a := range []netip.Addr{a4, a6, netip.MustParseAddr("::ffff:198.18.0.2")} {
		n, ok := p.Name(a)
		assert.True(t, ok, "%s", a)
		assert.Equal(t, "api.example.test", n, "%s", a)
		assert.True(t, p.Contains(a), "%s", a)
	}
	assert.Equal(t, "api.example.test", p.Unmap("[fd2c:6ff4:6006::c612:2]"))
	assert.Equal(t, "api.example.test", p.Unmap("fd2c:6ff4:6006::c612:2"))

	// An IPv6 address of the range no name holds stays an address (the
	// host refuses it, saying so); other IPv6 addresses are never the
	// pool's, even when their last 32 bits look like one.
	assert.Equal(t, "fd2c:6ff4:6006::c612:99", p.Unmap("fd2c:6ff4:6006::c612:99"))
	assert.True(t, p.Contains(netip.MustParseAddr("fd2c:6ff4:6006::c612:99")))
	for _, s := range []string{"2001:db8::c612:2", "64:ff9b::c612:2", "fd2c:6ff4:6006:1::c612:2", "::c612:2", "fd2c:6ff4:6006::c612:2%lo"} {
		a := netip.MustParseAddr(s)
		assert.False(t, p.Contains(a), s)
		_, ok := p.Name(a)
		assert.False(t, ok, s)
		assert.Equal(t, s, p.Unmap(s))
	}
	assert.True(t, DefaultPrefix6.Contains(a6))
	assert.Equal(t, 96, p.Prefix6().Bits())
}

func TestResolverAnswersAAAAOnlyOnceIPv6IsCaptured(t *testing.T) {
	r, asked := testResolver()
	ctx := context.Background()
	m := parse(t, r.Handle(ctx, query(t, "api.example.test.", dnsmessage.TypeAAAA, false), true))
	assert.Equal(t, dnsmessage.RCodeSuccess, m.Header.RCode)
	assert.Empty(t, m.Answers, "no IPv6 capture: no IPv6 address, nothing for Happy Eyeballs")
	m = parse(t, r.Handle(ctx, query(t, "localhost.", dnsmessage.TypeAAAA, false), true))
	assert.Empty(t, m.Answers)

	r.SetIPv6(true)
	m = parse(t, r.Handle(ctx, query(t, "api.example.test.", dnsmessage.TypeAAAA, false), true))
	assert.Equal(t, dnsmessage.RCodeSuccess, m.Header.RCode)
	require.Len(t, m.Answers, 1)
	a6 := netip.AddrFrom16(m.Answers[0].Body.(*dnsmessage.AAAAResource).AAAA)
	assert.Equal(t, "fd2c:6ff4:6006::c612:2", a6.String())
	m = parse(t, r.Handle(ctx, query(t, "api.example.test.", dnsmessage.TypeA, false), true))
	assert.Equal(t, [4]byte{198, 18, 0, 2}, m.Answers[0].Body.(*dnsmessage.AResource).A, "the same name's IPv4 address")
	assert.Equal(t, int32(1), asked.Load(), "asked once for both families")

	// ANY: both.
	m = parse(t, r.Handle(ctx, query(t, "api.example.test.", dnsmessage.TypeALL, false), true))
	require.Len(t, m.Answers, 2)

	// A denied name is NXDOMAIN for AAAA too.
	m = parse(t, r.Handle(ctx, query(t, "denied.test.", dnsmessage.TypeAAAA, true), true))
	assert.Equal(t, dnsmessage.RCodeNameError, m.Header.RCode)
	assert.Empty(t, m.Answers)

	m = parse(t, r.Handle(ctx, query(t, "localhost.", dnsmessage.TypeAAAA, false), true))
	require.Len(t, m.Answers, 1)
	assert.Equal(t, netip.IPv6Loopback().As16(), m.Answers[0].Body.(*dnsmessage.AAAAResource).AAAA)

	// PTR of the IPv6 fake address maps back; no other leaves the guest.
	m = parse(t, r.Handle(ctx, query(t, reverse6(a6), dnsmessage.TypePTR, false), true))
	require.Len(t, m.Answers, 1)
	assert.Equal(t, "api.example.test.", m.Answers[0].Body.(*dnsmessage.PTRResource).PTR.String())
	m = parse(t, r.Handle(ctx, query(t, reverse6(netip.MustParseAddr("2001:db8::1")), dnsmessage.TypePTR, false), true))
	assert.Equal(t, dnsmessage.RCodeNameError, m.Header.RCode)
	assert.Equal(t, int32(2), asked.Load(), "the host was asked for api.example.test and denied.test only")
}

func TestReverseIPv6NamesAreReadNibbleByNibble(t *testing.T) {
	for _, s := range []string{"fd2c:6ff4:6006::c612:2", "::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "2001:db8::1"} {
		a := netip.MustParseAddr(s)
		got, ok := parseReverseV6(reverse6(a))
		assert.True(t, ok, s)
		assert.Equal(t, a, got)
	}
	good := reverse6(netip.MustParseAddr("2001:db8::1"))
	for _, bad := range []string{
		"ip6.arpa.",
		"1.0.ip6.arpa.",
		strings.Replace(good, "8", "g", 1),          // not a hex digit
		strings.Replace(good, "1.0.", "10.", 1),     // a label of two digits
		"0." + good,                                 // 33 nibbles
		strings.TrimPrefix(good, "1."),              // 31 nibbles
		strings.Replace(good, ".ip6.", ".ip7.", 1),  // another suffix
		strings.Replace(good, "1.0.0", "1..0", 1),   // an empty label
		strings.ToUpper(good[:2]) + good[2:] + "x.", // not the suffix
	} {
		_, ok := parseReverseV6(bad)
		assert.False(t, ok, bad)
	}
}

// reverse6 is the ip6.arpa name of a.
func reverse6(a netip.Addr) string {
	b := a.As16()
	var sb strings.Builder
	for i := 15; i >= 0; i-- {
		fmt.Fprintf(&sb, "%x.%x.", b[i]&0xf, b[i]>>4)
	}
	return sb.String() + "ip6.arpa."
}

// FuzzParseReverseV6: whatever a client puts in a PTR question, an
// accepted name is exactly the reverse name of the address it gives.
func FuzzParseReverseV6(f *testing.F) {
	f.Add(reverse6(netip.MustParseAddr("fd2c:6ff4:6006::c612:2")))
	f.Add("1.0.ip6.arpa.")
	f.Add(strings.Repeat("f.", 32) + "ip6.arpa.")
	f.Fuzz(func(t *testing.T, name string) {
		a, ok := parseReverseV6(name)
		if !ok {
			return
		}
		if got := reverse6(a); got != name {
			t.Fatalf("%q read as %s, whose reverse name is %q", name, a, got)
		}
	})
}
