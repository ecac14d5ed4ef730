package egress

import (
	"context"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/protocol"
)

func TestDirectModeTakesTheSameExitWithItsOwnCarrier(t *testing.T) {
	var asked []Target
	opened := false
	unmap := func(h string) string {
		if h == "198.18.0.5" {
			return "a.test"
		}
		return h
	}
	e := NewExit(unmap,
		Carrier{Name: "pair", Open: func(context.Context, Target) (net.Conn, protocol.EgressReply, bool) {
			opened = true
			return nil, protocol.EgressReply{}, false
		}},
		Carrier{Name: "direct", Direct: func(_ context.Context, t Target) (*net.TCPConn, protocol.EgressReply, bool) {
			asked = append(asked, t)
			if t.Host == "a.test" {
				return nil, protocol.EgressReply{Code: protocol.EgressOK}, true
			}
			return nil, protocol.EgressReply{Code: protocol.EgressDenied, Effect: protocol.EffectNone, Reason: "no rule allows it", Rule: "default deny"}, true
		}})
	_, r, answered := e.Direct(context.Background(), "198.18.0.5", 443, 0)
	require.True(t, answered)
	assert.True(t, r.OK())
	assert.Equal(t, []Target{{Host: "a.test", Port: 443, Via: protocol.ViaDirect}}, asked, "a made-up address is asked for by its name")
	assert.False(t, opened, "no other carrier is asked for a direct connect")

	_, r, _ = e.Direct(context.Background(), "192.0.2.1", 80, 40123)
	assert.Equal(t, protocol.EgressDenied, r.Code)
	got := e.Refusals().Recent(0, "192.0.2.1:80")
	require.Len(t, got, 1, "the workload may ask why")
	assert.Equal(t, "no rule allows it", got[0].Reason)
	assert.Len(t, e.Refusals().Recent(40123, ""), 1, "and by the port its socket was bound to")

	_, r, answered = e.Direct(context.Background(), "a b", 80, 0)
	assert.True(t, answered)
	assert.Equal(t, protocol.EgressInvalidArgument, r.Code, "the target is checked once, before any carrier")
}

func TestWithNoDirectCarrierADirectConnectIsNotAsked(t *testing.T) {
	e := NewExit(nil, Carrier{Name: "pair", Open: func(context.Context, Target) (net.Conn, protocol.EgressReply, bool) {
		t.Fatal("a direct connect never takes another carrier")
		return nil, protocol.EgressReply{}, false
	}})
	_, _, answered := e.Direct(context.Background(), "a.test", 443, 0)
	assert.False(t, answered, "the connect goes on to the capture")
}
