package dataplane

import (
	"fmt"
	"syscall"

	"github.com/oac/sandbox-agent/protocol"
)

// direct answers one direct Connect: the broker decides and dials as for
// any other carrier, with the upstream socket locked by the guard before
// it connects and sealed after; an allowed connection's socket goes to
// the guest with the answer and this process keeps nothing of it.
func (ch *Channel) direct(req protocol.Connect) {
	ch.open.Add(1)
	defer ch.open.Add(-1)
	if ch.cfg.Broker == nil {
		_ = ch.send(protocol.TypeConnected, protocol.Connected{ID: req.ID, EgressReply: protocol.EgressReply{
			Code: protocol.EgressUnsupportedNetwork, Effect: protocol.EffectNone, Error: protocol.EgressUnsupportedNetwork.String(),
			Reason: "this sandbox was started without an egress broker"}}, -1)
		return
	}
	guard := ch.cfg.Direct
	if guard == nil {
		// Never offered without a guard; refused, not handed unsealed.
		_ = ch.send(protocol.TypeConnected, protocol.Connected{ID: req.ID, EgressReply: protocol.EgressReply{
			Code: protocol.EgressUnsupportedNetwork, Effect: protocol.EffectNone, Error: protocol.EgressUnsupportedNetwork.String(),
			Reason: "direct mode is not guarded on this host"}}, -1)
		return
	}
	a := ch.cfg.Broker.OpenDirect(ch.cfg.Ctx, req.Header(), ch.cfg.Emit, guard.Lock)
	defer a.Close()
	up := a.Give()
	if up == nil {
		a.Answered(ch.send(protocol.TypeConnected, protocol.Connected{ID: req.ID, EgressReply: a.Reply()}, -1))
		return
	}
	defer up.Close()
	var err error
	rc, cerr := up.(syscall.Conn).SyscallConn()
	if cerr == nil {
		// Sealed before it leaves: from here on the kernel keeps it on
		// its upstream, whoever holds it.
		if cerr = guard.Seal(rc); cerr != nil {
			cerr = fmt.Errorf("seal it: %w", cerr)
		}
	}
	if cerr == nil {
		cerr = rc.Control(func(fd uintptr) {
			err = ch.send(protocol.TypeConnected, protocol.Connected{ID: req.ID, EgressReply: a.Reply()}, int(fd))
		})
	}
	if cerr != nil {
		a.Fail(protocol.EgressResourceExhausted, "the host could not pass the direct connection's socket: "+cerr.Error())
		err = ch.send(protocol.TypeConnected, protocol.Connected{ID: req.ID, EgressReply: a.Reply()}, -1)
	}
	a.Answered(err)
}
