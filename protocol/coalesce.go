package protocol

import (
	"encoding/binary"
	"net"
	"sync"
)

// yamux writes every frame as two writes on the transport: the 12-byte
// header, then the body. On a socket or a pipe that is two system calls
// and, worse, two wakeups of the peer, whose reader gets the header alone
// and must come back for the body. Coalesce joins them.
const (
	yamuxHeaderSize = 12
	yamuxTypeData   = 0
	// coalesceCopyMax is the largest body copied behind its header into
	// one write; a larger one goes out with the header in one writev(2)
	// when the transport is a socket (two writes otherwise, which a body
	// that large amortizes).
	coalesceCopyMax = 16 << 10
)

// Coalesce returns c with yamux's frame writes joined: the header of a
// data frame that has a body is held and written together with the body,
// in the same Write call that passes the body; every other write goes
// through at once. Nothing is ever held past the Write that follows it,
// so no timer or flush is needed, and a write deadline set on c (or its
// Write's error) applies to the header and the body alike. Wrap the raw
// transport with it below anything else (writev needs the socket itself);
// it expects the one writer yamux has (its send loop) and serializes
// concurrent Writes, which would otherwise interleave headers and bodies.
func Coalesce(c net.Conn) net.Conn {
	return &coalesced{Conn: c}
}

type coalesced struct {
	net.Conn
	mu sync.Mutex
	// held is a data frame's header not yet written (len 0: none).
	held [yamuxHeaderSize]byte
	nh   int
	// buf joins a held header and a small body into one write; reused.
	buf []byte
}

func (c *coalesced) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.nh == 0 {
		if len(p) == yamuxHeaderSize && p[1] == yamuxTypeData && binary.BigEndian.Uint32(p[8:12]) > 0 {
			c.nh = copy(c.held[:], p)
			return len(p), nil
		}
		return c.Conn.Write(p)
	}
	h := c.held[:c.nh]
	c.nh = 0
	var n int
	var err error
	if len(p) <= coalesceCopyMax {
		c.buf = append(append(c.buf[:0], h...), p...)
		n, err = c.Conn.Write(c.buf)
	} else {
		bufs := net.Buffers{h, p}
		var n64 int64
		n64, err = bufs.WriteTo(c.Conn)
		n = int(n64)
	}
	// The header was reported written when it was held: count only p.
	return max(n-len(h), 0), err
}

// TransportBuffer is the socket buffer asked for a socket transport, each
// way (the kernel caps it at net.core.wmem_max and rmem_max).
const TransportBuffer = 1 << 20

// TuneTransport asks for TransportBuffer-sized socket buffers on a socket
// transport (a no-op on others).
func TuneTransport(c net.Conn) {
	type buffered interface {
		SetReadBuffer(int) error
		SetWriteBuffer(int) error
	}
	if b, ok := c.(buffered); ok {
		_ = b.SetReadBuffer(TransportBuffer)
		_ = b.SetWriteBuffer(TransportBuffer)
	}
}
