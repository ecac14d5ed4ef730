package muxguard

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/oac/sandbox-agent/internal/yamux"
	"github.com/oac/sandbox-agent/protocol"
)

// yamux's frame layout (github.com/hashicorp/yamux spec.md): version,
// type, flags, stream id, length; big-endian.
const (
	headerSize = 12

	typeData         = 0
	typeWindowUpdate = 1
	typePing         = 2
	typeGoAway       = 3

	flagSYN    = 1
	flagACK    = 2
	flagFIN    = 4
	flagRST    = 8
	flagsKnown = flagSYN | flagACK | flagFIN | flagRST

	// initialWindow is yamux's window of a new stream in each direction,
	// usable before any window update.
	initialWindow = 256 << 10
	// maxGoAwayCode is the largest GoAway code yamux defines (internal error).
	maxGoAwayCode = 2
)

// Errors of Conn.Err; test with errors.Is.
var (
	// ErrHostile: the guest sent a frame no correct guest sends.
	ErrHostile = errors.New("hostile guest")
	// ErrStalled: a write to the guest did not complete within
	// Limits.WriteTimeout (the guest stopped reading the transport).
	ErrStalled = errors.New("guest stopped reading the transport")
)

// Limits are the bounds a Conn enforces. Zero fields take the defaults of
// DefaultLimits.
type Limits struct {
	// MaxStreams bounds the streams the guest opened that are not yet
	// closed by both sides.
	MaxStreams int
	// OpenRate and OpenBurst bound stream opens (token bucket).
	OpenRate  float64
	OpenBurst int
	// PingRate and PingBurst bound pings (token bucket).
	PingRate  float64
	PingBurst int
	// MaxWindow is the most a stream's send window may reach.
	MaxWindow uint32
	// RecvBudget bounds the bytes the guest sent on live streams that the
	// host has not read yet, all streams together.
	RecvBudget int64
	// WriteTimeout bounds every write to the guest.
	WriteTimeout time.Duration
}

// Defaults of Limits.
const (
	// DefaultRecvBudget is the session's receive budget: with the
	// receive buffers' growth (at most about twice their content) it is
	// what keeps one sandbox's shim under its memory ceiling
	// (docs/threat-model.md).
	DefaultRecvBudget = 8 << 20
	// DefaultWriteTimeout bounds each write to the guest's transport.
	DefaultWriteTimeout = 10 * time.Second
)

// DefaultLimits are the production bounds (package protocol's session
// bounds).
func DefaultLimits() Limits {
	return Limits{
		MaxStreams: protocol.MaxGuestStreams,
		OpenRate:   protocol.MaxStreamOpenRate, OpenBurst: protocol.MaxStreamOpenBurst,
		PingRate: protocol.MaxPingRate, PingBurst: protocol.MaxPingBurst,
		MaxWindow:    protocol.MaxStreamWindow,
		RecvBudget:   DefaultRecvBudget,
		WriteTimeout: DefaultWriteTimeout,
	}
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	if l.MaxStreams <= 0 {
		l.MaxStreams = d.MaxStreams
	}
	if l.OpenRate <= 0 {
		l.OpenRate, l.OpenBurst = d.OpenRate, d.OpenBurst
	}
	if l.OpenBurst <= 0 {
		l.OpenBurst = 1
	}
	if l.PingRate <= 0 {
		l.PingRate, l.PingBurst = d.PingRate, d.PingBurst
	}
	if l.PingBurst <= 0 {
		l.PingBurst = 1
	}
	if l.MaxWindow == 0 {
		l.MaxWindow = d.MaxWindow
	}
	if l.RecvBudget <= 0 {
		l.RecvBudget = d.RecvBudget
	}
	if l.WriteTimeout <= 0 {
		l.WriteTimeout = d.WriteTimeout
	}
	return l
}

// stream is what the guard knows of one live stream.
type stream struct {
	guest bool // opened by the guest
	// send is the host's send window: what the guest allowed the host to
	// send; recv is the guest's: what the host allowed the guest to send.
	send, recv int64
	// unread counts bytes the guest sent that the host has not read.
	unread            int64
	finGuest, finHost bool
}

// Conn is the guest's transport, guarded. Read is called by yamux's
// receive loop only, Write by its send loop only; the rest is safe for
// concurrent use.
type Conn struct {
	conn net.Conn
	l    Limits
	now  func() time.Time

	// Read side.
	hdr     [headerSize]byte
	pending []byte // validated header bytes not yet returned
	body    uint32 // data bytes of the current frame still to pass
	valid   bool   // a valid frame was seen: bad bytes now are hostile

	// Write side.
	whdr  [headerSize]byte
	wn    int
	wbody uint32

	mu           sync.Mutex
	budget       *sync.Cond
	streams      map[uint32]*stream
	guestStreams int
	unread       int64
	peakUnread   int64
	opens, pings *rate.Limiter
	kept         int // tracked streams keeping their receive buffer
	err          error
	done         chan struct{}
	closed       bool
}

// New guards c with l.
func New(c net.Conn, l Limits) *Conn {
	return newConn(c, l, time.Now)
}

func newConn(c net.Conn, l Limits, now func() time.Time) *Conn {
	l = l.withDefaults()
	g := &Conn{
		conn: c, l: l, now: now,
		streams: map[uint32]*stream{},
		opens:   rate.NewLimiter(rate.Limit(l.OpenRate), l.OpenBurst),
		pings:   rate.NewLimiter(rate.Limit(l.PingRate), l.PingBurst),
		done:    make(chan struct{}),
	}
	g.budget = sync.NewCond(&g.mu)
	return g
}

// Err returns the first violation (wrapping ErrHostile or ErrStalled), or
// nil.
func (g *Conn) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// Violated is closed at the first violation.
func (g *Conn) Violated() <-chan struct{} { return g.done }

// Stats are the guard's counters, for tests and figures.
type Stats struct {
	GuestStreams int
	Unread       int64
	PeakUnread   int64
}

// Stats returns the counters now.
func (g *Conn) Stats() Stats {
	g.mu.Lock()
	defer g.mu.Unlock()
	return Stats{GuestStreams: g.guestStreams, Unread: g.unread, PeakUnread: g.peakUnread}
}

// violate records err (the first one wins) and closes the transport:
// yamux's loops fail and the session ends.
func (g *Conn) violate(err error) error {
	g.mu.Lock()
	if g.err == nil {
		g.err = err
		close(g.done)
	}
	err = g.err
	g.closed = true
	g.budget.Broadcast()
	g.mu.Unlock()
	_ = g.conn.Close()
	return err
}

func hostile(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrHostile}, a...)...)
}

// Read passes the guest's bytes to yamux, each frame header only once it
// is checked.
func (g *Conn) Read(p []byte) (int, error) {
	if len(g.pending) > 0 {
		n := copy(p, g.pending)
		g.pending = g.pending[n:]
		return n, nil
	}
	if g.body > 0 {
		n, err := g.conn.Read(p[:min(uint32(len(p)), g.body)])
		g.body -= uint32(n)
		return n, g.readErr(err)
	}
	if _, err := io.ReadFull(g.conn, g.hdr[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			err = io.EOF
		}
		return 0, g.readErr(err)
	}
	if err := g.checkGuestFrame(g.hdr[:]); err != nil {
		return 0, g.violate(err)
	}
	g.valid = true
	if g.hdr[1] == typeData {
		g.body = binary.BigEndian.Uint32(g.hdr[8:12])
	}
	g.pending = g.hdr[:]
	n := copy(p, g.pending)
	g.pending = g.pending[n:]
	return n, nil
}

// readErr prefers the recorded violation to the error it caused.
func (g *Conn) readErr(err error) error {
	if err == nil {
		return nil
	}
	if v := g.Err(); v != nil {
		return v
	}
	return err
}

// checkGuestFrame checks one header from the guest, updates the streams,
// and waits for the receive budget before a data frame passes.
func (g *Conn) checkGuestFrame(h []byte) error {
	ver, typ := h[0], h[1]
	flags := binary.BigEndian.Uint16(h[2:4])
	id := binary.BigEndian.Uint32(h[4:8])
	length := binary.BigEndian.Uint32(h[8:12])
	if ver != 0 {
		return g.notYamux(yamux.ErrInvalidVersion, "yamux version %d", ver)
	}
	if typ > typeGoAway {
		return g.notYamux(yamux.ErrInvalidMsgType, "yamux frame type %d", typ)
	}
	if flags&^flagsKnown != 0 {
		return hostile("yamux flags 0x%x (defined: SYN, ACK, FIN, RST)", flags)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	switch typ {
	case typePing:
		if !g.pings.AllowN(g.now(), 1) {
			return hostile("pings faster than %g a second (burst %d): yamux answers each from a goroutine of its own", g.l.PingRate, g.l.PingBurst)
		}
		return nil
	case typeGoAway:
		if length > maxGoAwayCode {
			return hostile("GoAway with unknown code %d", length)
		}
		return nil
	}
	if typ == typeData && length > g.l.MaxWindow {
		return hostile("data frame of %d bytes on stream %d: more than the %d-byte window a stream may have", length, id, g.l.MaxWindow)
	}
	if flags&flagSYN != 0 {
		if err := g.guestOpens(id); err != nil {
			return err
		}
	}
	st := g.streams[id]
	if st == nil {
		// A stream the host already reset (or never had): yamux discards
		// the frame; its length is checked above.
		return nil
	}
	switch typ {
	case typeWindowUpdate:
		st.send += int64(length)
		if st.send > int64(g.l.MaxWindow) {
			return hostile("window update on stream %d takes the host's send window to %d bytes, beyond the %d a stream may have (a window past 2^32 would wrap and stall the host's writes)", id, st.send, g.l.MaxWindow)
		}
	case typeData:
		if int64(length) > st.recv {
			return hostile("%d bytes of data on stream %d, beyond the %d-byte window the host granted", length, id, st.recv)
		}
		if length > 0 {
			// Wait until the host has read enough: the budget holds
			// whatever the guest sends, at the cost of the guest's
			// throughput. Frames of a stream that closes meanwhile still
			// count until yamux takes them.
			for g.unread > 0 && g.unread+int64(length) > g.l.RecvBudget && !g.closed {
				g.budget.Wait()
			}
			if g.closed {
				return g.err
			}
			st.recv -= int64(length)
			st.unread += int64(length)
			g.unread += int64(length)
			g.peakUnread = max(g.peakUnread, g.unread)
		}
	}
	g.flags(id, st, flags, true)
	return nil
}

// notYamux names bytes that are not a yamux frame: before any valid frame
// it is a peer speaking something else (yamux's own error, which the
// handshake explains); after one, a hostile guest.
func (g *Conn) notYamux(yerr error, format string, a ...any) error {
	if !g.valid {
		return fmt.Errorf("%w: "+format, append([]any{yerr}, a...)...)
	}
	return fmt.Errorf("%w: %w: "+format, append([]any{ErrHostile, yerr}, a...)...)
}

// guestOpens admits a stream the guest opens; g.mu is held.
func (g *Conn) guestOpens(id uint32) error {
	if id%2 == 0 {
		return hostile("opened stream %d, an id of the host's (even) parity", id)
	}
	if g.streams[id] != nil {
		// yamux would end the session too (duplicate stream).
		return hostile("opened stream %d while it is open", id)
	}
	if g.guestStreams >= g.l.MaxStreams {
		return hostile("%d streams open in the session (limit %d): the guest opens streams without closing them", g.guestStreams+1, g.l.MaxStreams)
	}
	if !g.opens.AllowN(g.now(), 1) {
		return hostile("opens streams faster than %g a second (burst %d)", g.l.OpenRate, g.l.OpenBurst)
	}
	g.guestStreams++
	g.streams[id] = &stream{guest: true, send: initialWindow, recv: initialWindow}
	return nil
}

// flags applies FIN and RST from either side; g.mu is held.
func (g *Conn) flags(id uint32, st *stream, flags uint16, fromGuest bool) {
	if flags&flagRST != 0 {
		g.remove(id, st)
		return
	}
	if flags&flagFIN != 0 {
		if fromGuest {
			st.finGuest = true
		} else {
			st.finHost = true
		}
		if st.finGuest && st.finHost {
			g.remove(id, st)
		}
	}
}

// remove forgets a stream yamux has removed too; g.mu is held.
func (g *Conn) remove(id uint32, st *stream) {
	delete(g.streams, id)
	if st.guest {
		g.guestStreams--
	}
	if st.unread > 0 {
		g.unread -= st.unread
		g.budget.Broadcast()
	}
}

// Write passes the host's bytes to the guest, within WriteTimeout, and
// follows its frames.
func (g *Conn) Write(p []byte) (int, error) {
	g.followHost(p)
	_ = g.conn.SetWriteDeadline(g.now().Add(g.l.WriteTimeout))
	n, err := g.conn.Write(p)
	if err != nil {
		var ne net.Error
		if errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
			return n, g.violate(fmt.Errorf("%w: a write of %d bytes did not complete within %s", ErrStalled, len(p), g.l.WriteTimeout))
		}
		return n, g.readErr(err)
	}
	return n, nil
}

// followHost parses the host's frames in p (yamux writes a header, then
// its body, but any split is followed).
func (g *Conn) followHost(p []byte) {
	for len(p) > 0 {
		if g.wbody > 0 {
			n := min(uint32(len(p)), g.wbody)
			g.wbody -= n
			p = p[n:]
			continue
		}
		n := copy(g.whdr[g.wn:], p)
		g.wn += n
		p = p[n:]
		if g.wn < headerSize {
			return
		}
		g.wn = 0
		g.hostFrame(g.whdr[:])
	}
}

func (g *Conn) hostFrame(h []byte) {
	typ := h[1]
	flags := binary.BigEndian.Uint16(h[2:4])
	id := binary.BigEndian.Uint32(h[4:8])
	length := binary.BigEndian.Uint32(h[8:12])
	if typ == typeData {
		g.wbody = length
	}
	if typ != typeData && typ != typeWindowUpdate {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	st := g.streams[id]
	if st == nil && flags&flagSYN != 0 {
		st = &stream{send: initialWindow, recv: initialWindow}
		g.streams[id] = st
	}
	if st == nil {
		return
	}
	if typ == typeData {
		st.send -= int64(length)
	} else {
		st.recv += int64(length)
	}
	g.flags(id, st, flags, false)
}

// consumed records that the host read n bytes of stream id.
func (g *Conn) consumed(id uint32, n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	st := g.streams[id]
	if st == nil {
		return
	}
	d := min(int64(n), st.unread)
	st.unread -= d
	g.unread -= d
	if d > 0 {
		g.budget.Broadcast()
	}
}

// Close closes the transport and releases a receive loop waiting for the
// budget.
func (g *Conn) Close() error {
	g.mu.Lock()
	g.closed = true
	g.budget.Broadcast()
	g.mu.Unlock()
	return g.conn.Close()
}

// LocalAddr and RemoteAddr are the transport's.
func (g *Conn) LocalAddr() net.Addr  { return g.conn.LocalAddr() }
func (g *Conn) RemoteAddr() net.Addr { return g.conn.RemoteAddr() }

// Receive buffers kept between reads. yamux allocates a stream's receive
// buffer when a frame arrives and none is held, so freeing it whenever a
// read empties it (what bounds an idle stream's memory) costs a fresh,
// zeroed allocation per frame on a stream that moves bulk data: measured,
// upload through the session ran at a sixth of download's speed, most of
// it clearing memory and collecting it again. A stream whose read returns
// at least KeepAfterRead bytes keeps its buffer until it is idle (Shrink,
// which pipe.Copy calls when no byte came for its release delay), its
// reader sees an error, or it is closed; at most MaxKeptBuffers streams of
// a session do at once, each buffer at most about three times
// protocol.MaxStreamWindow (yamux grows it to twice its size plus a frame
// while it is not empty).
const (
	MaxKeptBuffers = 4
	KeepAfterRead  = 32 << 10
)

// Track returns st reporting what the host reads from it to the receive
// budget, and freeing its receive buffer whenever it is empty unless it
// holds one of the session's MaxKeptBuffers. Every stream of a guarded
// session must be read through Track.
func (g *Conn) Track(st *yamux.Stream) net.Conn {
	return &tracked{Stream: st, g: g}
}

type tracked struct {
	*yamux.Stream
	g *Conn
	// kept: this stream holds one of g's kept buffers (only its reader
	// changes it, under g.mu).
	kept bool
}

func (t *tracked) Read(b []byte) (int, error) {
	n, err := t.Stream.Read(b)
	if n > 0 {
		t.g.consumed(t.StreamID(), n)
		if err == nil && t.keep(n) {
			return n, nil
		}
		t.Stream.Shrink()
	}
	if err != nil {
		t.release()
	}
	return n, err
}

// keep reports whether the stream keeps its buffer after a read of n
// bytes, taking a slot when the read was a bulk one and one is free.
func (t *tracked) keep(n int) bool {
	t.g.mu.Lock()
	defer t.g.mu.Unlock()
	if !t.kept && n >= KeepAfterRead && t.g.kept < MaxKeptBuffers && !t.g.closed {
		t.kept = true
		t.g.kept++
	}
	return t.kept
}

// release gives the slot back and frees the buffer if it is empty.
func (t *tracked) release() {
	t.g.mu.Lock()
	if t.kept {
		t.kept = false
		t.g.kept--
	}
	t.g.mu.Unlock()
	t.Stream.Shrink()
}

// Shrink frees the receive buffer (when empty) and gives its slot back:
// the reader found the stream idle.
func (t *tracked) Shrink() { t.release() }

// Close closes the stream's write half; its buffer is not kept any more.
func (t *tracked) Close() error {
	err := t.Stream.Close()
	t.release()
	return err
}
