package dataplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"syscall"
	"time"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/egress"
	"github.com/oac/sandbox-agent/protocol"
)

// Request pacing: a guest's Connect requests (on the fd channel) and data
// connections (dialed) are taken at most MaxRequestRate a second, with
// bursts of MaxRequestBurst. Over it the host reads and accepts more
// slowly (the guest's writes and dials wait); nothing is refused and
// nobody fails.
const (
	MaxRequestRate  = 2000
	MaxRequestBurst = 256
)

// HostFDsPerConnection is how many descriptors one carried connection
// holds on the host: the upstream socket, the host's end of the guest's
// connection (a pair's end, the dialed connection, or the workload's
// socket the guest handed over), and a splice pipe
// (two descriptors) each way while the bytes move in the kernel. The
// broker's stream limit bounds the connections, so a sandbox's data plane
// holds at most MaxStreams x HostFDsPerConnection, plus the fd channel
// and the pairs made ahead of use (docs/threat-model.md).
const HostFDsPerConnection = 6

// ErrViolation is wrapped by the error of a channel the guest broke
// (a frame too large, of an unknown or unexpected type, malformed).
var ErrViolation = errors.New("guest broke the protocol on the data plane")

// Config configures both carriers.
type Config struct {
	// Ctx ends every carried connection when it is cancelled (the sandbox
	// stopping) and bounds the broker's dials.
	Ctx context.Context
	// Broker decides each connection; nil refuses every Connect with
	// UnsupportedNetwork (forwards still work).
	Broker *egress.Broker
	// Emit receives the broker's events.
	Emit func(api.Event)
	// Log receives diagnostics (never payloads).
	Log *slog.Logger
	// HeaderTimeout bounds a data plane connection's wait for its first
	// frame (the sandbox's stream header timeout).
	HeaderTimeout time.Duration
	// WriteTimeout bounds one write of the host on the fd channel
	// (default protocol.DataWriteTimeout; tests shorten it).
	WriteTimeout time.Duration
	// Token is the session's data token (Welcome.DataToken); Offer the
	// carriers Welcome offered (protocol.CapDataFD, CapDataDial).
	Token string
	Offer []string
	// OnChannel is told of the fd channel once it is up (forwards use
	// it); OnViolation of a guest that broke the protocol after it
	// presented the token (the sandbox fails it as hostile).
	OnChannel   func(*Channel)
	OnViolation func(error)
	// Direct guards the sockets a direct Connect hands the guest; set
	// exactly when Offer has protocol.CapDataDirect.
	Direct DirectGuard
}

func (c *Config) violation(err error) {
	if c.OnViolation != nil {
		c.OnViolation(err)
	}
}

func (c *Config) defaults() {
	if c.Ctx == nil {
		c.Ctx = context.Background()
	}
	if c.Emit == nil {
		c.Emit = func(api.Event) {}
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.HeaderTimeout <= 0 {
		c.HeaderTimeout = 5 * time.Second
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = protocol.DataWriteTimeout
	}
	if c.OnChannel == nil {
		c.OnChannel = func(*Channel) {}
	}
}

// answer decides one Connect with the broker. send delivers the answer to
// the guest together with the guest's side of the connection (guest is
// nil for a refusal) and reports whether it arrived; guest makes that side
// when the attempt is OK and returns the host's side to carry. prime, when
// not nil, runs as soon as the upstream is connected and the host's side
// made, before the answer: on a handed socket the host alone holds both
// ends, so what the client already sent goes upstream while the answer and
// its event are written (the upstream's reply waits in its socket until
// the carry starts). The host's side is closed once carried.
func (cfg *Config) answer(req protocol.Connect, guest func() (net.Conn, error), send func(protocol.Connected) error, prime func(*egress.Attempt, net.Conn)) {
	if cfg.Broker == nil {
		_ = send(protocol.Connected{ID: req.ID, EgressReply: protocol.EgressReply{
			Code: protocol.EgressUnsupportedNetwork, Effect: protocol.EffectNone, Error: protocol.EgressUnsupportedNetwork.String(),
			Reason: "this sandbox was started without an egress broker"}})
		return
	}
	a := cfg.Broker.Open(cfg.Ctx, req.Header(), cfg.Emit)
	defer a.Close()
	var host net.Conn
	if a.OK() {
		h, err := guest()
		if err != nil {
			a.Fail(protocol.EgressResourceExhausted, fmt.Sprintf("the host could not make the connection's socket: %v", err))
		} else {
			host = h
		}
	}
	if prime != nil && host != nil {
		prime(a, host)
	}
	err := send(protocol.Connected{ID: req.ID, EgressReply: a.Reply()})
	if !a.Answered(err) {
		if host != nil {
			host.Close()
		}
		return
	}
	a.Carry(host, func() { host.Close() }, peersGone)
	host.Close()
}

// violation wraps a read error that a correct guest never causes.
func violation(err error) error {
	for _, e := range []error{protocol.ErrFrameTooLarge, protocol.ErrUnknownType, protocol.ErrBadFlags, protocol.ErrTruncated, protocol.ErrBadBody, protocol.ErrUnexpectedType} {
		if errors.Is(err, e) {
			return fmt.Errorf("%w: %w", ErrViolation, err)
		}
	}
	return err
}

// DirectGuard keeps the host's direct sockets on their upstreams (package
// host/directguard): Lock prepares an upstream socket before it connects
// (the egress broker calls it), Seal marks a connected one before it is
// handed to the guest.
type DirectGuard interface {
	Lock(network string, remote netip.AddrPort, rc syscall.RawConn) error
	Seal(rc syscall.RawConn) error
}
