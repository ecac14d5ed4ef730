package muxinject

import (
	"encoding/binary"
	"net"
	"sync"
)

// yamux frame types and flags (github.com/hashicorp/yamux spec.md).
const (
	TypeData         = 0
	TypeWindowUpdate = 1
	TypePing         = 2
	TypeGoAway       = 3
	FlagSYN          = 1
	FlagACK          = 2
	FlagFIN          = 4
	FlagRST          = 8
	headerSize       = 12
)

// Frame encodes a yamux frame header followed by body.
func Frame(typ uint8, flags uint16, id, length uint32, body []byte) []byte {
	h := make([]byte, headerSize, headerSize+len(body))
	h[1] = typ
	binary.BigEndian.PutUint16(h[2:4], flags)
	binary.BigEndian.PutUint32(h[4:8], id)
	binary.BigEndian.PutUint32(h[8:12], length)
	return append(h, body...)
}

// Conn is a transport whose writes from the yamux session above it may be
// interleaved with injected frames, always at a frame boundary.
type Conn struct {
	net.Conn
	mu      sync.Mutex
	holding bool // the session's send loop is inside a frame
	hdr     [headerSize]byte
	hn      int
	body    uint32
}

// Wrap wraps c.
func Wrap(c net.Conn) *Conn { return &Conn{Conn: c} }

// Write is the session's: yamux writes a header, then its body, from one
// goroutine; the lock is held from a frame's first byte to its last.
func (c *Conn) Write(p []byte) (int, error) {
	if !c.holding {
		c.mu.Lock()
		c.holding = true
	}
	n, err := c.Conn.Write(p)
	for q := p[:n]; len(q) > 0; {
		if c.body > 0 {
			k := min(uint32(len(q)), c.body)
			c.body -= k
			q = q[k:]
			continue
		}
		k := copy(c.hdr[c.hn:], q)
		c.hn += k
		q = q[k:]
		if c.hn == headerSize {
			c.hn = 0
			if c.hdr[1] == TypeData {
				c.body = binary.BigEndian.Uint32(c.hdr[8:12])
			}
		}
	}
	if err != nil || c.hn == 0 && c.body == 0 {
		c.holding = false
		c.mu.Unlock()
	}
	return n, err
}

// Inject writes frames (whole, from Frame) between the session's frames.
func (c *Conn) Inject(frames ...[]byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, f := range frames {
		if _, err := c.Conn.Write(f); err != nil {
			return err
		}
	}
	return nil
}
