package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/oac/sandbox-agent/internal/safetext"
	"golang.org/x/net/idna"
)

// Errors from ParseHost; the broker maps them to failure codes.
var (
	// ErrInvalidHost: not a DNS name or an IP literal (InvalidArgument).
	ErrInvalidHost = errors.New("not a valid host name or IP address")
	// ErrZone: an IPv6 literal with a zone; always refused (Denied).
	ErrZone = errors.New("addresses with a zone are always refused")
)

// MaxName is the longest DNS name accepted, in ASCII form.
const MaxName = 253

// Host is a normalized target host: either a DNS name in lowercase ASCII
// (IDNA applied, no trailing dot) or an IP address (IPv4-mapped IPv6
// unmapped to IPv4).
type Host struct {
	Name string
	IP   netip.Addr
}

// IsIP reports whether the host is an IP literal.
func (h Host) IsIP() bool { return h.IP.IsValid() }

func (h Host) String() string {
	if h.IsIP() {
		return h.IP.String()
	}
	return h.Name
}

// JoinHostPort formats host and port, bracketing IPv6.
func JoinHostPort(h Host, port int) string {
	if h.IsIP() {
		return netip.AddrPortFrom(h.IP, uint16(port)).String()
	}
	return h.Name + ":" + strconv.Itoa(port)
}

// ParseHost normalizes a host as a client may spell it: surrounding
// brackets, mixed case, one trailing dot, internationalized names (IDNA
// lookup profile, so full-width digits and dots become ASCII first), and
// every IPv4 spelling inet_aton accepts: decimal, octal and hex parts, and
// one to four parts ("127.1", "0x7f000001", "017700000001"). A name whose
// last label is numeric is an IPv4 address or invalid, never a DNS name.
func ParseHost(raw string) (Host, error) {
	s := raw
	if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
		s = s[1 : len(s)-1]
		if strings.Contains(s, "%") {
			return Host{}, ErrZone
		}
		ip, err := netip.ParseAddr(s)
		if err != nil || !ip.Is6() {
			return Host{}, ErrInvalidHost
		}
		return Host{IP: ip.Unmap()}, nil
	}
	if s == "" || len(s) > 4*MaxName {
		return Host{}, ErrInvalidHost
	}
	if ip, err := netip.ParseAddr(s); err == nil {
		if ip.Zone() != "" {
			return Host{}, ErrZone
		}
		return Host{IP: ip.Unmap()}, nil
	}
	if strings.Contains(s, "%") {
		if i := strings.IndexByte(s, '%'); i > 0 {
			if _, err := netip.ParseAddr(s[:i]); err == nil {
				return Host{}, ErrZone
			}
		}
		return Host{}, ErrInvalidHost
	}
	if !utf8.ValidString(s) {
		return Host{}, ErrInvalidHost
	}
	if !isASCII(s) || hasPunycode(s) {
		a, err := idna.Lookup.ToASCII(s)
		if err != nil {
			return Host{}, ErrInvalidHost
		}
		s = a
		// IDNA mapping may have produced an IPv6 literal? It maps ':' to
		// nothing valid under STD3 rules, so only IPv4 forms remain.
	}
	s = strings.ToLower(s)
	s = strings.TrimSuffix(s, ".")
	if s == "" {
		return Host{}, ErrInvalidHost
	}
	labels := strings.Split(s, ".")
	if numericLabel(labels[len(labels)-1]) {
		ip, ok := parseIPv4Loose(labels)
		if !ok {
			return Host{}, ErrInvalidHost
		}
		return Host{IP: ip}, nil
	}
	if len(s) > MaxName {
		return Host{}, ErrInvalidHost
	}
	for _, l := range labels {
		if !validLabel(l) {
			return Host{}, ErrInvalidHost
		}
	}
	return Host{Name: s}, nil
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

func hasPunycode(s string) bool {
	for _, l := range strings.Split(strings.ToLower(s), ".") {
		if strings.HasPrefix(l, "xn--") {
			return true
		}
	}
	return false
}

// validLabel accepts letters, digits, '-' and '_' (some real hosts use
// underscores), 1 to 63 bytes, not starting or ending with '-'.
func validLabel(l string) bool {
	if len(l) == 0 || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
		return false
	}
	for i := 0; i < len(l); i++ {
		c := l[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// numericLabel reports whether l looks like an IPv4 part: decimal digits or
// 0x followed by hex digits (an empty "0x" counts, as in inet_aton).
func numericLabel(l string) bool {
	if l == "" {
		return false
	}
	if strings.HasPrefix(l, "0x") {
		for i := 2; i < len(l); i++ {
			if !isHex(l[i]) {
				return false
			}
		}
		return true
	}
	for i := 0; i < len(l); i++ {
		if l[i] < '0' || l[i] > '9' {
			return false
		}
	}
	return true
}

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' }

// parseIPv4Loose parses 1 to 4 inet_aton parts: the last part fills the
// remaining bytes ("127.1" is 127.0.0.1).
func parseIPv4Loose(parts []string) (netip.Addr, bool) {
	if len(parts) < 1 || len(parts) > 4 {
		return netip.Addr{}, false
	}
	vals := make([]uint64, len(parts))
	for i, p := range parts {
		v, ok := parsePart(p)
		if !ok {
			return netip.Addr{}, false
		}
		vals[i] = v
	}
	var ip uint64
	for i := 0; i < len(vals)-1; i++ {
		if vals[i] > 255 {
			return netip.Addr{}, false
		}
		ip |= vals[i] << (8 * (3 - i))
	}
	last := vals[len(vals)-1]
	if last >= 1<<(8*(4-(len(vals)-1))) {
		return netip.Addr{}, false
	}
	ip |= last
	return netip.AddrFrom4([4]byte{byte(ip >> 24), byte(ip >> 16), byte(ip >> 8), byte(ip)}), true
}

func parsePart(p string) (uint64, bool) {
	base := 10
	switch {
	case strings.HasPrefix(p, "0x"):
		p, base = p[2:], 16
		if p == "" {
			return 0, true
		}
	case len(p) > 1 && p[0] == '0':
		p, base = p[1:], 8
	}
	if len(p) > 12 {
		return 0, false
	}
	v, err := strconv.ParseUint(p, base, 64)
	if err != nil {
		return 0, false
	}
	return v, true
}

// safeText makes a guest-supplied string fit for an event or an error:
// valid UTF-8, control characters as '?', at most n bytes (and "...").
func safeText(s string, n int) string { return safetext.Clean(s, n, '?') }

// describe says what a port range is, for reasons.
func portText(lo, hi uint16) string {
	if lo == hi {
		return strconv.Itoa(int(lo))
	}
	return fmt.Sprintf("%d-%d", lo, hi)
}
