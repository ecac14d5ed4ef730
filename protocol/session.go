package protocol

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/oac/sandbox-agent/internal/errmark"
	"github.com/oac/sandbox-agent/internal/yamux"
)

// ErrVersionMismatch is returned by both sides when their version ranges do
// not overlap.
var ErrVersionMismatch = errors.New("protocol version mismatch")

// ErrHandshakeTimeout is matched by a handshake that ran out of time
// waiting for the peer (read deadlines also match os.ErrDeadlineExceeded).
var ErrHandshakeTimeout = errors.New("handshake timed out")

// Negotiate returns the highest version in both ranges.
func Negotiate(guestMin, guestMax, hostMin, hostMax int) (int, error) {
	if guestMin < 1 || guestMin > guestMax {
		return 0, fmt.Errorf("%w: guest sent an invalid version range %d..%d", ErrBadBody, guestMin, guestMax)
	}
	v := min(guestMax, hostMax)
	if v < max(guestMin, hostMin) {
		return 0, fmt.Errorf("%w: guest speaks %d..%d, host %d..%d", ErrVersionMismatch, guestMin, guestMax, hostMin, hostMax)
	}
	return v, nil
}

// Session bounds. A host fails a guest that exceeds one (package
// host/muxguard checks them on every yamux frame before yamux acts on it);
// a correct guest stays under them by itself (package guest/egress paces
// and bounds its stream opens).
const (
	// MaxStreamWindow is the largest receive window of a stream (both
	// sides' MuxConfig): a peer never grants more, so a window update that
	// takes the other side's send window beyond it is a violation.
	MaxStreamWindow = 1 << 20
	// MaxGuestStreams bounds the streams a guest has opened that are not
	// yet closed by both sides (yamux keeps them until then).
	MaxGuestStreams = 512
	// GuestStreamReserve is kept free by the guest for its own control
	// and log streams: it opens egress and dns streams only while it holds
	// fewer than MaxGuestStreams - GuestStreamReserve streams.
	GuestStreamReserve = 64
	// MaxStreamOpenRate and MaxStreamOpenBurst bound the guest's stream
	// opens (a token bucket, per second); the guest paces itself to
	// GuestStreamOpenRate and GuestStreamOpenBurst, half of it.
	MaxStreamOpenRate    = 2000
	MaxStreamOpenBurst   = 2000
	GuestStreamOpenRate  = 1000
	GuestStreamOpenBurst = 1000
	// MaxPingRate and MaxPingBurst bound yamux pings from the guest (its
	// keepalive sends one every KeepAliveInterval, 15 s): yamux answers
	// each from a goroutine of its own.
	MaxPingRate  = 4
	MaxPingBurst = 16
)

// MuxConfig is the yamux configuration both sides use. Each value is chosen:
//   - MaxStreamWindowSize 1 MiB: the 256 KiB default throttles bulk egress
//     (measured: 1 MiB reached the best tunnel throughput here; 16 MiB was
//     slower and lets one stream pin more memory per side).
//   - AcceptBacklog MaxStreams: streams the peer opened that we have not
//     accepted yet; beyond it yamux refuses new streams instead of queuing.
//   - Keepalive every 15 s, writes time out after 10 s: a peer that vanished
//     (VM paused, transport wedged) is noticed within about half a minute,
//     and a peer that stops reading cannot block our writers forever.
//   - StreamOpenTimeout 10 s, StreamCloseTimeout 30 s: a stream the peer never
//     acknowledges or never finishes closing is reset instead of leaking.
//   - yamux's own log goes to logw (nil: discarded); it never sees payloads.
func MuxConfig(logw io.Writer) *yamux.Config {
	if logw == nil {
		logw = io.Discard
	}
	return &yamux.Config{
		AcceptBacklog:          MaxStreams,
		EnableKeepAlive:        true,
		KeepAliveInterval:      15 * time.Second,
		ConnectionWriteTimeout: 10 * time.Second,
		MaxStreamWindowSize:    MaxStreamWindow,
		StreamOpenTimeout:      10 * time.Second,
		StreamCloseTimeout:     30 * time.Second,
		LogOutput:              logw,
	}
}

// Control is the framed control stream. Send is safe for concurrent use;
// Recv must be called from one goroutine.
type Control struct {
	conn net.Conn
	mu   sync.Mutex
	// deadline is the read deadline set through SetReadDeadline; a frame's
	// body timeout never extends it and reading a frame does not clear it.
	dmu      sync.Mutex
	deadline time.Time
	// bodyTimeout replaces FrameBodyTimeout when positive.
	bodyTimeout time.Duration
}

// NewControl wraps an established control stream.
func NewControl(c net.Conn) *Control { return &Control{conn: c} }

// ControlWriteTimeout bounds one Send: a peer that stops reading the
// control stream (or grants no window) cannot block the sender forever.
const ControlWriteTimeout = 10 * time.Second

// Send writes one message within ControlWriteTimeout.
func (c *Control) Send(t Type, v any) error {
	return c.SendWithin(t, v, ControlWriteTimeout)
}

// SendWithin writes one message within d (queued sends count: Send is
// serialized).
func (c *Control) SendWithin(t Type, v any, d time.Duration) error {
	deadline := time.Now().Add(d)
	c.mu.Lock()
	defer c.mu.Unlock()
	_ = c.conn.SetWriteDeadline(deadline)
	defer func() { _ = c.conn.SetWriteDeadline(time.Time{}) }()
	return WriteMessage(c.conn, t, v)
}

// Recv reads one frame of at most MaxControlFrame bytes.
func (c *Control) Recv() (Frame, error) {
	return readFrame(c.conn, MaxControlFrame, c.readDeadline(), c.frameBodyTimeout())
}

// RecvMessage reads one frame of type want into v.
func (c *Control) RecvMessage(want Type, v any) error {
	return readMessage(c.conn, MaxControlFrame, want, v, c.readDeadline(), c.frameBodyTimeout())
}

// SetFrameBodyTimeout replaces FrameBodyTimeout for this stream (d > 0):
// a frame whose header arrived must be complete within d.
func (c *Control) SetFrameBodyTimeout(d time.Duration) {
	c.dmu.Lock()
	c.bodyTimeout = d
	c.dmu.Unlock()
}

func (c *Control) frameBodyTimeout() time.Duration {
	c.dmu.Lock()
	defer c.dmu.Unlock()
	return c.bodyTimeout
}

func (c *Control) readDeadline() time.Time {
	c.dmu.Lock()
	defer c.dmu.Unlock()
	return c.deadline
}

// Close closes the stream.
func (c *Control) Close() error { return c.conn.Close() }

// SetReadDeadline sets the read deadline of the stream.
func (c *Control) SetReadDeadline(t time.Time) error {
	c.dmu.Lock()
	c.deadline = t
	c.dmu.Unlock()
	return c.conn.SetReadDeadline(t)
}

// OpenStream opens a stream on s and writes its header.
func OpenStream(s *yamux.Session, h StreamHeader) (net.Conn, error) {
	st, err := s.OpenStream()
	if err != nil {
		return nil, fmt.Errorf("open %s stream: %w", h.Kind, err)
	}
	return StartStream(st, h)
}

// StartStream writes header h on a stream just opened; on failure it
// closes the stream.
func StartStream(st net.Conn, h StreamHeader) (net.Conn, error) {
	if err := WriteMessage(st, TypeStreamHeader, h); err != nil {
		st.Close()
		return nil, fmt.Errorf("write %s stream header: %w", h.Kind, err)
	}
	return st, nil
}

// ReadStreamHeader reads and validates the header of a stream the peer
// opened. It must arrive within timeout.
func ReadStreamHeader(c net.Conn, timeout time.Duration) (StreamHeader, error) {
	deadline := time.Now().Add(timeout)
	_ = c.SetReadDeadline(deadline)
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	var h StreamHeader
	if err := readMessage(c, MaxHeaderFrame, TypeStreamHeader, &h, deadline, 0); err != nil {
		return h, fmt.Errorf("stream header: %w", err)
	}
	return h, h.Validate()
}

// GuestHandshake runs the guest's side: open the control stream, send
// hello, wait for Welcome. A version refusal from the host is returned as an
// error wrapping ErrVersionMismatch naming both ranges.
func GuestHandshake(s *yamux.Session, hello Hello, timeout time.Duration) (*Control, Welcome, error) {
	var w Welcome
	st, err := OpenStream(s, StreamHeader{Kind: KindControl})
	if err != nil {
		return nil, w, err
	}
	c := NewControl(st)
	sendErr := c.Send(TypeHello, hello)
	// Even when the send reports an error, read what the host answered: a
	// host that refuses the version sends Error and closes at once, which
	// can make the send report "session shutdown" although Hello went out;
	// the refusal is still readable from the stream's buffer.
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	err = c.RecvMessage(TypeWelcome, &w)
	_ = c.SetReadDeadline(time.Time{})
	if err != nil {
		c.Close()
		var pe *PeerError
		if errors.As(err, &pe) && pe.Err.Code == CodeVersionMismatch {
			return nil, w, fmt.Errorf("%w: guest speaks %d..%d, host %d..%d",
				ErrVersionMismatch, hello.MinVersion, hello.MaxVersion, pe.Err.MinVersion, pe.Err.MaxVersion)
		}
		if sendErr != nil {
			return nil, w, fmt.Errorf("send Hello: %w", sendErr)
		}
		return nil, w, fmt.Errorf("wait for Welcome: %w", err)
	}
	if sendErr != nil {
		c.Close()
		return nil, w, fmt.Errorf("send Hello: %w", sendErr)
	}
	if w.Version < hello.MinVersion || w.Version > hello.MaxVersion {
		c.Close()
		return nil, w, fmt.Errorf("%w: host chose version %d, guest speaks %d..%d",
			ErrVersionMismatch, w.Version, hello.MinVersion, hello.MaxVersion)
	}
	return c, w, nil
}

// Acceptor is the host's side of a session as the handshake uses it; a
// *yamux.Session is one.
type Acceptor interface {
	Accept() (net.Conn, error)
	Close() error
}

// HostHandshake runs the host's side: accept the control stream and Hello
// within timeout, negotiate against min..max and answer Welcome or a
// refusal. welcome.Version and welcome.TimeUnixNano are filled in by
// HostHandshake.
func HostHandshake(s Acceptor, minV, maxV int, welcome Welcome, timeout time.Duration) (*Control, Hello, Welcome, error) {
	var hello Hello
	deadline := time.Now().Add(timeout)
	type accepted struct {
		c   net.Conn
		err error
	}
	ch := make(chan accepted, 1)
	go func() { c, err := s.Accept(); ch <- accepted{c, err} }()
	var st net.Conn
	select {
	case a := <-ch:
		if errors.Is(a.err, yamux.ErrInvalidVersion) || errors.Is(a.err, yamux.ErrInvalidMsgType) {
			return nil, hello, welcome, fmt.Errorf("guest sent bytes that are not an oac session (is the agent oac-guest, and does the transport carry only the session?): %w", a.err)
		}
		if a.err != nil {
			return nil, hello, welcome, fmt.Errorf("accept control stream: %w", a.err)
		}
		st = a.c
	case <-time.After(time.Until(deadline)):
		s.Close()
		return nil, hello, welcome, errmark.With(ErrHandshakeTimeout, fmt.Errorf("guest sent no control stream within %s", timeout))
	}
	h, err := ReadStreamHeader(st, time.Until(deadline))
	if err != nil {
		st.Close()
		return nil, hello, welcome, err
	}
	if h.Kind != KindControl {
		st.Close()
		return nil, hello, welcome, fmt.Errorf("%w: first stream is %q, want control", ErrUnexpectedType, h.Kind)
	}
	c := NewControl(st)
	_ = c.SetReadDeadline(deadline)
	err = c.RecvMessage(TypeHello, &hello)
	_ = c.SetReadDeadline(time.Time{})
	if err != nil {
		c.Close()
		return nil, hello, welcome, fmt.Errorf("wait for Hello: %w", err)
	}
	v, err := Negotiate(hello.MinVersion, hello.MaxVersion, minV, maxV)
	if err != nil {
		code := CodeProtocol
		if errors.Is(err, ErrVersionMismatch) {
			code = CodeVersionMismatch
		}
		_ = c.Send(TypeError, Error{Code: code, Message: err.Error(), MinVersion: minV, MaxVersion: maxV})
		c.Close()
		return nil, hello, welcome, err
	}
	welcome.Version = v
	// Stamp the clock now, not when the caller built welcome: a VM guest
	// may take seconds from transport connect to Hello, and it sets its
	// clock from this value.
	welcome.TimeUnixNano = time.Now().UnixNano()
	if err := c.Send(TypeWelcome, welcome); err != nil {
		c.Close()
		return nil, hello, welcome, fmt.Errorf("send Welcome: %w", err)
	}
	return c, hello, welcome, nil
}
