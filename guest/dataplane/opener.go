package dataplane

import (
	"context"
	"net"

	"github.com/oac/sandbox-agent/guest/egress"
	"github.com/oac/sandbox-agent/protocol"
)

// Carrier opens one egress connection on the data plane. answered is
// false when the host was not asked or its answer did not arrive (the
// channel is gone, the dial failed): the connection may then go another
// way.
type Carrier func(ctx context.Context, host string, port int, via string) (c net.Conn, r protocol.EgressReply, answered bool)

// Opener returns an egress.Opener that carries each connection on the
// data plane and, when the data plane could not ask the host, as an
// egress stream of the session (fallback).
func Opener(carry Carrier, fallback egress.Opener) egress.Opener {
	return func(ctx context.Context, host string, port int, via string) (net.Conn, protocol.EgressReply) {
		h := protocol.StreamHeader{Kind: protocol.KindEgress, Host: host, Port: port, Via: via}
		if err := h.Validate(); err != nil {
			return nil, egress.LocalFailure(protocol.EgressInvalidArgument, "the target is not a host name or IP address with a port in 1..65535")
		}
		c, r, answered := carry(ctx, host, port, via)
		if answered || ctx.Err() != nil {
			return c, r
		}
		return fallback(ctx, host, port, via)
	}
}
