package sandbox

import (
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/oac/sandbox-agent/host/dataplane"
	"github.com/oac/sandbox-agent/host/muxguard"
	"github.com/oac/sandbox-agent/internal/yamux"
	"github.com/oac/sandbox-agent/protocol"
)

// ErrNotSupported is returned for a request the connected guest did not
// offer a capability for (an older agent, or a guest that is not a VM).
var ErrNotSupported = errors.New("the guest does not support this")

// Session is the live host side of one connected guest, handed to
// Config.Attach: what the shim's forwards and control API use while the
// guest is connected. Its methods are safe for concurrent use and fail
// once the session has ended.
type Session struct {
	sess  *yamux.Session
	guard *muxguard.Conn
	ctl   *protocol.Control
	caps  []string
	// channel is the data plane's fd channel once it is up: forwards go
	// over it instead of as streams.
	channel atomic.Pointer[dataplane.Channel]
}

// Can reports whether the guest listed capability c in its Hello.
func (s *Session) Can(c string) bool { return protocol.HasCapability(s.caps, c) }

// OpenForward opens a forward stream to 127.0.0.1:port inside the guest.
// name is informational (it appears in the guest's logs).
func (s *Session) OpenForward(port int, name string) (net.Conn, error) {
	if !s.Can(protocol.CapForward) {
		return nil, fmt.Errorf("forward to guest port %d: %w (the agent lists no %q capability)", port, ErrNotSupported, protocol.CapForward)
	}
	h := protocol.StreamHeader{Kind: protocol.KindForward, Name: name, Port: port}
	if err := h.Validate(); err != nil {
		return nil, err
	}
	if ch := s.channel.Load(); ch != nil {
		select {
		case <-ch.Done():
		default:
			return ch.Forward(port, name)
		}
	}
	st, err := s.sess.OpenStream()
	if err != nil {
		return nil, fmt.Errorf("open %s stream: %w", h.Kind, err)
	}
	return protocol.StartStream(s.guard.Track(st), h)
}

// PushTime sends the host's wall clock to the guest, which sets its clock
// from it. Only guests that listed the "time" capability (VM guests) take
// it; others get ErrNotSupported.
func (s *Session) PushTime() (time.Time, error) {
	if !s.Can(protocol.CapTime) {
		return time.Time{}, fmt.Errorf("time push: %w (only VM guests set their clock from the host)", ErrNotSupported)
	}
	now := time.Now()
	if err := s.ctl.Send(protocol.TypeTime, protocol.Time{TimeUnixNano: now.UnixNano()}); err != nil {
		return time.Time{}, fmt.Errorf("time push: %w", err)
	}
	return now, nil
}
