package egress

import "net/netip"

// addrClass is one entry of the refused-address table.
type addrClass struct {
	prefix netip.Prefix
	name   string
	// global: the entry is globally reachable, so an address whose
	// narrowest entry it is, is not refused (e.g. 192.0.0.9/32 inside
	// 192.0.0.0/24).
	global bool
}

type classRow struct {
	prefix string
	name   string
	global bool
	source string // the registry or RFC the row comes from
}

// specialPurpose is the IANA IPv4 and IPv6 Special-Purpose Address
// Registries (iana-ipv4-special-registry, iana-ipv6-special-registry),
// entry by entry, with each entry's "Globally Reachable" column (N/A is
// not globally reachable), followed by the blocks that are not in those
// registries but are never a destination on the internet (marked "extra").
// An address is classified by its narrowest entry: it is refused unless
// that entry is globally reachable. Tests walk this table.
var specialPurpose = []classRow{
	// IANA IPv4 Special-Purpose Address Registry.
	{"0.0.0.0/8", "'this network' (0.0.0.0/8)", false, "RFC 791 section 3.2"},
	{"0.0.0.0/32", "'this host on this network' (0.0.0.0/32)", false, "RFC 1122 section 3.2.1.3"},
	{"10.0.0.0/8", "private (RFC 1918)", false, "RFC 1918"},
	{"100.64.0.0/10", "shared address space (CGNAT, 100.64.0.0/10)", false, "RFC 6598"},
	{"127.0.0.0/8", "loopback", false, "RFC 1122 section 3.2.1.3"},
	{"169.254.0.0/16", "link-local (169.254.0.0/16, cloud metadata)", false, "RFC 3927"},
	{"172.16.0.0/12", "private (RFC 1918)", false, "RFC 1918"},
	{"192.0.0.0/24", "IETF protocol assignments (192.0.0.0/24)", false, "RFC 6890 section 2.1"},
	{"192.0.0.0/29", "IPv4 service continuity prefix (192.0.0.0/29)", false, "RFC 7335"},
	{"192.0.0.8/32", "the IPv4 dummy address (192.0.0.8)", false, "RFC 7600"},
	{"192.0.0.9/32", "port control protocol anycast", true, "RFC 7723"},
	{"192.0.0.10/32", "TURN anycast", true, "RFC 8155"},
	{"192.0.0.170/32", "NAT64/DNS64 discovery (192.0.0.170)", false, "RFC 8880, RFC 7050 section 2.2"},
	{"192.0.0.171/32", "NAT64/DNS64 discovery (192.0.0.171)", false, "RFC 8880, RFC 7050 section 2.2"},
	{"192.0.2.0/24", "documentation (TEST-NET-1, 192.0.2.0/24)", false, "RFC 5737"},
	{"192.31.196.0/24", "AS112-v4", true, "RFC 7535"},
	{"192.52.193.0/24", "AMT", true, "RFC 7450"},
	{"192.88.99.0/24", "deprecated 6to4 relay anycast (192.88.99.0/24)", false, "RFC 7526"},
	{"192.88.99.2/32", "6a44 relay anycast (192.88.99.2)", false, "RFC 6751"},
	{"192.168.0.0/16", "private (RFC 1918)", false, "RFC 1918"},
	{"192.175.48.0/24", "direct delegation AS112 service", true, "RFC 7534"},
	{"198.18.0.0/15", "benchmarking (198.18.0.0/15)", false, "RFC 2544"},
	{"198.51.100.0/24", "documentation (TEST-NET-2, 198.51.100.0/24)", false, "RFC 5737"},
	{"203.0.113.0/24", "documentation (TEST-NET-3, 203.0.113.0/24)", false, "RFC 5737"},
	{"240.0.0.0/4", "reserved (240.0.0.0/4)", false, "RFC 1112 section 4"},
	{"255.255.255.255/32", "broadcast", false, "RFC 8190, RFC 919 section 7"},

	// IANA IPv6 Special-Purpose Address Registry.
	{"::1/128", "loopback", false, "RFC 4291"},
	{"::/128", "unspecified (::)", false, "RFC 4291"},
	{"::ffff:0:0/96", "IPv4-mapped IPv6 (::ffff:0:0/96)", false, "RFC 4291"},
	{"64:ff9b::/96", "the NAT64 well-known prefix", true, "RFC 6052"},
	{"64:ff9b:1::/48", "local-use NAT64 (64:ff9b:1::/48)", false, "RFC 8215"},
	{"100::/64", "discard-only (100::/64)", false, "RFC 6666"},
	{"100:0:0:1::/64", "the dummy IPv6 prefix (100:0:0:1::/64)", false, "RFC 9780"},
	{"2001::/23", "IETF protocol assignments (2001::/23)", false, "RFC 2928"},
	{"2001::/32", "Teredo (2001::/32)", false, "RFC 4380, RFC 8190"},
	{"2001:1::1/128", "port control protocol anycast", true, "RFC 7723"},
	{"2001:1::2/128", "TURN anycast", true, "RFC 8155"},
	{"2001:1::3/128", "DNS-SD service registration protocol anycast", true, "RFC 9665"},
	{"2001:2::/48", "benchmarking (2001:2::/48)", false, "RFC 5180, RFC Errata 1752"},
	{"2001:3::/32", "AMT", true, "RFC 7450"},
	{"2001:4:112::/48", "AS112-v6", true, "RFC 7535"},
	{"2001:10::/28", "deprecated ORCHID (2001:10::/28)", false, "RFC 4843"},
	{"2001:20::/28", "ORCHIDv2", true, "RFC 7343"},
	{"2001:30::/28", "drone remote ID entity tags", true, "RFC 9374"},
	{"2001:db8::/32", "documentation (2001:db8::/32)", false, "RFC 3849"},
	{"2002::/16", "6to4 (2002::/16)", false, "RFC 3056"},
	{"2620:4f:8000::/48", "direct delegation AS112 service", true, "RFC 7534"},
	{"3fff::/20", "documentation (3fff::/20)", false, "RFC 9637"},
	{"5f00::/16", "segment routing SIDs (5f00::/16)", false, "RFC 9602"},
	{"fc00::/7", "unique local (fc00::/7)", false, "RFC 4193, RFC 8190"},
	{"fe80::/10", "link-local (fe80::/10)", false, "RFC 4291"},

	// Extra: not in the special-purpose registries, never a destination
	// on the internet.
	{"169.254.169.254/32", "cloud metadata (link-local)", false, "extra: the metadata service of most clouds"},
	{"224.0.0.0/4", "multicast", false, "extra: RFC 5771 (IPv4 multicast address space registry)"},
	{"::/96", "IPv4-compatible IPv6 (::/96, deprecated)", false, "extra: RFC 4291 section 2.5.5.1"},
	{"::ffff:0:0:0/96", "IPv4-translated IPv6 (::ffff:0:0:0/96)", false, "extra: RFC 2765 section 2.1"},
	{"fec0::/10", "site-local (fec0::/10, deprecated)", false, "extra: RFC 3879"},
	{"ff00::/8", "multicast", false, "extra: RFC 4291 section 2.7"},
	// IPv6 Address Space registry: only 2000::/3 is global unicast; the
	// rest is reserved by the IETF or special (64:ff9b::/96, a narrower
	// entry above, stays reachable).
	{"::/3", "outside IPv6 global unicast (2000::/3)", false, "extra: IANA IPv6 address space registry"},
	{"4000::/2", "outside IPv6 global unicast (2000::/3)", false, "extra: IANA IPv6 address space registry"},
	{"8000::/1", "outside IPv6 global unicast (2000::/3)", false, "extra: IANA IPv6 address space registry"},
}

// refusedClasses is specialPurpose parsed.
var refusedClasses = func() []addrClass {
	out := make([]addrClass, 0, len(specialPurpose))
	for _, r := range specialPurpose {
		out = append(out, addrClass{netip.MustParsePrefix(r.prefix), r.name, r.global})
	}
	return out
}()

var (
	nat64  = netip.MustParsePrefix("64:ff9b::/96")
	zeroV4 = netip.AddrFrom4([4]byte{})
	zeroV6 = netip.IPv6Unspecified()
)

// alwaysRefused reports addresses no rule can allow: 0.0.0.0 and :: (and
// their mapped forms). Zones never get this far (ParseHost refuses them;
// resolvers return none).
func alwaysRefused(ip netip.Addr) (string, bool) {
	ip = ip.Unmap()
	if ip.Zone() != "" {
		return "an address with a zone", true
	}
	if ip == zeroV4 || ip == zeroV6 {
		return "the unspecified address " + ip.String(), true
	}
	return "", false
}

// narrowest returns the narrowest entry of the table containing ip.
func narrowest(ip netip.Addr) (addrClass, bool) {
	var best addrClass
	found := false
	for _, c := range refusedClasses {
		if c.prefix.Contains(ip) && (!found || c.prefix.Bits() > best.prefix.Bits()) {
			best, found = c, true
		}
	}
	return best, found
}

// refusedClass returns the name of the refused class ip belongs to: its
// narrowest entry in the table when that entry is not globally reachable.
// An address in the NAT64 well-known prefix (64:ff9b::/96) is checked
// as the IPv4 address it carries.
func refusedClass(ip netip.Addr) (string, bool) {
	ip = ip.Unmap().WithZone("")
	c, ok := narrowest(ip)
	if ok && !c.global {
		return c.name, true
	}
	if ip.Is6() && nat64.Contains(ip) {
		b := ip.As16()
		if name, bad := refusedClass(netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]})); bad {
			return name + " embedded in IPv6", true
		}
	}
	return "", false
}
