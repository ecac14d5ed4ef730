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
		return []string{protocol.CapDataFD, protocol.CapDataHand, protocol.CapDataDirect, protocol.CapDataDial}
	case transport.SchemeVsock:
		return []string{protocol.CapDataDial}
	}
	return nil
}

// dataPlane carries egress connections beside the session as the host's
// Welcome chose, once it is up; until then (and when it is not, or has
// ended) its carriers answer "not asked" and connections go as egress
// streams of the session.
type dataPlane struct {
	once    sync.Once
	begun   atomic.Bool
	setup   func()
	ready   chan struct{}
	dialer  *egress.Carrier
	channel *dataplane.Channel
	// handing: the host takes the workload's own sockets on the channel;
	// pairs: it answers Connects with pairs (not on a hand-only channel).
	handing, pairs bool
}

// newDataPlane prepares the data plane; begin sets it up, in the
// background: the boot does not wait for it (the agent begins it once
// ready), the first connection does (at most
// protocol.DataChannelTimeout).
func (a *agent) newDataPlane(ctx context.Context) *dataPlane {
	d := &dataPlane{ready: make(chan struct{})}
	w, ep := a.welcome, a.cfg.Endpoint
	pairs, handing := protocol.HasCapability(w.Capabilities, protocol.CapDataFD), protocol.HasCapability(w.Capabilities, protocol.CapDataHand)
	dialToo := protocol.HasCapability(w.Capabilities, protocol.CapDataDial)
	switch {
	case pairs || handing:
		// The fd channel; offered for handed sockets only (a host that
		// cannot make pairs here), the rest goes as data connections.
		d.setup = func() {
			defer close(d.ready)
			var forward dataplane.Forwarded
			if pairs {
				forward = func(f protocol.Forward, c net.Conn) {
					defer c.Close()
					if err := joinForward(ctx, c, f.Port, a.wl.dialLoopback); err != nil {
						a.cfg.Log.Warn("forward", "err", err)
					}
				}
			}
			ch, err := dataplane.DialChannel(ctx, ep, w.DataToken, forward, a.cfg.Log)
			if err != nil {
				if dialToo {
					a.cfg.Log.Warn("fd channel unavailable; connections go as data connections", "err", err)
					d.dial(ep, w.DataToken)
					return
				}
				a.cfg.Log.Warn("data plane unavailable; connections go over the session", "err", err)
				return
			}
			d.channel, d.pairs, d.handing = ch, pairs, handing
			if pairs {
				a.cfg.Log.Info("data plane: fd channel up", "handing", d.handing)
				return
			}
			if dialToo {
				d.dial(ep, w.DataToken)
			}
			a.cfg.Log.Info("data plane: hand-only fd channel up; the rest as data connections", "handing", d.handing, "data_connections", dialToo)
		}
	case dialToo:
		d.setup = func() {
			d.dial(ep, w.DataToken)
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

func (d *dataPlane) dial(ep transport.Endpoint, token string) {
	c := dataplane.Dialer(ep, token)
	d.dialer = &c
}

// up waits for the data plane's setup (beginning it): false when ctx
// ended first.
func (d *dataPlane) up(ctx context.Context) bool {
	d.begin()
	select {
	case <-d.ready:
		return true
	case <-ctx.Done():
		return false
	}
}

var errCancelled = egress.LocalFailure(protocol.EgressCancelled, "cancelled")

// carriers are the data plane's ways out, in order: the workload's socket
// handed to the host on the fd channel, a pair from it, the host's own
// socket for direct mode (Exit.Direct's only), a dialed data
// connection. Each answers "not asked" when the data plane does not have
// it, so the next one (in the end the session) carries the connection.
func (d *dataPlane) carriers() []egress.Carrier {
	return []egress.Carrier{
		{Name: "hand", Hand: func(ctx context.Context, c *net.TCPConn, t egress.Target, reply, early []byte) (protocol.EgressReply, bool) {
			if !d.up(ctx) {
				return errCancelled, true
			}
			if d.channel == nil || !d.handing {
				return protocol.EgressReply{}, false
			}
			return d.channel.Hand(ctx, c, t.Host, t.Port, t.Via, reply, early)
		}},
		{Name: "pair", Open: func(ctx context.Context, t egress.Target) (net.Conn, protocol.EgressReply, bool) {
			if !d.up(ctx) {
				return nil, errCancelled, true
			}
			if d.channel == nil || !d.pairs {
				return nil, protocol.EgressReply{}, false
			}
			return d.channel.Open(ctx, t.Host, t.Port, t.Via)
		}},
		{Name: "direct", Direct: func(ctx context.Context, t egress.Target) (*net.TCPConn, protocol.EgressReply, bool) {
			if !d.up(ctx) {
				return nil, errCancelled, true
			}
			if d.channel == nil || !d.pairs {
				return nil, protocol.EgressReply{}, false
			}
			return d.channel.Direct(ctx, t)
		}},
		{Name: "dial", Open: func(ctx context.Context, t egress.Target) (net.Conn, protocol.EgressReply, bool) {
			if !d.up(ctx) {
				return nil, errCancelled, true
			}
			if d.dialer == nil {
				return nil, protocol.EgressReply{}, false
			}
			return d.dialer.Open(ctx, t)
		}},
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
