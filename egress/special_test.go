package egress

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/protocol"
)

// samples returns addresses of p: its first, second, middle and last.
func samples(p netip.Prefix) []netip.Addr {
	first := p.Masked().Addr()
	out := []netip.Addr{first}
	if n := first.Next(); n.IsValid() && p.Contains(n) {
		out = append(out, n)
	}
	b := first.AsSlice()
	last := append([]byte(nil), b...)
	for i := p.Bits(); i < len(b)*8; i++ {
		last[i/8] |= 0x80 >> (i % 8)
	}
	mid := append([]byte(nil), b...)
	if p.Bits() < len(b)*8 {
		mid[p.Bits()/8] |= 0x80 >> (p.Bits() % 8) >> 1
		if p.Bits()%8 == 7 {
			mid[p.Bits()/8] |= 1
		}
	}
	for _, s := range [][]byte{mid, last} {
		a, _ := netip.AddrFromSlice(s)
		if p.Contains(a) {
			out = append(out, a)
		}
	}
	return out
}

// Every entry of the special-purpose registries, through a name rule an
// attacker's DNS controls: an entry that is not globally reachable is
// refused at every sample address whose narrowest entry it is; a globally
// reachable one is allowed (the NAT64 prefix by the IPv4 it carries).
func TestEverySpecialPurposeEntryThatIsNotGloballyReachableIsRefused(t *testing.T) {
	pol, err := ParsePolicy([]string{"*.attacker.example:443"}, nil)
	require.NoError(t, err)
	checked := 0
	for _, row := range specialPurpose {
		p := netip.MustParsePrefix(row.prefix)
		tested := false
		for _, a := range samples(p) {
			if c, _ := narrowest(a); c.prefix != p {
				continue
			}
			tested = true
			checked++
			d := pol.DecideOn(nil, "x.attacker.example", 443, func(string) ([]netip.Addr, error) { return []netip.Addr{a}, nil })
			lit := pol.DecideOn(nil, a.String(), 443, nil)
			dns := pol.DecideName(nil, "x.attacker.example", func(string) ([]netip.Addr, error) { return []netip.Addr{a}, nil })
			global := row.global
			if p == nat64 || p == netip.MustParsePrefix("::ffff:0:0/96") {
				// A mapped or NAT64 address is the IPv4 address it carries.
				b := a.As16()
				_, bad := refusedClass(netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]}))
				global = !bad
			}
			if global {
				assert.Nil(t, d.Failure, "%s (%s, %s) is globally reachable", a, row.name, row.source)
				assert.Nil(t, dns.Failure, "%s over DNS", a)
				continue
			}
			require.NotNil(t, d.Failure, "%s (%s, %s) must be refused", a, row.name, row.source)
			assert.Equal(t, protocol.EgressDenied, d.Failure.Code, "%s", a)
			assert.NotNil(t, lit.Failure, "%s as a literal", a)
			assert.NotNil(t, dns.Failure, "%s over DNS", a)
		}
		assert.True(t, tested, "no sample of %s has it as its narrowest entry", row.prefix)
		assert.NotEmpty(t, row.source, "%s cites its source", row.prefix)
	}
	assert.Greater(t, checked, 2*len(specialPurpose))
	// The NAT64 prefix carries a public IPv4 address: allowed.
	d := pol.DecideOn(nil, "x.attacker.example", 443, func(string) ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("64:ff9b::5db8:d822")}, nil
	})
	assert.Nil(t, d.Failure)
	for _, a := range []string{"::ffff:0:7f00:1", "::ffff:0:5db8:d822", "64:ff9b:1::5db8:d822", "2001:0:5db8:d822::1", "2002:5db8:d822::1", "4000::1", "1000::1"} {
		d := pol.DecideOn(nil, "x.attacker.example", 443, func(string) ([]netip.Addr, error) { return []netip.Addr{netip.MustParseAddr(a)}, nil })
		assert.NotNil(t, d.Failure, "%s", a)
	}
}

func TestWildcardsOnAPublicSuffixAreRefused(t *testing.T) {
	for _, in := range []string{"*.com:443", "*.co.uk:443", "*.github.io:443", "*.COM.:443", "*.test:80", "*.foo.ck:443", "*.xn--p1ai:443"} {
		_, err := ParseRule(in)
		if assert.ErrorIs(t, err, ErrRule, in) {
			assert.Contains(t, err.Error(), "is a public suffix", in)
			assert.Contains(t, err.Error(), "there is no allow-all", in)
		}
	}
	for _, in := range []string{"*.example.com:443", "*.example.co.uk:443", "*.me.github.io:443", "*.www.ck:443", "com:443", "*.rebind.test:80"} {
		_, err := ParseRule(in)
		assert.NoError(t, err, in)
	}
}

func TestPortRangesAmountingToEveryPortAreRefused(t *testing.T) {
	for _, in := range []string{"example.com:1-65535", "example.com:1-1025", "*.example.com:1024-65535", "10.0.0.0/8:2-65535"} {
		_, err := ParseRule(in)
		if assert.ErrorIs(t, err, ErrRule, in) {
			assert.Contains(t, err.Error(), "amounts to every port", in)
		}
	}
	_, err := ParsePolicy([]string{"example.com:1-1024"}, nil)
	assert.NoError(t, err)
	_, err = ParsePolicy([]string{"example.com:1-1000", "example.com:500-1024", "other.example.com:1-1024"}, nil)
	assert.NoError(t, err, "overlapping ranges count once, and per host")
	_, err = ParsePolicy([]string{"example.com:1-600", "example.com:601-1200"}, nil)
	if assert.ErrorIs(t, err, ErrRule) {
		assert.Contains(t, err.Error(), "the port ranges for example.com cover 1200 ports")
	}
	// Naming each port is the way to many ports.
	var each []string
	for p := 1; p <= MaxRules; p++ {
		each = append(each, "example.com:"+itoa(p))
	}
	_, err = ParsePolicy(append(each[:MaxRules-1], "example.com:2000-3000"), nil)
	assert.NoError(t, err)
}

// flipOwner says no the first time it is asked and yes after: an address
// the host gained between the check and the dial.
type flipOwner struct{ calls atomic.Int32 }

func (f *flipOwner) Owner(netip.Addr) (string, bool) { return "eth9", f.calls.Add(1) > 1 }

func TestHostAddressesAreRefusedWhateverTheirRange(t *testing.T) {
	own := NewAddrSet()
	own.Add(netip.MustParseAddr("93.184.216.34"), "eth0")
	own.Add(netip.MustParseAddr("2606:4700::9"), "eth0")
	own.AddPrefix(netip.MustParsePrefix("127.0.0.0/8"), "lo")
	pol, err := ParsePolicy([]string{"*.attacker.example:443", "93.184.0.0/16:443", "127.0.0.0/8:8080", "127.0.0.2:8081"}, []string{"gw:443=93.184.216.34:443"})
	require.NoError(t, err)
	for _, a := range []string{"93.184.216.34", "2606:4700::9", "::ffff:93.184.216.34"} {
		d := pol.DecideOn(own, "x.attacker.example", 443, func(string) ([]netip.Addr, error) { return []netip.Addr{netip.MustParseAddr(a)}, nil })
		if assert.NotNil(t, d.Failure, a) {
			assert.Contains(t, d.Failure.Reason, "is an address of this host (eth0)", a)
			assert.Equal(t, protocol.EgressDenied, d.Failure.Code)
		}
		dns := pol.DecideName(own, "x.attacker.example", func(string) ([]netip.Addr, error) { return []netip.Addr{netip.MustParseAddr(a)}, nil })
		assert.NotNil(t, dns.Failure, a)
	}
	d := pol.DecideOn(own, "93.184.216.34", 443, nil)
	if assert.NotNil(t, d.Failure, "a CIDR rule wider than the address does not open the host") {
		assert.Contains(t, d.Failure.Reason, "93.184.216.34 is an address of this host (eth0)")
	}
	assert.Nil(t, pol.DecideOn(own, "93.184.216.35", 443, nil).Failure, "the rest of the prefix is allowed")
	assert.NotNil(t, pol.DecideOn(own, "127.0.0.1", 8080, nil).Failure, "127.0.0.0/8 does not name the host's loopback address")
	assert.Nil(t, pol.DecideOn(own, "127.0.0.2", 8081, nil).Failure, "a rule naming the address allows it")
	assert.Nil(t, pol.DecideOn(own, "gw", 443, nil).Failure, "a named upstream is trusted")
	// The same address on a host that does not hold it.
	assert.Nil(t, pol.DecideOn(nil, "93.184.216.34", 443, nil).Failure)
}

// The test machine's own addresses, every one of them, as the system
// watcher reports them.
func TestTheMachinesOwnAddressesAreRefused(t *testing.T) {
	ifaddrs, err := net.InterfaceAddrs()
	require.NoError(t, err)
	pol, err := ParsePolicy([]string{"*.attacker.example:443"}, nil)
	require.NoError(t, err)
	sys := SystemHostAddrs()
	n := 0
	for _, ia := range ifaddrs {
		ipn, ok := ia.(*net.IPNet)
		if !ok {
			continue
		}
		a, _ := netip.AddrFromSlice(ipn.IP)
		a = a.Unmap()
		n++
		_, own := sys.Owner(a)
		assert.True(t, own, "%s is this machine's", a)
		d := pol.DecideOn(sys, "x.attacker.example", 443, func(string) ([]netip.Addr, error) { return []netip.Addr{a}, nil })
		assert.NotNil(t, d.Failure, "%s", a)
		// Only as a host address: a CIDR rule lifts its class but not that.
		if !a.Is6() || !a.IsLinkLocalUnicast() {
			bits := 24
			if a.Is6() {
				bits = 64
			}
			wide, err := ParsePolicy([]string{"*.attacker.example:443", netip.PrefixFrom(a, bits).Masked().String() + ":443"}, nil)
			if strings.Contains(a.String(), ":") {
				wide, err = ParsePolicy([]string{"*.attacker.example:443", "[" + netip.PrefixFrom(a, bits).Masked().String() + "]:443"}, nil)
			}
			require.NoError(t, err)
			d := wide.DecideOn(sys, "x.attacker.example", 443, func(string) ([]netip.Addr, error) { return []netip.Addr{a}, nil })
			if assert.NotNil(t, d.Failure, "%s under a CIDR rule for its subnet", a) {
				assert.Contains(t, d.Failure.Reason, "is an address of this host")
			}
		}
	}
	assert.Positive(t, n)
}

// An address that became the host's between the check and the dial is
// refused by the dialer's Control hook: no connection reaches it.
func TestAnAddressTheHostGainedBeforeTheDialIsRefusedAtDialTime(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	var accepted atomic.Int32
	go countAccepted(ln, &accepted)
	port := ln.Addr().(*net.TCPAddr).Port
	pol, err := ParsePolicy([]string{"*.flip.test:" + itoa(port), "127.0.0.0/8:" + itoa(port)}, nil)
	require.NoError(t, err)
	b := New(Config{Policy: pol, HostAddrs: &flipOwner{}, Resolver: fakeDNS{"a.flip.test": {"127.0.0.1"}}})
	var socket atomic.Int32
	b.dialed = func(string, string) { socket.Add(1) }
	ev := serveOne(t, b, "a.flip.test", port)
	assert.Equal(t, DecisionDenied, ev.Decision)
	assert.Contains(t, ev.Reason, "resolves to 127.0.0.1, which is an address of this host (eth9)")
	assert.Equal(t, int32(1), socket.Load(), "the socket was created and refused before its connect")
	time.Sleep(50 * time.Millisecond)
	assert.Zero(t, accepted.Load(), "nothing reached the listener")
}

// countAccepted counts and closes what reaches ln until it is closed.
func countAccepted(ln net.Listener, n *atomic.Int32) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		n.Add(1)
		c.Close()
	}
}

// serveOne runs one egress stream through b and returns its decision event.
func serveOne(t *testing.T, b *Broker, host string, port int) api.Event {
	t.Helper()
	g, h := net.Pipe()
	got := make(chan api.Event, 4)
	go b.Serve(context.Background(), h, protocol.StreamHeader{Kind: protocol.KindEgress, Host: host, Port: port, Via: protocol.ViaConnect},
		func(e api.Event) { got <- e })
	r, err := protocol.ReadEgressReply(g, 10*time.Second)
	require.NoError(t, err)
	g.Close()
	e := <-got
	assert.Equal(t, r.Code.String(), map[bool]string{true: "OK", false: e.Code}[e.Code == ""])
	return e
}
