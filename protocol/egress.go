package protocol

import (
	"fmt"
	"io"
	"net"
	"strings"
	"time"
	"unicode/utf8"
)

// CapEgress is the capability the host lists in Welcome when it serves
// egress streams. A guest starts its proxies only when the host offers it.
const CapEgress = "egress"

// Egress stream limits.
const (
	// MaxEgressHost bounds StreamHeader.Host of an egress stream: a DNS name
	// is at most 253 bytes in ASCII, an internationalized one may be longer
	// before IDNA conversion.
	MaxEgressHost = 1024
	// MaxEgressText bounds the reason and rule of an EgressReply.
	MaxEgressText = 512
	// EgressReplyTimeout is how long a guest waits for the host's answer
	// before it gives up with TimedOut. The host answers within its own
	// connect timeout, which must be shorter.
	EgressReplyTimeout = 60 * time.Second
)

// Egress via values: how the guest received the connection.
const (
	ViaConnect = "connect" // HTTP CONNECT
	ViaHTTP    = "http"    // absolute-form http:// request forwarded by the proxy
	ViaSOCKS5  = "socks5"  // SOCKS5 CONNECT
)

// EgressCode is the failure code of an egress decision; 0 is success.
// The numbers are contract (docs/contract.md, "Egress").
type EgressCode int

// Egress failure codes.
const (
	EgressOK                   EgressCode = 0
	EgressInvalidArgument      EgressCode = 1
	EgressUnsupportedNetwork   EgressCode = 2
	EgressDenied               EgressCode = 3
	EgressNameNotResolved      EgressCode = 4
	EgressNameResolutionFailed EgressCode = 5
	EgressConnectionRefused    EgressCode = 6
	EgressUnreachable          EgressCode = 7
	EgressTimedOut             EgressCode = 8
	EgressResourceExhausted    EgressCode = 9
	EgressCancelled            EgressCode = 10
	EgressIO                   EgressCode = 11
	EgressUnknown              EgressCode = 12
)

var egressCodeNames = [...]string{
	"OK", "InvalidArgument", "UnsupportedNetwork", "Denied", "NameNotResolved",
	"NameResolutionFailed", "ConnectionRefused", "Unreachable", "TimedOut",
	"ResourceExhausted", "Cancelled", "IO", "Unknown",
}

func (c EgressCode) String() string {
	if c >= 0 && int(c) < len(egressCodeNames) {
		return egressCodeNames[c]
	}
	return fmt.Sprintf("EgressCode(%d)", int(c))
}

// Valid reports whether c is OK or one of the twelve failure codes.
func (c EgressCode) Valid() bool { return c >= 0 && int(c) < len(egressCodeNames) }

// Effects of a failed egress: whether the upstream may have seen anything.
const (
	EffectNone     = "none"
	EffectPossible = "possible"
)

// EgressReply is the host's answer on an egress stream, the first frame the
// host writes after reading the StreamHeader. Code 0 (OK) means the
// connection is established and raw bytes follow in both directions; any
// other code means the host closes the stream after this frame.
type EgressReply struct {
	Code EgressCode `json:"code"`
	// Error is the code's name ("Denied"); empty when OK.
	Error string `json:"error,omitempty"`
	// Effect is EffectNone or EffectPossible; empty when OK.
	Effect string `json:"effect,omitempty"`
	// Reason says why in words, for people and agents; never a secret.
	Reason string `json:"reason,omitempty"`
	// Rule names the policy rule that decided, when one did.
	Rule string `json:"rule,omitempty"`
}

// OK reports whether the reply lets bytes flow.
func (r EgressReply) OK() bool { return r.Code == EgressOK }

// Validate checks a reply received from the host.
func (r EgressReply) Validate() error {
	if !r.Code.Valid() {
		return fmt.Errorf("%w: egress reply code %d is not 0..12", ErrBadBody, int(r.Code))
	}
	if r.Code != EgressOK && r.Effect != EffectNone && r.Effect != EffectPossible {
		return fmt.Errorf("%w: egress reply effect must be %q or %q", ErrBadBody, EffectNone, EffectPossible)
	}
	if len(r.Reason) > MaxEgressText || len(r.Rule) > MaxEgressText || len(r.Error) > 64 {
		return fmt.Errorf("%w: egress reply text longer than %d bytes", ErrBadBody, MaxEgressText)
	}
	if hasControl(r.Reason) || hasControl(r.Rule) || hasControl(r.Error) {
		return fmt.Errorf("%w: egress reply text contains control characters", ErrBadBody)
	}
	return nil
}

// validateEgress checks the egress fields of a StreamHeader. It checks form
// only (length, no control characters, port range); what the host may be
// is the broker's decision, which re-parses it.
func (h StreamHeader) validateEgress() error {
	if h.SrcPort != 0 && (h.Kind != KindEgress || h.SrcPort < 0 || h.SrcPort > 65535) {
		return fmt.Errorf("%w: src_port belongs to egress streams only and must be 0..65535", ErrBadBody)
	}
	if h.Kind == KindForward {
		if h.Host != "" || h.Via != "" {
			return fmt.Errorf("%w: a forward stream names a guest port only, never a host", ErrBadBody)
		}
		if h.Port < 1 || h.Port > 65535 {
			return fmt.Errorf("%w: forward port must be 1..65535", ErrBadBody)
		}
		return nil
	}
	if h.Kind == KindDNS {
		return h.validateDNS()
	}
	if h.Kind != KindEgress {
		if h.Host != "" || h.Port != 0 || h.Via != "" {
			return fmt.Errorf("%w: host, port and via belong to egress and forward streams only", ErrBadBody)
		}
		return nil
	}
	if h.Host == "" || len(h.Host) > MaxEgressHost {
		return fmt.Errorf("%w: egress host must be 1 to %d bytes", ErrBadBody, MaxEgressHost)
	}
	if !utf8.ValidString(h.Host) || hasControl(h.Host) || strings.ContainsAny(h.Host, " \t/\\") {
		return fmt.Errorf("%w: egress host contains control characters, spaces or slashes", ErrBadBody)
	}
	if h.Port < 1 || h.Port > 65535 {
		return fmt.Errorf("%w: egress port must be 1..65535", ErrBadBody)
	}
	switch h.Via {
	case "", ViaConnect, ViaHTTP, ViaSOCKS5, ViaTransparent, ViaDirect:
	default:
		return fmt.Errorf("%w: unknown egress via %q", ErrBadBody, truncate(h.Via, 16))
	}
	return nil
}

func hasControl(s string) bool {
	return strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f })
}

// ReadEgressReply reads and validates the host's answer on an egress stream;
// it must arrive within timeout. An Error frame is returned as *PeerError.
func ReadEgressReply(c net.Conn, timeout time.Duration) (EgressReply, error) {
	return readReply(c, timeout, TypeEgressReply, "egress reply")
}

// WriteEgressReply writes the host's answer; Error and Effect are filled in
// from Code when empty.
func WriteEgressReply(w io.Writer, r EgressReply) error {
	return writeReply(w, TypeEgressReply, r)
}

// readReply reads one reply frame of type t (EgressReply or DNSReply: the
// same fields) within timeout and validates it.
func readReply(c net.Conn, timeout time.Duration, t Type, what string) (EgressReply, error) {
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	var r EgressReply
	if err := ReadMessage(c, MaxHeaderFrame, t, &r); err != nil {
		return r, fmt.Errorf("%s: %w", what, err)
	}
	return r, r.Validate()
}

// writeReply writes a reply frame of type t, filling Error and Effect in
// from Code when empty and bounding the texts.
func writeReply(w io.Writer, t Type, r EgressReply) error {
	if r.Code != EgressOK {
		if r.Error == "" {
			r.Error = r.Code.String()
		}
		if r.Effect == "" {
			r.Effect = EffectNone
		}
	}
	r.Reason = truncate(r.Reason, MaxEgressText-3)
	r.Rule = truncate(r.Rule, MaxEgressText-3)
	return WriteMessage(w, t, r)
}
