package egress

import "net/netip"

type addrClass struct {
	prefix netip.Prefix
	name   string
}

// refusedClasses are refused unless a CIDR rule or a named upstream allows
// them explicitly. More specific entries come first so the reason names
// the narrowest class.
var refusedClasses = func() []addrClass {
	var out []addrClass
	for _, c := range [][2]string{
		{"255.255.255.255/32", "broadcast"},
		{"169.254.169.254/32", "cloud metadata (link-local)"},
		{"0.0.0.0/8", "'this network' (0.0.0.0/8)"},
		{"10.0.0.0/8", "private (RFC 1918)"},
		{"100.64.0.0/10", "shared address space (CGNAT, 100.64.0.0/10)"},
		{"127.0.0.0/8", "loopback"},
		{"169.254.0.0/16", "link-local (169.254.0.0/16, cloud metadata)"},
		{"172.16.0.0/12", "private (RFC 1918)"},
		{"192.0.0.0/24", "IETF protocol assignments (192.0.0.0/24)"},
		{"192.168.0.0/16", "private (RFC 1918)"},
		{"198.18.0.0/15", "benchmarking (198.18.0.0/15)"},
		{"224.0.0.0/4", "multicast"},
		{"240.0.0.0/4", "reserved (240.0.0.0/4)"},
		{"::/128", "unspecified (::)"},
		{"::1/128", "loopback"},
		{"::/96", "IPv4-compatible IPv6 (::/96, deprecated)"},
		{"fc00::/7", "unique local (fc00::/7)"},
		{"fe80::/10", "link-local (fe80::/10)"},
		{"fec0::/10", "site-local (fec0::/10, deprecated)"},
		{"ff00::/8", "multicast"},
	} {
		out = append(out, addrClass{netip.MustParsePrefix(c[0]), c[1]})
	}
	return out
}()

var (
	nat64  = netip.MustParsePrefix("64:ff9b::/96")
	sixTo4 = netip.MustParsePrefix("2002::/16")
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

// refusedClass returns the name of the refused class ip belongs to. IPv4
// embedded in IPv6 (mapped, NAT64 64:ff9b::/96, 6to4 2002::/16) is checked
// as the IPv4 address it carries.
func refusedClass(ip netip.Addr) (string, bool) {
	ip = ip.Unmap().WithZone("")
	for _, c := range refusedClasses {
		if c.prefix.Contains(ip) {
			return c.name, true
		}
	}
	if ip.Is6() {
		b := ip.As16()
		var v4 netip.Addr
		switch {
		case nat64.Contains(ip):
			v4 = netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]})
		case sixTo4.Contains(ip):
			v4 = netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]})
		}
		if v4.IsValid() {
			if name, ok := refusedClass(v4); ok {
				return name + " embedded in IPv6", true
			}
		}
	}
	return "", false
}
