package protocol

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/oac/sandbox-agent/internal/yamux"
)

// StreamGate keeps a guest's stream opens within the host's session
// bounds, so that what a workload does (a connect loop, a thousand
// parallel downloads) never looks like a hostile agent: an open waits
// while the session holds MaxGuestStreams - GuestStreamReserve streams or
// more, and opens are paced to GuestStreamOpenRate. The host's own limits
// are higher (MaxGuestStreams, MaxStreamOpenRate): only an agent that
// bypasses the gate reaches them.
type StreamGate struct {
	sess *yamux.Session
	max  int
	pace *rate.Limiter
	mu   sync.Mutex
	poll time.Duration
	// OnAbort, when set, tells the host about an aborted stream (Abort
	// sends an Abort message through it). Set it before the first Open.
	OnAbort func(id uint32)
}

// NewStreamGate gates opens on sess.
func NewStreamGate(sess *yamux.Session) *StreamGate {
	return &StreamGate{
		sess: sess, max: MaxGuestStreams - GuestStreamReserve,
		pace: rate.NewLimiter(GuestStreamOpenRate, GuestStreamOpenBurst),
		poll: 5 * time.Millisecond,
	}
}

// ErrGateTimeout is returned by Open when no stream slot came free in
// time.
var ErrGateTimeout = fmt.Errorf("the session holds %d streams to the host, its limit for connections", MaxGuestStreams-GuestStreamReserve)

// Open waits, until ctx ends, for a free stream slot and for the pace,
// then opens a stream and writes its header.
func (g *StreamGate) Open(ctx context.Context, h StreamHeader) (net.Conn, error) {
	if err := g.pace.Wait(ctx); err != nil {
		return nil, fmt.Errorf("open %s stream: %w: %w", h.Kind, ErrGateTimeout, err)
	}
	// One open at a time: the count and the open it allows are one step.
	g.mu.Lock()
	for g.sess.NumStreams() >= g.max {
		select {
		case <-ctx.Done():
			g.mu.Unlock()
			return nil, fmt.Errorf("open %s stream: %w", h.Kind, ErrGateTimeout)
		case <-g.sess.CloseChan():
			g.mu.Unlock()
			return nil, fmt.Errorf("open %s stream: %w", h.Kind, yamux.ErrSessionShutdown)
		case <-time.After(g.poll):
		}
	}
	st, err := g.sess.OpenStream()
	g.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("open %s stream: %w", h.Kind, err)
	}
	c, err := StartStream(st, h)
	if err != nil {
		return nil, err
	}
	return &GatedStream{Conn: c, gate: g, id: st.StreamID()}, nil
}

// GatedStream is a stream opened through a StreamGate.
type GatedStream struct {
	net.Conn
	gate *StreamGate
	id   uint32
}

// Abort ends the stream for good on both sides: reads fail at once, the
// stream is closed, and the host is told (OnAbort) so that it closes
// what the stream carries instead of writing into a stream nobody reads.
func (s *GatedStream) Abort() {
	_ = s.SetReadDeadline(time.Now())
	_ = s.Close()
	if s.gate.OnAbort != nil {
		s.gate.OnAbort(s.id)
	}
}
