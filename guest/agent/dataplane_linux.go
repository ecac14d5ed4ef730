package agent

import (
	"context"
	"net"
	"sync"
	"sync/atomic"

	"github.com/oac/sandbox-agent/guest/dataplane"
	"github.com/oac/sandbox-agent/guest/egress"
	"github.com/oac/sandbox-agent/protocol"
	"github.com/oac/sandbox-agent/protocol/transport"
)

// dataPlaneCaps are the data plane capabilities ep allows: a unix
// transport can take descriptors and be dialed again, vsock dialed again.
func dataPlaneCaps(ep transport.Endpoint) []string {
	switch ep.Scheme {
	case transport.SchemeUnix:
		return []string{protocol.CapDataFD, protocol.CapDataHand, protocol.CapDataDial}
	case transport.SchemeVsock:
		return []string{protocol.CapDataDial}
	}
	return nil
}

// dataPlane carries egress connections beside the session as the host's
// Welcome chose, once it is up; until then (and when it is not, or has
// ended) they go as egress streams of the session.
type dataPlane struct {
	once    sync.Once
	begun   atomic.Bool
	setup   func()
	ready   chan struct{}
	carry   dataplane.Carrier
	channel *dataplane.Channel
	// handing: the host takes the workload's own sockets on the channel.
	handing bool
}

// newDataPlane prepares the data plane; begin sets it up, in the
// background: the boot does not wait for it (the agent begins it once
// ready), the first connection does (at most
// protocol.DataChannelTimeout).
func (a *agent) newDataPlane(ctx context.Context) *dataPlane {
	d := &dataPlane{ready: make(chan struct{})}
	w, ep := a.welcome, a.cfg.Endpoint
	switch {
	case protocol.HasCapability(w.Capabilities, protocol.CapDataFD):
		d.setup = func() {
			defer close(d.ready)
			ch, err := dataplane.DialChannel(ctx, ep, w.DataToken, func(f protocol.Forward, c net.Conn) {
				defer c.Close()
				if err := joinForward(ctx, c, f.Port, a.wl.dialLoopback); err != nil {
					a.cfg.Log.Warn("forward", "err", err)
				}
			}, a.cfg.Log)
			if err != nil {
				if protocol.HasCapability(w.Capabilities, protocol.CapDataDial) {
					a.cfg.Log.Warn("fd channel unavailable; connections go as data connections", "err", err)
					d.carry = dataplane.Dialer(ep, w.DataToken)
					return
				}
				a.cfg.Log.Warn("data plane unavailable; connections go over the session", "err", err)
				return
			}
			d.channel, d.carry = ch, ch.Open
			d.handing = protocol.HasCapability(w.Capabilities, protocol.CapDataHand)
			a.cfg.Log.Info("data plane: fd channel up", "handing", d.handing)
		}
	case protocol.HasCapability(w.Capabilities, protocol.CapDataDial):
		d.setup = func() {
			d.carry = dataplane.Dialer(ep, w.DataToken)
			a.cfg.Log.Info("data plane: data connections", "endpoint", ep.String())
			close(d.ready)
		}
	default:
		d.setup = func() { close(d.ready) }
	}
	return d
}

// begin sets the data plane up in the background, once.
func (d *dataPlane) begin() {
	d.once.Do(func() {
		d.begun.Store(true)
		go d.setup()
	})
}

// opener carries on the data plane, falling back to session.
func (d *dataPlane) opener(session egress.Opener) egress.Opener {
	return dataplane.Opener(func(ctx context.Context, host string, port int, via string) (net.Conn, protocol.EgressReply, bool) {
		d.begin()
		select {
		case <-d.ready:
		case <-ctx.Done():
			return nil, egress.LocalFailure(protocol.EgressCancelled, "cancelled"), true
		}
		if d.carry == nil {
			return nil, protocol.EgressReply{}, false
		}
		return d.carry(ctx, host, port, via)
	}, session)
}

// hander hands the workload's sockets to the host on the fd channel when
// the host takes them; otherwise it answers "not asked" and the opener
// carries the connection.
func (d *dataPlane) hander() egress.Hander {
	return func(ctx context.Context, c *net.TCPConn, host string, port int, via string, reply, early []byte) (protocol.EgressReply, bool) {
		d.begin()
		select {
		case <-d.ready:
		case <-ctx.Done():
			return egress.LocalFailure(protocol.EgressCancelled, "cancelled"), true
		}
		if d.channel == nil || !d.handing {
			return protocol.EgressReply{}, false
		}
		return d.channel.Hand(ctx, c, host, port, via, reply, early)
	}
}

// close ends the fd channel, if there is one.
func (d *dataPlane) close() {
	if !d.begun.Load() {
		return
	}
	<-d.ready
	if d.channel != nil {
		d.channel.Close()
	}
}
