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
// with it protocol.CapDataHand.
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
		if s.cfg.DataPlane == "" || s.cfg.DataPlane == c {
			offer = append(offer, c)
		}
	}
	if slices.Contains(offer, protocol.CapDataFD) {
		// The fd channel also takes the workload's own sockets, carried
		// here with no copy in the guest.
		offer = append(offer, protocol.CapDataHand)
	}
	return offer
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
