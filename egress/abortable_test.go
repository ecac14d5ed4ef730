package egress

import (
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// shrinkConn counts Shrink calls.
type shrinkConn struct {
	net.Conn
	shrinks int
}

func (c *shrinkConn) Shrink() { c.shrinks++ }

// The copy loop tells an idle stream to free its buffer through the
// broker's abort wrapper.
func TestAbortableForwardsShrinkToTheStream(t *testing.T) {
	inner := &shrinkConn{}
	var c net.Conn = &abortable{Conn: inner}
	s, ok := c.(interface{ Shrink() })
	require.True(t, ok, "the copy loop finds Shrink on the wrapped stream")
	s.Shrink()
	assert.Equal(t, 1, inner.shrinks)
	(&abortable{Conn: &net.TCPConn{}}).Shrink() // a stream without Shrink: nothing to do
}
