package transparent

import (
	"net/netip"

	"github.com/oac/sandbox-agent/protocol"
)

// DefaultPrefix6 is the IPv6 range of made-up addresses
// (protocol.GuestAddrPrefix6, a unique local /96 the host refuses as a
// destination). A name's IPv6 address is its IPv4 one in the last 32
// bits, so the pool keeps one table for both families: a name holds its
// two addresses together and loses them together.
var DefaultPrefix6 = protocol.GuestAddrPrefix6

// Addr6 returns the IPv6 address of name (assigning its IPv4 one when it
// has none, as Addr does).
func (p *Pool) Addr6(name string) netip.Addr { return embed6(p.Addr(name)) }

// Self6 is the guest's own IPv6 address in the range (the source of the
// IPv6 default route through lo).
func (p *Pool) Self6() netip.Addr { return embed6(p.Self()) }

// Prefix6 is the IPv6 range, as lo's address carries it.
func (p *Pool) Prefix6() netip.Prefix { return DefaultPrefix6 }

// embed6 puts an IPv4 address in the last 32 bits of DefaultPrefix6.
func embed6(a netip.Addr) netip.Addr {
	b := DefaultPrefix6.Addr().As16()
	v4 := a.As4()
	copy(b[12:], v4[:])
	return netip.AddrFrom16(b)
}

// as4 returns the IPv4 address a stands for: an IPv4-mapped address
// unmapped, a made-up IPv6 address as the IPv4 one it carries; anything
// else unchanged (an IPv6 address outside the range never matches an
// IPv4 pool).
func as4(a netip.Addr) netip.Addr {
	a = a.Unmap()
	if a.Is6() && a.Zone() == "" && DefaultPrefix6.Contains(a) {
		b := a.As16()
		return netip.AddrFrom4([4]byte(b[12:]))
	}
	return a
}
