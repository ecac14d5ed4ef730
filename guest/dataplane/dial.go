package dataplane

import (
	"context"
	"errors"
	"io"
	"net"
	"time"

	"github.com/oac/sandbox-agent/guest/egress"
	"github.com/oac/sandbox-agent/protocol"
	"github.com/oac/sandbox-agent/protocol/transport"
)

// DialTimeout bounds one dial of a data connection.
const DialTimeout = 5 * time.Second

// Dialer carries each connection on a data connection of its own (the
// carrier "dial"): it dials ep, names the target with the session's token
// and waits for the host's answer.
func Dialer(ep transport.Endpoint, token string) egress.Carrier {
	return egress.Carrier{Name: "dial", Open: func(ctx context.Context, t egress.Target) (net.Conn, protocol.EgressReply, bool) {
		dctx, cancel := context.WithTimeout(ctx, DialTimeout)
		c, err := ep.Dial(dctx)
		cancel()
		if err != nil {
			return nil, egress.LocalFailure(protocol.EgressIO, "cannot dial the host's data plane: "+err.Error()), false
		}
		stop := context.AfterFunc(ctx, func() { c.Close() })
		defer stop()
		_ = c.SetWriteDeadline(time.Now().Add(DialTimeout))
		err = protocol.WriteMessage(c, protocol.TypeConnect, protocol.Connect{Token: token, Host: t.Host, Port: t.Port, Via: t.Via, SrcPort: t.SrcPort})
		_ = c.SetWriteDeadline(time.Time{})
		if err != nil {
			c.Close()
			return nil, egress.LocalFailure(protocol.EgressIO, "cannot reach the host's data plane: "+err.Error()), false
		}
		_ = c.SetReadDeadline(time.Now().Add(protocol.EgressReplyTimeout))
		var r protocol.Connected
		err = protocol.ReadMessage(c, protocol.MaxHeaderFrame, protocol.TypeConnected, &r)
		_ = c.SetReadDeadline(time.Time{})
		if err == nil {
			err = r.EgressReply.Validate()
		}
		if err != nil {
			c.Close()
			var ne net.Error
			switch {
			case errors.As(err, &ne) && ne.Timeout():
				// Asked, not answered in time: going another way would
				// ask twice.
				return nil, egress.LocalFailure(protocol.EgressTimedOut, "the host broker did not answer within "+protocol.EgressReplyTimeout.String()), true
			case errors.Is(err, io.EOF):
				return nil, egress.LocalFailure(protocol.EgressIO, "the host closed the data connection without answering"), false
			}
			return nil, egress.LocalFailure(protocol.EgressIO, "bad answer from the host broker: "+err.Error()), true
		}
		if !r.OK() {
			c.Close()
			return nil, r.EgressReply, true
		}
		return c, r.EgressReply, true
	}}
}
