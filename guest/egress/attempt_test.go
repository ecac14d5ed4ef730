package egress

import (
	"context"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/protocol"
)

// trail records which carriers were asked, in order.
type trail struct {
	mu    sync.Mutex
	asked []string
	seen  []Target
}

func (tr *trail) note(name string, t Target) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.asked = append(tr.asked, name)
	tr.seen = append(tr.seen, t)
}

// notAsked is a carrier that is not up.
func (tr *trail) notAsked(name string) Carrier {
	return Carrier{Name: name, Open: func(_ context.Context, t Target) (net.Conn, protocol.EgressReply, bool) {
		tr.note(name, t)
		return nil, protocol.EgressReply{}, false
	}}
}

// answering is a carrier whose host answers r.
func (tr *trail) answering(name string, r protocol.EgressReply) Carrier {
	return Carrier{Name: name, Open: func(_ context.Context, t Target) (net.Conn, protocol.EgressReply, bool) {
		tr.note(name, t)
		return nil, r, true
	}}
}

// handing is a hand carrier whose host answers r.
func (tr *trail) handing(name string, r protocol.EgressReply, answered bool) Carrier {
	return Carrier{Name: name, Hand: func(_ context.Context, _ *net.TCPConn, t Target, _, _ []byte) (protocol.EgressReply, bool) {
		tr.note(name, t)
		return r, answered
	}}
}

var denied = protocol.EgressReply{Code: protocol.EgressDenied, Error: "Denied", Effect: protocol.EffectNone, Reason: "no rule allows it", Rule: "web.test:443"}

// tcpPair returns the two ends of a loopback TCP connection: the client's
// and the one a proxy accepted.
func tcpPair(t *testing.T) (client, accepted *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	s, err := ln.Accept()
	require.NoError(t, err)
	t.Cleanup(func() { c.Close(); s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

func TestTheCarriersAreTriedInOrderAndAnAnswerIsNeverAskedAgain(t *testing.T) {
	var tr trail
	exit := NewExit(nil, tr.handing("hand", protocol.EgressReply{}, false), tr.notAsked("pair"), tr.answering("dial", denied), tr.answering("session", protocol.EgressReply{}))
	_, accepted := tcpPair(t)
	c, r := exit.Attempt(context.Background(), accepted, "web.test", 80, protocol.ViaConnect).Go(true, nil, nil)
	assert.Nil(t, c)
	assert.Equal(t, protocol.EgressDenied, r.Code)
	assert.Equal(t, []string{"hand", "pair", "dial"}, tr.asked, "the session is not asked about a connection the host answered")
}

func TestAHandedAnswerEndsTheRoute(t *testing.T) {
	var tr trail
	exit := NewExit(nil, tr.handing("hand", protocol.EgressReply{Code: protocol.EgressOK}, true), tr.answering("session", denied))
	_, accepted := tcpPair(t)
	c, r := exit.Attempt(context.Background(), accepted, "web.test", 443, protocol.ViaConnect).Go(true, []byte("200"), []byte("early"))
	assert.Nil(t, c, "the host carries it")
	assert.True(t, r.OK())
	assert.Equal(t, []string{"hand"}, tr.asked)
}

func TestOnlyATCPClientWithEarlyBytesInBoundIsHanded(t *testing.T) {
	var tr trail
	exit := NewExit(nil, tr.handing("hand", protocol.EgressReply{Code: protocol.EgressOK}, true), tr.answering("session", denied))
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	exit.Attempt(context.Background(), b, "web.test", 443, protocol.ViaConnect).Go(true, nil, nil)
	_, accepted := tcpPair(t)
	exit.Attempt(context.Background(), accepted, "web.test", 443, protocol.ViaConnect).Go(true, nil, make([]byte, protocol.MaxHandEarly+1))
	exit.Attempt(context.Background(), accepted, "web.test", 443, protocol.ViaHTTP).Go(false, nil, nil)
	assert.Equal(t, []string{"session", "session", "session"}, tr.asked, "not a TCP socket; early bytes over the bound; a request after the first")
}

func TestTheTargetIsCheckedOnceBeforeAnyCarrierIsAsked(t *testing.T) {
	var tr trail
	exit := NewExit(nil, tr.answering("session", protocol.EgressReply{}))
	_, r := exit.Attempt(context.Background(), nil, "bad host", 443, protocol.ViaSOCKS5).Go(true, nil, nil)
	assert.Equal(t, protocol.EgressInvalidArgument, r.Code)
	_, r = exit.Attempt(context.Background(), nil, "web.test", 0, protocol.ViaSOCKS5).Go(true, nil, nil)
	assert.Equal(t, protocol.EgressInvalidArgument, r.Code)
	assert.Empty(t, tr.asked)
}

func TestAMadeUpAddressTravelsAsItsNameWithTheClientsSourcePort(t *testing.T) {
	var tr trail
	exit := NewExit(func(h string) string {
		if h == "198.18.0.7" {
			return "web.test"
		}
		return h
	}, tr.answering("session", denied))
	client, accepted := tcpPair(t)
	exit.Attempt(context.Background(), accepted, "198.18.0.7", 443, protocol.ViaSOCKS5).Go(true, nil, nil)
	require.Len(t, tr.seen, 1)
	assert.Equal(t, Target{Host: "web.test", Port: 443, Via: protocol.ViaSOCKS5, SrcPort: client.LocalAddr().(*net.TCPAddr).Port}, tr.seen[0])
	assert.Equal(t, tr.seen[0].SrcPort, tr.seen[0].Header().SrcPort, "the header names the connection")
}

func TestACancelledAttemptGoesNoFurther(t *testing.T) {
	var tr trail
	ctx, cancel := context.WithCancel(context.Background())
	// The guest stops while the first carrier waits for its data plane.
	stops := Carrier{Name: "pair", Open: func(_ context.Context, t Target) (net.Conn, protocol.EgressReply, bool) {
		tr.note("pair", t)
		cancel()
		return nil, protocol.EgressReply{}, false
	}}
	exit := NewExit(nil, stops, tr.answering("session", protocol.EgressReply{}))
	c, r := exit.Attempt(ctx, nil, "web.test", 443, protocol.ViaConnect).Go(false, nil, nil)
	assert.Nil(t, c)
	assert.Equal(t, protocol.EgressCancelled, r.Code, "refused, not taken for handed")
	assert.Equal(t, []string{"pair"}, tr.asked, "a stopping guest does not ask the next carrier")
}

func TestNoCarrierThatAnswersIsARefusalTheWorkloadCanRead(t *testing.T) {
	var tr trail
	exit := NewExit(nil, tr.notAsked("pair"))
	_, r := exit.Attempt(context.Background(), nil, "web.test", 443, protocol.ViaConnect).Go(false, nil, nil)
	assert.Equal(t, protocol.EgressIO, r.Code)
	got := exit.Refusals().Recent(0, "")
	require.Len(t, got, 1)
	assert.Equal(t, RefusalSandbox, got[0].Kind, "not the policy: the sandbox could not ask")
}
