package transport_test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/internal/yamux"
	"github.com/oac/sandbox-agent/protocol"
	"github.com/oac/sandbox-agent/protocol/transport"
)

// osPipeConns connects a guest and a host through two os.Pipe pairs, the
// way oac-shim wires a stdio guest: the guest's stdout is the host's input
// and the host's output is the guest's stdin.
func osPipeConns(t *testing.T) (guest, host net.Conn) {
	t.Helper()
	g2hR, g2hW, err := os.Pipe()
	require.NoError(t, err)
	h2gR, h2gW, err := os.Pipe()
	require.NoError(t, err)
	guest = transport.StreamConn(h2gR, g2hW, "guest-stdio")
	host = transport.StreamConn(g2hR, h2gW, "host-stdio")
	t.Cleanup(func() {
		guest.Close()
		host.Close()
	})
	return guest, host
}

func TestStreamConnOverOSPipesCarriesAYamuxSessionEndToEnd(t *testing.T) {
	gconn, hconn := osPipeConns(t)
	gs, err := yamux.Client(gconn, protocol.MuxConfig(nil))
	require.NoError(t, err)
	defer gs.Close()
	hs, err := yamux.Server(hconn, protocol.MuxConfig(nil))
	require.NoError(t, err)
	defer hs.Close()

	// Handshake over the pipes.
	type guestResult struct {
		ctl *protocol.Control
		err error
	}
	gres := make(chan guestResult, 1)
	go func() {
		ctl, _, err := protocol.GuestHandshake(gs, protocol.Hello{MinVersion: 1, MaxVersion: 1, AgentVersion: "test"}, 5*time.Second)
		gres <- guestResult{ctl, err}
	}()
	hctl, hello, welcome, err := protocol.HostHandshake(hs, 1, 1, protocol.Welcome{HostVersion: "test"}, 5*time.Second)
	require.NoError(t, err)
	defer hctl.Close()
	g := <-gres
	require.NoError(t, g.err)
	defer g.ctl.Close()
	assert.Equal(t, "test", hello.AgentVersion)
	assert.Equal(t, 1, welcome.Version)

	// A log stream carrying more than a yamux window (1 MiB) of output.
	payload := bytes.Repeat([]byte("daemon says hello\n"), 200_000)
	sent := sha256.Sum256(payload)
	type recvResult struct {
		header protocol.StreamHeader
		sum    [32]byte
		n      int
		err    error
	}
	recv := make(chan recvResult, 1)
	go func() {
		st, err := hs.AcceptStream()
		if err != nil {
			recv <- recvResult{err: err}
			return
		}
		defer st.Close()
		h, err := protocol.ReadStreamHeader(st, 5*time.Second)
		if err != nil {
			recv <- recvResult{err: err}
			return
		}
		data, err := io.ReadAll(st)
		recv <- recvResult{header: h, sum: sha256.Sum256(data), n: len(data), err: err}
	}()
	out, err := protocol.OpenStream(gs, protocol.StreamHeader{Kind: protocol.KindLog, Name: "daemon/stdout"})
	require.NoError(t, err)
	_, err = out.Write(payload)
	require.NoError(t, err)
	require.NoError(t, out.Close())

	select {
	case r := <-recv:
		require.NoError(t, r.err)
		assert.Equal(t, protocol.StreamHeader{Kind: protocol.KindLog, Name: "daemon/stdout"}, r.header)
		assert.Equal(t, len(payload), r.n)
		assert.Equal(t, sent, r.sum)
	case <-time.After(20 * time.Second):
		t.Fatal("log stream did not arrive")
	}

	// The control stream still works in both directions.
	require.NoError(t, g.ctl.Send(protocol.TypeState, protocol.State{State: protocol.StateReady}))
	var st protocol.State
	require.NoError(t, hctl.RecvMessage(protocol.TypeState, &st))
	assert.Equal(t, protocol.StateReady, st.State)
}

func TestClosingOneSideOfAStreamConnEndsTheOthersSession(t *testing.T) {
	gconn, hconn := osPipeConns(t)
	gs, err := yamux.Client(gconn, protocol.MuxConfig(nil))
	require.NoError(t, err)
	hs, err := yamux.Server(hconn, protocol.MuxConfig(nil))
	require.NoError(t, err)
	defer hs.Close()

	require.NoError(t, gs.Close())

	select {
	case <-hs.CloseChan():
	case <-time.After(5 * time.Second):
		t.Fatal("the host session did not notice the guest went away")
	}
}

func TestStreamConnPassesReadDeadlinesToPipes(t *testing.T) {
	gconn, _ := osPipeConns(t)
	require.NoError(t, gconn.SetReadDeadline(time.Now().Add(50*time.Millisecond)))

	_, err := gconn.Read(make([]byte, 1))

	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	assert.True(t, ne.Timeout())
}

func TestStreamConnPassesWriteDeadlinesToPipes(t *testing.T) {
	gconn, _ := osPipeConns(t)
	require.NoError(t, gconn.SetDeadline(time.Now().Add(50*time.Millisecond)))

	// Nobody reads the host side: the pipe buffer fills and the write times out.
	_, err := gconn.Write(make([]byte, 4<<20))

	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
}

// nopFile is a reader and writer that counts Close calls and has no
// deadlines.
type nopFile struct {
	io.Reader
	mu     sync.Mutex
	closes int
	err    error
}

func (f *nopFile) Write(p []byte) (int, error) { return len(p), nil }
func (f *nopFile) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closes++
	return f.err
}

func TestStreamConnIgnoresDeadlinesWhereTheFilesHaveNone(t *testing.T) {
	c := transport.StreamConn(&nopFile{Reader: strings.NewReader("x")}, &nopFile{}, "nop")

	assert.NoError(t, c.SetDeadline(time.Now()))
	assert.NoError(t, c.SetReadDeadline(time.Now()))
	assert.NoError(t, c.SetWriteDeadline(time.Now()))
}

func TestStreamConnClosesBothEndsExactlyOnce(t *testing.T) {
	r, w := &nopFile{}, &nopFile{}
	c := transport.StreamConn(r, w, "pipes")

	require.NoError(t, c.Close())
	require.NoError(t, c.Close())

	assert.Equal(t, 1, r.closes)
	assert.Equal(t, 1, w.closes)
}

func TestStreamConnClosesAFileUsedForBothDirectionsOnce(t *testing.T) {
	f := &nopFile{}
	c := transport.StreamConn(f, f, "device")

	require.NoError(t, c.Close())

	assert.Equal(t, 1, f.closes)
}

func TestStreamConnReportsCloseErrorsOfBothEnds(t *testing.T) {
	errR, errW := errors.New("read end"), errors.New("write end")
	c := transport.StreamConn(&nopFile{err: errR}, &nopFile{err: errW}, "pipes")

	err := c.Close()

	assert.ErrorIs(t, err, errR)
	assert.ErrorIs(t, err, errW)
	assert.Equal(t, err, c.Close(), "a second Close reports the first result")
}

func TestStreamConnIsNamedAfterItsTransport(t *testing.T) {
	c := transport.StreamConn(&nopFile{}, &nopFile{}, "stdio")

	assert.Equal(t, "stream", c.LocalAddr().Network())
	assert.Equal(t, "stdio", c.LocalAddr().String())
	assert.Equal(t, "stdio", c.RemoteAddr().String())
}
