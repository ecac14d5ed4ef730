package protocol

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"time"
	"unicode/utf8"
)

// ResolvConf is the guest's /etc/resolv.conf, in every image and every
// default root: the agent's resolver on loopback (package
// guest/transparent), nothing else; the host's egress policy decides every
// name. One text: the image builder writes it, the providers bind it, the
// agent places it and the helper knows it as the agent's own.
const ResolvConf = "# oac-guest: the guest's resolver; the host's egress policy decides every name\n" +
	"nameserver 127.0.0.1\noptions edns0\n"

// CapDNS is the capability a host lists in Welcome when it answers dns
// streams: the guest then runs its resolver and transparent capture (see
// package guest/transparent). A host that lists it also lists CapEgress.
const CapDNS = "dns"

// Egress via values of connections the guest captured transparently.
const (
	// ViaTransparent: a TCP connection captured in the guest (a program
	// that ignores proxy variables), carried like a proxied one.
	ViaTransparent = "transparent"
	// ViaDirect: a workload's connect trapped in the guest and answered
	// with the host's own socket (Connect.Direct).
	ViaDirect = "direct"
	// ViaDNS is the via of the host's events for dns streams.
	ViaDNS = "dns"
)

// GuestAddrPrefix is the range the guest's resolver makes addresses up
// from (198.18.0.0/15, RFC 2544 benchmarking, which the host refuses as a
// destination). The guest maps a made-up address back to its name on
// every path (capture, SOCKS, HTTP proxy); it sends one as an egress
// target only when no name holds it, and the host's refusal says so.
var GuestAddrPrefix = netip.MustParsePrefix("198.18.0.0/15")

// GuestAddrPrefix6 is the IPv6 range of the guest's made-up addresses: a
// unique local /96 (RFC 4193, a random 40-bit global ID) whose last 32
// bits are the made-up IPv4 address of the same name, as NAT64 embeds
// IPv4 in 64:ff9b::/96. The host refuses it as a destination (fc00::/7
// is a refused class), so an escaped one can never be dialed, and it
// collides with no network a guest could have: the workload's namespace
// has only lo.
var GuestAddrPrefix6 = netip.MustParsePrefix("fd2c:6ff4:6006::/96")

// DNSReplyTimeout is how long a guest waits for the host's DNSReply.
const DNSReplyTimeout = 10 * time.Second

// MaxDNSName bounds StreamHeader.Host of a dns stream: a DNS name is at
// most 253 bytes in presentation form without its trailing dot.
const MaxDNSName = 254

// DNSReply is the host's answer on a dns stream: whether the name in the
// header may be resolved in the guest under the egress policy. Code 0 (OK)
// means yes; the guest then hands out an address of its own for it and
// carries every connection to that address as an egress stream naming the
// name, which the host checks again (port, resolution, refused classes).
// No address crosses: the guest never learns where a name resolves.
type DNSReply struct {
	Code   EgressCode `json:"code"`
	Error  string     `json:"error,omitempty"`
	Effect string     `json:"effect,omitempty"`
	Reason string     `json:"reason,omitempty"`
	Rule   string     `json:"rule,omitempty"`
}

// OK reports whether the name may be resolved.
func (r DNSReply) OK() bool { return r.Code == EgressOK }

// Validate checks a reply received from the host.
func (r DNSReply) Validate() error {
	return EgressReply(r).Validate()
}

// validateDNS checks the fields of a dns stream header: host is the name
// asked (1..MaxDNSName bytes, printable, no spaces or slashes); port and
// via must be absent.
func (h StreamHeader) validateDNS() error {
	if h.Port != 0 || h.Via != "" {
		return fmt.Errorf("%w: port and via belong to egress streams only", ErrBadBody)
	}
	if h.Host == "" || len(h.Host) > MaxDNSName {
		return fmt.Errorf("%w: dns name must be 1 to %d bytes", ErrBadBody, MaxDNSName)
	}
	if !utf8.ValidString(h.Host) || hasControl(h.Host) || strings.ContainsAny(h.Host, " \t/\\") {
		return fmt.Errorf("%w: dns name contains control characters, spaces or slashes", ErrBadBody)
	}
	return nil
}

// ReadDNSReply reads and validates the host's answer on a dns stream.
func ReadDNSReply(c net.Conn, timeout time.Duration) (DNSReply, error) {
	r, err := readReply(c, timeout, TypeDNSReply, "dns reply")
	return DNSReply(r), err
}

// WriteDNSReply writes the host's answer; Error and Effect are filled in
// from Code when empty.
func WriteDNSReply(w io.Writer, r DNSReply) error {
	return writeReply(w, TypeDNSReply, EgressReply(r))
}
