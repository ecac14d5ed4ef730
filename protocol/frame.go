package protocol

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
)

// Type identifies a frame.
type Type uint16

// Frame types of version 1. The table in the package doc is the reference.
const (
	TypeHello        Type = 0x0001
	TypeWelcome      Type = 0x0002
	TypeBootstrap    Type = 0x0003
	TypeState        Type = 0x0004
	TypeShutdown     Type = 0x0005
	TypeError        Type = 0x0006
	TypeStreamHeader Type = 0x0007
	TypeEgressReply  Type = 0x0008
	// TypeProcess is sent only to a host whose Welcome lists CapProcess.
	TypeProcess Type = 0x0009
	// TypeDNSReply answers a dns stream; only a host whose Welcome lists
	// CapDNS serves dns streams, and only then does a guest open them.
	TypeDNSReply Type = 0x000A
	// TypeTime is sent only to a guest whose Hello lists CapTime.
	TypeTime Type = 0x000B
	// TypeAbort is sent only to a host whose Welcome lists CapAbort.
	TypeAbort Type = 0x000C
	// Data plane frames, only between a host and a guest that agreed on
	// CapDataFD or CapDataDial, never on the session.
	TypeChannel   Type = 0x000D
	TypeConnect   Type = 0x000E
	TypeConnected Type = 0x000F
	TypeForward   Type = 0x0010
	// TypeClock reads and steps a VM guest's clock (see Clock): sent only
	// to a peer that listed CapClock.
	TypeClock Type = 0x0011
)

var typeNames = map[Type]string{
	TypeHello:        "Hello",
	TypeWelcome:      "Welcome",
	TypeBootstrap:    "Bootstrap",
	TypeState:        "State",
	TypeShutdown:     "Shutdown",
	TypeError:        "Error",
	TypeStreamHeader: "StreamHeader",
	TypeEgressReply:  "EgressReply",
	TypeProcess:      "Process",
	TypeDNSReply:     "DNSReply",
	TypeTime:         "Time",
	TypeAbort:        "Abort",
	TypeChannel:      "Channel",
	TypeConnect:      "Connect",
	TypeConnected:    "Connected",
	TypeForward:      "Forward",
	TypeClock:        "Clock",
}

func (t Type) String() string {
	if n, ok := typeNames[t]; ok {
		return n
	}
	return fmt.Sprintf("Type(0x%04x)", uint16(t))
}

// Known reports whether t is a frame type of version 1.
func (t Type) Known() bool { _, ok := typeNames[t]; return ok }

// HeaderSize is the size of a frame header in bytes.
const HeaderSize = 8

// Limits enforced on read. See the package doc.
const (
	MaxControlFrame  = 256 << 10
	MaxHeaderFrame   = 4 << 10
	HelloTimeout     = 10 * time.Second
	FrameBodyTimeout = 10 * time.Second
	MaxStreams       = 256
)

// Errors a reader returns; test with errors.Is.
var (
	ErrFrameTooLarge  = errors.New("frame too large")
	ErrUnknownType    = errors.New("unknown frame type")
	ErrBadFlags       = errors.New("frame flags must be zero in protocol version 1")
	ErrTruncated      = errors.New("truncated frame")
	ErrBadBody        = errors.New("malformed frame body")
	ErrUnexpectedType = errors.New("unexpected frame type")
)

// Frame is one decoded frame. Body is owned by the caller.
type Frame struct {
	Type Type
	Body []byte
}

// deadliner is implemented by net.Conn and yamux streams.
type deadliner interface{ SetReadDeadline(time.Time) error }

// frameBodyTimeout is the FrameBodyTimeout in force; tests shorten it.
var frameBodyTimeout = FrameBodyTimeout

// ReadFrame reads one frame from r, refusing bodies larger than max before
// allocating them. If r supports read deadlines, the body must arrive within
// FrameBodyTimeout of the header (a peer stalling mid-frame is cut off); the
// deadline is cleared afterwards.
func ReadFrame(r io.Reader, max int) (Frame, error) { return readFrame(r, max, time.Time{}, 0) }

// readFrame is ReadFrame for a caller that has set the read deadline outer
// on r (zero: none): the body deadline never extends past outer, and outer is
// restored afterwards instead of being cleared. bodyTimeout replaces
// FrameBodyTimeout when positive.
func readFrame(r io.Reader, max int, outer time.Time, bodyTimeout time.Duration) (Frame, error) {
	var hdr [HeaderSize]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return Frame{}, fmt.Errorf("%w: header cut short", ErrTruncated)
		}
		return Frame{}, err
	}
	t := Type(binary.BigEndian.Uint16(hdr[0:2]))
	flags := binary.BigEndian.Uint16(hdr[2:4])
	n := binary.BigEndian.Uint32(hdr[4:8])
	if !t.Known() {
		return Frame{}, fmt.Errorf("%w 0x%04x: the peer speaks another protocol or sent garbage", ErrUnknownType, uint16(t))
	}
	if flags != 0 {
		return Frame{}, fmt.Errorf("%s: %w (got 0x%04x)", t, ErrBadFlags, flags)
	}
	if uint64(n) > uint64(max) {
		return Frame{}, fmt.Errorf("%s: %w: %d bytes, limit %d", t, ErrFrameTooLarge, n, max)
	}
	if d, ok := r.(deadliner); ok && n > 0 {
		bt := frameBodyTimeout
		if bodyTimeout > 0 {
			bt = bodyTimeout
		}
		until := time.Now().Add(bt)
		if !outer.IsZero() && outer.Before(until) {
			until = outer
		}
		_ = d.SetReadDeadline(until)
		defer func() { _ = d.SetReadDeadline(outer) }()
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return Frame{}, fmt.Errorf("%s: %w: body of %d bytes: %v", t, ErrTruncated, n, err)
	}
	return Frame{Type: t, Body: body}, nil
}

// AppendFrame appends the encoding of a frame to b.
func AppendFrame(b []byte, t Type, body []byte) []byte {
	var hdr [HeaderSize]byte
	binary.BigEndian.PutUint16(hdr[0:2], uint16(t))
	binary.BigEndian.PutUint32(hdr[4:8], uint32(len(body)))
	return append(append(b, hdr[:]...), body...)
}

// WriteFrame writes one frame in a single Write call, so concurrent writers
// that serialise on w never interleave partial frames.
func WriteFrame(w io.Writer, t Type, body []byte) error {
	if len(body) > MaxControlFrame {
		return fmt.Errorf("write %s: %w: %d bytes, limit %d", t, ErrFrameTooLarge, len(body), MaxControlFrame)
	}
	_, err := w.Write(AppendFrame(make([]byte, 0, HeaderSize+len(body)), t, body))
	return err
}

// WriteMessage encodes v as JSON and writes it as a frame of type t.
func WriteMessage(w io.Writer, t Type, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s: %w", t, err)
	}
	return WriteFrame(w, t, body)
}

// Decode unmarshals the frame body into v: exactly one JSON object, no
// trailing data.
func (f Frame) Decode(v any) error {
	trimmed := bytes.TrimSpace(f.Body)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return fmt.Errorf("%s: %w: body is not a JSON object", f.Type, ErrBadBody)
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%s: %w: %v", f.Type, ErrBadBody, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("%s: %w: trailing data after the JSON object", f.Type, ErrBadBody)
	}
	return nil
}

// ReadMessage reads one frame, checks that it has type want and decodes its
// body into v. An Error frame from the peer is returned as *PeerError.
func ReadMessage(r io.Reader, max int, want Type, v any) error {
	return readMessage(r, max, want, v, time.Time{}, 0)
}

func readMessage(r io.Reader, max int, want Type, v any, outer time.Time, bodyTimeout time.Duration) error {
	f, err := readFrame(r, max, outer, bodyTimeout)
	if err != nil {
		return err
	}
	return f.expect(want, v)
}

func (f Frame) expect(want Type, v any) error {
	if f.Type == TypeError && want != TypeError {
		var e Error
		if err := f.Decode(&e); err != nil {
			return err
		}
		return &PeerError{Err: e}
	}
	if f.Type != want {
		return fmt.Errorf("%w: got %s, want %s", ErrUnexpectedType, f.Type, want)
	}
	return f.Decode(v)
}
