package sandbox

import (
	"context"
	"net"
	"slices"

	"github.com/oac/sandbox-agent/host/dataplane"
	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/protocol"
)

// dataCarriers returns the data plane carriers to offer: what the
// provider's transport allows, the fd channel only to a shim that can
// make pairs in the guest's namespace, narrowed by Config.DataPlane, and
// with it protocol.CapDataHand (and protocol.CapDataDirect when
// Config.DataPlane is DataPlaneDirect: auto's carriers, plus direct).
func (s *run) dataCarriers() []string {
	dp, ok := s.inst.(provider.DataPlane)
	if !ok || s.cfg.DataPlane == DataPlaneOff {
		return nil
	}
	var offer []string
	for _, c := range dp.DataCarriers() {
		if c == protocol.CapDataFD && !dataplane.CanPassFDs() {
			continue
		}
		if s.cfg.DataPlane == "" || s.cfg.DataPlane == DataPlaneDirect || s.cfg.DataPlane == c {
			offer = append(offer, c)
		}
	}
	if slices.Contains(offer, protocol.CapDataFD) {
		// The fd channel also takes the workload's own sockets, carried
		// here with no copy in the guest.
		offer = append(offer, protocol.CapDataHand)
		if s.cfg.DataPlane == DataPlaneDirect {
			offer = append(offer, protocol.CapDataDirect)
		}
	}
	return offer
}

// directUnavailable says why direct mode, asked for, will not be used
// here: the provider has no fd channel (a guest sharing this kernel on a
// unix transport, and a shim that is root), or the guest's agent cannot
// trap connects. "" when it is on, or was not asked for.
func (s *run) directUnavailable(hello protocol.Hello) string {
	if s.cfg.DataPlane != DataPlaneDirect {
		return ""
	}
	switch {
	case !protocol.HasCapability(s.dataOffer, protocol.CapDataDirect):
		return "direct mode unavailable: it needs the fd channel (a guest sharing this kernel on a unix transport, and oac-shim as root); connections take the " + fallbackPath(s.dataOffer) + " path"
	case !protocol.HasCapability(hello.Capabilities, protocol.CapDataDirect):
		return "direct mode unavailable: this guest's agent cannot trap connects; connections take the handed path"
	}
	return ""
}

func fallbackPath(offer []string) string {
	switch {
	case protocol.HasCapability(offer, protocol.CapDataFD):
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
