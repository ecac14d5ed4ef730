package sandbox

import (
	"context"
	"fmt"
	"net"
	"slices"

	"github.com/oac/sandbox-agent/host/dataplane"
	"github.com/oac/sandbox-agent/host/directguard"
	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/protocol"
)

// dataCarriers returns the data plane carriers to offer: what the
// provider's transport allows, narrowed by Config.DataPlane. Where the
// transport passes descriptors (protocol.CapDataFD) the fd channel comes
// with protocol.CapDataHand (the workload's own sockets, carried here
// with no copy in the guest); a shim that cannot make pairs in the
// guest's namespace (not root) offers the channel for handed sockets
// only: CapDataHand without CapDataFD. protocol.CapDataDirect is added
// unless another carrier was asked for, wherever every guarantee holds
// (openDirect).
func (s *run) dataCarriers() []string {
	dp, ok := s.inst.(provider.DataPlane)
	if !ok || s.cfg.DataPlane == DataPlaneOff {
		if s.wantsDirect() {
			s.directOff = "direct mode unavailable: this provider has no data plane; connections take the session stream path"
		}
		return nil
	}
	var offer []string
	for _, c := range dp.DataCarriers() {
		if s.cfg.DataPlane != "" && s.cfg.DataPlane != DataPlaneDirect && s.cfg.DataPlane != c {
			continue
		}
		switch {
		case c == protocol.CapDataFD && dataplane.CanMakePairs():
			offer = append(offer, c, protocol.CapDataHand)
		case c == protocol.CapDataFD && dataplane.CanTakeHanded():
			offer = append(offer, protocol.CapDataHand)
		case c != protocol.CapDataFD:
			offer = append(offer, c)
		}
	}
	if s.wantsDirect() {
		if s.direct, s.directOff = s.openDirect(offer); s.direct != nil {
			offer = append(offer, protocol.CapDataDirect)
		}
	}
	return offer
}

// wantsDirect: direct mode is on by default (Config.DataPlane "") and
// with DataPlaneDirect, wherever openDirect finds every guarantee holds.
func (s *run) wantsDirect() bool {
	return s.cfg.DataPlane == "" || s.cfg.DataPlane == DataPlaneDirect
}

// openDirect returns direct mode's guard when every guarantee holds here
// (docs/threat-model.md, "Direct mode"): the fd channel is offered (a
// guest sharing this kernel, a root shim), the provider's guest root has
// no capability in the host's user namespace, and this host's kernel
// guard is in force. Otherwise it says why not.
func (s *run) openDirect(offer []string) (*directguard.Guard, string) {
	switch {
	case !slices.Contains(offer, protocol.CapDataFD):
		return nil, "direct mode unavailable: it needs the fd channel (a guest sharing this kernel on a unix transport, and oac-shim as root); connections take the " + fallbackPath(offer) + " path"
	case !s.cfg.Provider.Capabilities().GuestRootUnprivileged:
		return nil, "direct mode unavailable: the " + s.cfg.Provider.Name() + " provider's guest root holds capabilities in the host's user namespace (no user namespace of its own), so the guest is never handed the host's sockets; connections take the handed path"
	}
	g, err := directguard.Open(directguard.Config{Log: s.cfg.Log})
	if err != nil {
		return nil, "direct mode unavailable: " + err.Error() + "; connections take the handed path"
	}
	return g, ""
}

// directSaid is the host's starting event on direct mode: why it is off,
// or, when offered, the sandbox's host port share (the guest's own event
// then says whether it is on). "" when another carrier was asked for. A
// guest that cannot take it gives its share back at once.
func (s *run) directSaid(hello protocol.Hello) string {
	if s.direct != nil && !protocol.HasCapability(hello.Capabilities, protocol.CapDataDirect) {
		s.closeDirect()
		s.direct, s.directOff = nil, "direct mode unavailable: this guest's agent cannot trap connects; connections take the handed path"
	}
	switch {
	case s.directOff != "":
		return s.directOff
	case s.direct == nil:
		return ""
	}
	lo, hi := s.direct.Share()
	return fmt.Sprintf("direct mode offered: host ports %d-%d are this sandbox's share; each socket handed to the guest is kept on its upstream by the kernel", lo, hi)
}

// closeDirect destroys what is left of the guest's direct sockets (the
// guest is gone) and releases the guard.
func (s *run) closeDirect() {
	if s.direct == nil {
		return
	}
	n, err := s.direct.Abort()
	if err != nil {
		s.cfg.Log.Warn("direct mode: abort the guest's sockets", "sandbox", s.cfg.Name, "err", err)
	} else if n > 0 {
		s.cfg.Log.Debug("direct mode: aborted the guest's sockets", "sandbox", s.cfg.Name, "count", n)
	}
	if err := s.direct.Close(); err != nil {
		s.cfg.Log.Warn("direct mode: close the guard", "sandbox", s.cfg.Name, "err", err)
	}
}

func fallbackPath(offer []string) string {
	switch {
	case protocol.HasCapability(offer, protocol.CapDataHand):
		return "handed"
	case protocol.HasCapability(offer, protocol.CapDataDial):
		return "data connection"
	}
	return "session stream"
}

// startDataPlane serves the data plane's connections when the guest can
// use one of the carriers Welcome offered, until the run ends.
func (s *run) startDataPlane(hello protocol.Hello) {
	if !slices.ContainsFunc(s.dataOffer, func(c string) bool { return protocol.HasCapability(hello.Capabilities, c) }) {
		return
	}
	cfg := dataplane.Config{
		Ctx:           s.egressCtx,
		Broker:        s.cfg.Egress,
		Emit:          s.emitEgress,
		Log:           s.cfg.Log,
		HeaderTimeout: s.cfg.StreamHeaderTimeout,
		Token:         s.dataToken,
		Offer:         s.dataOffer,
		OnChannel:     func(ch *dataplane.Channel) { s.session.channel.Store(ch) },
		Direct:        s.directGuard(),
		OnViolation: func(err error) {
			select {
			case s.dataViolation <- err:
			default:
			}
		},
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		dataplane.Serve(func(ctx context.Context) (net.Conn, error) {
			c, err := s.inst.Accept(ctx)
			select {
			case <-s.inst.Done(): // the guest is gone: nothing to say
				if err != nil {
					return nil, net.ErrClosed
				}
			default:
			}
			return c, err
		}, cfg)
	}()
}

// directGuard is the guard for the data plane (a nil interface, not a nil
// pointer in one, when direct mode is not offered).
func (s *run) directGuard() dataplane.DirectGuard {
	if s.direct == nil {
		return nil
	}
	return s.direct
}
