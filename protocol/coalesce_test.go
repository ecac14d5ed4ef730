package protocol

import (
	"bytes"
	"errors"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/internal/muxinject"
)

// writesConn records each Write it gets.
type writesConn struct {
	net.Conn // nil: only Write is called
	writes   [][]byte
	err      error
}

func (c *writesConn) Write(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	c.writes = append(c.writes, bytes.Clone(p))
	return len(p), nil
}

func yamuxHeader(typ uint8, flags uint16, id, length uint32) []byte {
	return muxinject.Frame(typ, flags, id, length, nil)
}

func TestCoalesceJoinsADataFramesHeaderWithItsBody(t *testing.T) {
	rec := &writesConn{}
	c := Coalesce(rec)
	hdr, body := yamuxHeader(0, 0, 1, 64), bytes.Repeat([]byte{7}, 64)
	n, err := c.Write(hdr)
	require.NoError(t, err)
	assert.Equal(t, len(hdr), n, "the held header counts as written")
	assert.Empty(t, rec.writes, "a data frame's header waits for its body")
	n, err = c.Write(body)
	require.NoError(t, err)
	assert.Equal(t, len(body), n, "the body's Write reports the body only")
	require.Len(t, rec.writes, 1, "header and body go out in one write")
	assert.Equal(t, append(hdr, body...), rec.writes[0])
}

func TestCoalescePassesFramesWithoutBodyAtOnce(t *testing.T) {
	for name, hdr := range map[string][]byte{
		"window update":   yamuxHeader(1, 0, 1, 1<<20),
		"ping":            yamuxHeader(2, 1, 0, 9),
		"data, no body":   yamuxHeader(0, 4, 1, 0), // a FIN
		"go away":         yamuxHeader(3, 0, 0, 0),
		"not a header":    []byte("twelve bytes"[:11]),
		"longer than one": append(yamuxHeader(0, 0, 1, 5), 1, 2, 3, 4, 5),
	} {
		t.Run(name, func(t *testing.T) {
			rec := &writesConn{}
			n, err := Coalesce(rec).Write(hdr)
			require.NoError(t, err)
			assert.Equal(t, len(hdr), n)
			assert.Equal(t, [][]byte{hdr}, rec.writes)
		})
	}
}

func TestCoalesceSendsALargeBodyBehindItsHeaderInOrder(t *testing.T) {
	rec := &writesConn{}
	c := Coalesce(rec)
	body := bytes.Repeat([]byte{3}, coalesceCopyMax+1)
	hdr := yamuxHeader(0, 0, 1, uint32(len(body)))
	_, err := c.Write(hdr)
	require.NoError(t, err)
	n, err := c.Write(body)
	require.NoError(t, err)
	assert.Equal(t, len(body), n)
	// No copy: a socket takes both in one writev; this recorder in order.
	assert.Equal(t, append(hdr, body...), bytes.Join(rec.writes, nil))
}

func TestCoalesceReturnsTheTransportsError(t *testing.T) {
	broken := errors.New("broken pipe")
	rec := &writesConn{}
	c := Coalesce(rec)
	_, err := c.Write(yamuxHeader(0, 0, 1, 3))
	require.NoError(t, err)
	rec.err = broken
	n, err := c.Write([]byte{1, 2, 3})
	assert.ErrorIs(t, err, broken)
	assert.Zero(t, n)
	// The header went with the failed write: nothing is held any more.
	rec.err = nil
	_, err = c.Write(yamuxHeader(1, 0, 1, 5))
	require.NoError(t, err)
	assert.Equal(t, [][]byte{yamuxHeader(1, 0, 1, 5)}, rec.writes)
}
