package agent

import (
	"context"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/guest/egress"
	"github.com/oac/sandbox-agent/protocol"
)

// A data plane that did not come up answers "not asked" on every
// carrier, so the guest's way out reaches the session's streams.
func TestADataPlaneThatIsNotUpPassesEveryConnectionToTheSession(t *testing.T) {
	d := &dataPlane{ready: make(chan struct{}), setup: func() {}}
	close(d.ready)
	var session int
	exit := egress.NewExit(nil, append(d.carriers(), egress.Opens("session", func(context.Context, string, int, string) (net.Conn, protocol.EgressReply) {
		session++
		return nil, protocol.EgressReply{Code: protocol.EgressDenied, Effect: protocol.EffectNone}
	}))...)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	accepted, err := ln.Accept()
	require.NoError(t, err)
	defer accepted.Close()

	_, r := exit.Attempt(context.Background(), accepted, "web.test", 443, protocol.ViaConnect).Go(true, nil, nil)
	assert.Equal(t, protocol.EgressDenied, r.Code)
	assert.Equal(t, 1, session, "neither the hand, the pair nor the dial carrier was there")
}

// A guest stopping while its data plane is still coming up refuses the
// connection as cancelled; nothing else is asked.
func TestAConnectionWaitingForTheDataPlaneIsCancelledWithTheGuest(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	// The guest stops during the setup, which never gets ready.
	d := &dataPlane{ready: make(chan struct{}), setup: cancel}
	asked := false
	exit := egress.NewExit(nil, append(d.carriers(), egress.Opens("session", func(context.Context, string, int, string) (net.Conn, protocol.EgressReply) {
		asked = true
		return nil, protocol.EgressReply{}
	}))...)
	_, r := exit.Attempt(ctx, nil, "web.test", 443, protocol.ViaConnect).Go(false, nil, nil)
	assert.Equal(t, protocol.EgressCancelled, r.Code)
	assert.False(t, asked)
}
