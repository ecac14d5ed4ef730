package dataplane

import (
	"context"
	"net"

	"github.com/oac/sandbox-agent/guest/egress"
	"github.com/oac/sandbox-agent/protocol"
)

// Carrier opens one egress connection on the data plane (Channel.Open).
// answered is false when the host was not asked or its answer did not
// arrive (the channel is gone): the connection may then go another way.
type Carrier func(ctx context.Context, host string, port int, via string) (c net.Conn, r protocol.EgressReply, answered bool)

// Way makes c one of the guest's ways out (egress.Exit), called name.
// The connection's source port does not travel with it.
func (c Carrier) Way(name string) egress.Carrier {
	return egress.Carrier{Name: name, Open: func(ctx context.Context, t egress.Target) (net.Conn, protocol.EgressReply, bool) {
		return c(ctx, t.Host, t.Port, t.Via)
	}}
}
