package dataplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/oac/sandbox-agent/protocol"
)

// ErrToken is returned for a data connection that did not present the
// session's token (on vsock any process of the VM can dial the host's
// port, the workload too): it is closed, nothing is decided.
var ErrToken = errors.New("data connection: not the session's data token")

// MaxPendingData bounds the data plane connections waiting for their first
// frame at once; accepting pauses while that many wait.
const MaxPendingData = protocol.MaxStreams

// Serve accepts the guest's data plane connections with accept until it
// fails (the sandbox ending). Each must name itself with its first frame
// within cfg.HeaderTimeout, presenting cfg.Token: Channel sets up the fd
// channel (once, when cfg.Offer lists protocol.CapDataFD or
// protocol.CapDataHand; then served), Connect makes it a data connection (when
// cfg.Offer lists protocol.CapDataDial). Anything else is closed. Accepts
// are paced to MaxRequestRate and at most MaxPendingData connections wait
// for their first frame at once. It returns when accepting has ended and
// every connection it served has ended.
func Serve(accept func(context.Context) (net.Conn, error), cfg Config) {
	cfg.defaults()
	var wg sync.WaitGroup
	defer wg.Wait()
	limit := rate.NewLimiter(MaxRequestRate, MaxRequestBurst)
	pending := make(chan struct{}, MaxPendingData)
	var channelTaken atomic.Bool
	for {
		if err := limit.Wait(cfg.Ctx); err != nil {
			return
		}
		select {
		case pending <- struct{}{}:
		case <-cfg.Ctx.Done():
			return
		}
		c, err := accept(cfg.Ctx)
		if err != nil {
			<-pending
			if cfg.Ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
				cfg.Log.Warn("data plane: accept failed, no more data connections", "err", err)
			}
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Once its first frame is read, a connection counts against
			// the broker's stream limit (or is the channel) instead.
			release := sync.OnceFunc(func() { <-pending })
			defer release()
			if err := serveConn(c, cfg, release, &channelTaken); err != nil {
				cfg.Log.Warn("data plane: connection refused", "err", err)
			}
		}()
	}
}

// serveConn reads a data plane connection's first frame and serves it.
// It owns c.
func serveConn(c net.Conn, cfg Config, read func(), channelTaken *atomic.Bool) error {
	_ = c.SetReadDeadline(time.Now().Add(cfg.HeaderTimeout))
	f, err := protocol.ReadFrame(c, protocol.MaxHeaderFrame)
	_ = c.SetReadDeadline(time.Time{})
	read()
	if err != nil {
		c.Close()
		return fmt.Errorf("data connection: %w", violation(err))
	}
	switch {
	case f.Type == protocol.TypeChannel && (protocol.HasCapability(cfg.Offer, protocol.CapDataFD) || protocol.HasCapability(cfg.Offer, protocol.CapDataHand)):
		var hello protocol.Channel
		if err := f.Decode(&hello); err != nil || !protocol.TokenMatches(hello.Token, cfg.Token) {
			c.Close()
			return ErrToken
		}
		uc, ok := c.(*net.UnixConn)
		if !ok || !channelTaken.CompareAndSwap(false, true) {
			c.Close()
			return errors.New("fd channel: one per session, on a unix transport")
		}
		return serveChannel(uc, cfg)
	case f.Type == protocol.TypeConnect && protocol.HasCapability(cfg.Offer, protocol.CapDataDial):
		defer c.Close()
		var req protocol.Connect
		if err := f.Decode(&req); err != nil {
			return fmt.Errorf("data connection: %w", err)
		}
		if !protocol.TokenMatches(req.Token, cfg.Token) {
			return ErrToken
		}
		if req.Hand {
			cfg.violation(fmt.Errorf("%w: a data connection cannot hand a socket over", ErrViolation))
			return nil
		}
		if req.ID != 0 {
			// The token is the agent's: this is the guest breaking the
			// protocol, not a stranger knocking.
			cfg.violation(fmt.Errorf("%w: a data connection's Connect carries an id", ErrViolation))
			return nil
		}
		// The broker re-validates the target and answers InvalidArgument,
		// as on an egress stream.
		cfg.answer(req, func() (net.Conn, error) { return c, nil }, func(r protocol.Connected) error {
			_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
			defer func() { _ = c.SetWriteDeadline(time.Time{}) }()
			return protocol.WriteMessage(c, protocol.TypeConnected, r)
		}, nil)
		return nil
	}
	c.Close()
	return fmt.Errorf("data connection: %s is not a first frame this host offered", f.Type)
}
