package muxguard

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// FuzzGuard feeds the guard any guest bytes, and any host bytes in any
// split: it never panics, passes a prefix of the guest's bytes made of
// whole checked headers (and their bodies), and keeps its counts in range.
func FuzzGuard(f *testing.F) {
	f.Add(bytes.Join([][]byte{frame(typeWindowUpdate, flagSYN, 1, 0), frame(typeData, 0, 1, 3), []byte("abc")}, nil), []byte{}, 5)
	f.Add(frame(typeWindowUpdate, 0, 1, 0xffffffff), frame(typeWindowUpdate, flagSYN, 2, 0), 1)
	f.Add(bytes.Repeat(frame(typePing, flagSYN, 0, 1), 8), []byte{}, 3)
	f.Add([]byte("not yamux at all"), bytes.Join([][]byte{frame(typeData, flagSYN, 2, 4), []byte("body")}, nil), 7)
	f.Fuzz(func(t *testing.T, guest, host []byte, chunk int) {
		if chunk <= 0 || chunk > 64 {
			chunk = 12
		}
		c := &bytesConn{r: bytes.NewReader(guest)}
		l := testLimits()
		g := newConn(c, l, func() time.Time { return time.Unix(1000, 0) })
		for p := host; len(p) > 0; {
			n := min(chunk, len(p))
			_, err := g.Write(p[:n])
			require.NoError(t, err)
			p = p[n:]
		}
		var out []byte
		buf := make([]byte, chunk)
		for {
			n, err := g.Read(buf)
			out = append(out, buf[:n]...)
			if err != nil {
				break
			}
		}
		require.True(t, bytes.HasPrefix(guest, out), "only the guest's own bytes pass, in order")
		if g.Err() == nil {
			require.GreaterOrEqual(t, len(out), len(guest)-headerSize+1, "without a violation everything but a partial header passes")
		}
		st := g.Stats()
		require.LessOrEqual(t, st.GuestStreams, l.MaxStreams)
		require.GreaterOrEqual(t, st.GuestStreams, 0)
		require.GreaterOrEqual(t, st.Unread, int64(0))
	})
}
