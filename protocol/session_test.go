package protocol

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/internal/yamux"
)

func TestNegotiate(t *testing.T) {
	for _, tc := range []struct {
		gMin, gMax, hMin, hMax int
		want                   int
		err                    error
		msg                    string
	}{
		{gMin: 1, gMax: 1, hMin: 1, hMax: 1, want: 1},
		{gMin: 1, gMax: 3, hMin: 2, hMax: 5, want: 3},
		{gMin: 2, gMax: 9, hMin: 1, hMax: 4, want: 4},
		{gMin: 1, gMax: 5, hMin: 3, hMax: 3, want: 3},
		{gMin: 4, gMax: 4, hMin: 1, hMax: 9, want: 4},
		{gMin: 3, gMax: 5, hMin: 5, hMax: 8, want: 5},
		{gMin: 2, gMax: 3, hMin: 1, hMax: 1, err: ErrVersionMismatch, msg: "protocol version mismatch: guest speaks 2..3, host 1..1"},
		{gMin: 1, gMax: 1, hMin: 2, hMax: 3, err: ErrVersionMismatch, msg: "protocol version mismatch: guest speaks 1..1, host 2..3"},
		{gMin: 1, gMax: 2, hMin: 3, hMax: 2, err: ErrVersionMismatch, msg: "protocol version mismatch: guest speaks 1..2, host 3..2"},
		{gMin: 0, gMax: 1, hMin: 1, hMax: 1, err: ErrBadBody, msg: "malformed frame body: guest sent an invalid version range 0..1"},
		{gMin: -5, gMax: 1, hMin: 1, hMax: 1, err: ErrBadBody, msg: "malformed frame body: guest sent an invalid version range -5..1"},
		{gMin: 3, gMax: 2, hMin: 1, hMax: 5, err: ErrBadBody, msg: "malformed frame body: guest sent an invalid version range 3..2"},
		{gMin: 0, gMax: 0, hMin: 1, hMax: 1, err: ErrBadBody, msg: "malformed frame body: guest sent an invalid version range 0..0"},
	} {
		name := fmt.Sprintf("guest %d..%d host %d..%d", tc.gMin, tc.gMax, tc.hMin, tc.hMax)
		t.Run(name, func(t *testing.T) {
			v, err := Negotiate(tc.gMin, tc.gMax, tc.hMin, tc.hMax)
			if tc.err == nil {
				require.NoError(t, err)
				assert.Equal(t, tc.want, v)
				return
			}
			require.ErrorIs(t, err, tc.err)
			assert.EqualError(t, err, tc.msg)
			assert.Zero(t, v)
		})
	}
}

func TestMuxConfigIsAcceptedByYamux(t *testing.T) {
	cfg := MuxConfig(nil)

	require.NoError(t, yamux.VerifyConfig(cfg))
	assert.NotNil(t, cfg.LogOutput, "a nil writer must become io.Discard, not yamux's stderr logger")
	assert.Equal(t, MaxStreams, cfg.AcceptBacklog)
}

func TestHandshakePicksTheHighestCommonVersion(t *testing.T) {
	for _, tc := range []struct {
		gMin, gMax, hMin, hMax, want int
	}{
		{1, 1, 1, 1, 1},
		{1, 3, 2, 5, 3},
		{2, 9, 1, 4, 4},
		{MinVersion, MaxVersion, MinVersion, MaxVersion, MaxVersion},
	} {
		t.Run(fmt.Sprintf("guest %d..%d host %d..%d", tc.gMin, tc.gMax, tc.hMin, tc.hMax), func(t *testing.T) {
			gs, hs := sessionPair(t)
			guest := startGuest(t, gs, Hello{MinVersion: tc.gMin, MaxVersion: tc.gMax}, 5*time.Second)

			hctl, _, hw, err := HostHandshake(hs, tc.hMin, tc.hMax, Welcome{}, 5*time.Second)
			require.NoError(t, err)
			defer hctl.Close()
			g := waitGuest(t, guest)
			require.NoError(t, g.err)

			assert.Equal(t, tc.want, hw.Version)
			assert.Equal(t, tc.want, g.welcome.Version)
		})
	}
}

func TestHandshakeCarriesHelloAndWelcomeAndLeavesAWorkingControlStream(t *testing.T) {
	gs, hs := sessionPair(t)
	hello := Hello{MinVersion: 1, MaxVersion: 1, AgentVersion: "guest-1.2.3", PID: 1, Capabilities: []string{"log"}}
	guest := startGuest(t, gs, hello, 5*time.Second)

	hctl, gotHello, hw, err := HostHandshake(hs, 1, 1, Welcome{HostVersion: "shim-0.1", TimeUnixNano: 42, Version: 99}, 5*time.Second)
	require.NoError(t, err)
	defer hctl.Close()
	g := waitGuest(t, guest)
	require.NoError(t, g.err)

	assert.Equal(t, hello, gotHello)
	assert.Equal(t, 1, hw.Version, "HostHandshake fills in the negotiated version, overriding the caller's")
	assert.Equal(t, "shim-0.1", hw.HostVersion)
	assert.Greater(t, hw.TimeUnixNano, int64(42), "and stamps the clock when it sends Welcome")
	assert.Equal(t, hw, g.welcome, "the guest receives exactly what the host sent")

	// The control stream carries framed messages both ways afterwards.
	require.NoError(t, hctl.Send(TypeBootstrap, map[string]int{"version": 1}))
	f, err := g.ctl.Recv()
	require.NoError(t, err)
	assert.Equal(t, TypeBootstrap, f.Type)
	assert.JSONEq(t, `{"version":1}`, string(f.Body))

	require.NoError(t, g.ctl.Send(TypeState, State{State: StateReady}))
	var st State
	require.NoError(t, hctl.RecvMessage(TypeState, &st))
	assert.Equal(t, State{State: StateReady}, st)
}

func TestControlSendIsSafeForConcurrentUse(t *testing.T) {
	gs, hs := sessionPair(t)
	guest := startGuest(t, gs, Hello{MinVersion: 1, MaxVersion: 1}, 5*time.Second)
	hctl, _, _, err := HostHandshake(hs, 1, 1, Welcome{}, 5*time.Second)
	require.NoError(t, err)
	defer hctl.Close()
	g := waitGuest(t, guest)
	require.NoError(t, g.err)

	const senders, each = 8, 20
	errs := make(chan error, senders)
	for i := range senders {
		go func() {
			var err error
			for j := 0; j < each && err == nil; j++ {
				err = g.ctl.Send(TypeState, State{State: StateStarting, Message: strings.Repeat(fmt.Sprint(i), 3000)})
			}
			errs <- err
		}()
	}
	for range senders * each {
		var st State
		require.NoError(t, hctl.RecvMessage(TypeState, &st), "frames from concurrent senders must never interleave")
		assert.Len(t, st.Message, 3000)
	}
	for range senders {
		require.NoError(t, <-errs)
	}
}

func TestVersionMismatchFailsOnBothSides(t *testing.T) {
	for _, tc := range []struct {
		gMin, gMax, hMin, hMax int
		msg                    string
	}{
		{2, 3, 1, 1, "protocol version mismatch: guest speaks 2..3, host 1..1"},
		{1, 1, 2, 3, "protocol version mismatch: guest speaks 1..1, host 2..3"},
	} {
		t.Run(tc.msg, func(t *testing.T) {
			gs, hs := sessionPair(t)
			guest := startGuest(t, gs, Hello{MinVersion: tc.gMin, MaxVersion: tc.gMax}, 5*time.Second)

			hctl, _, _, herr := HostHandshake(hs, tc.hMin, tc.hMax, Welcome{}, 5*time.Second)
			g := waitGuest(t, guest)

			assert.Nil(t, hctl)
			require.ErrorIs(t, herr, ErrVersionMismatch)
			assert.EqualError(t, herr, tc.msg)
			assert.Nil(t, g.ctl)
			require.ErrorIs(t, g.err, ErrVersionMismatch)
			assert.EqualError(t, g.err, tc.msg)
		})
	}
}

func TestHostRefusesAnInvalidGuestVersionRangeAsAProtocolError(t *testing.T) {
	gs, hs := sessionPair(t)
	guest := startGuest(t, gs, Hello{MinVersion: 0, MaxVersion: 1}, 5*time.Second)

	_, _, _, herr := HostHandshake(hs, 1, 1, Welcome{}, 5*time.Second)
	g := waitGuest(t, guest)

	require.ErrorIs(t, herr, ErrBadBody)
	assert.NotErrorIs(t, herr, ErrVersionMismatch)
	var pe *PeerError
	require.ErrorAs(t, g.err, &pe)
	assert.Equal(t, CodeProtocol, pe.Err.Code)
	assert.Contains(t, g.err.Error(), "wait for Welcome")
}

// fakeHost accepts the control stream and Hello the way a host would, then
// lets the test answer however it likes.
func fakeHost(t *testing.T, hs *yamux.Session) *Control {
	t.Helper()
	st, err := hs.AcceptStream()
	require.NoError(t, err)
	h, err := ReadStreamHeader(st, 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, KindControl, h.Kind)
	c := NewControl(st)
	t.Cleanup(func() { c.Close() })
	var hello Hello
	require.NoError(t, c.RecvMessage(TypeHello, &hello))
	return c
}

func TestGuestRefusesAWelcomeOutsideItsVersionRange(t *testing.T) {
	gs, hs := sessionPair(t)
	guest := startGuest(t, gs, Hello{MinVersion: 1, MaxVersion: 2}, 5*time.Second)

	c := fakeHost(t, hs)
	require.NoError(t, c.Send(TypeWelcome, Welcome{Version: 3}))
	g := waitGuest(t, guest)

	require.ErrorIs(t, g.err, ErrVersionMismatch)
	assert.EqualError(t, g.err, "protocol version mismatch: host chose version 3, guest speaks 1..2")
	assert.Nil(t, g.ctl)
}

func TestGuestHandshakeFailsWhenWelcomeNeverComes(t *testing.T) {
	gs, hs := sessionPair(t)
	guest := startGuest(t, gs, Hello{MinVersion: 1, MaxVersion: 1}, 200*time.Millisecond)

	fakeHost(t, hs) // reads Hello, never answers
	g := waitGuest(t, guest)

	require.Error(t, g.err)
	assert.Contains(t, g.err.Error(), "wait for Welcome")
	var ne net.Error
	require.ErrorAs(t, g.err, &ne)
	assert.True(t, ne.Timeout())
}

func TestGuestHandshakeReportsAnUnexpectedFrameInsteadOfWelcome(t *testing.T) {
	gs, hs := sessionPair(t)
	guest := startGuest(t, gs, Hello{MinVersion: 1, MaxVersion: 1}, 5*time.Second)

	c := fakeHost(t, hs)
	require.NoError(t, c.Send(TypeBootstrap, map[string]int{"version": 1}))
	g := waitGuest(t, guest)

	require.ErrorIs(t, g.err, ErrUnexpectedType)
}

func TestHostHandshakeFailsWhenHelloNeverComes(t *testing.T) {
	gs, hs := sessionPair(t)
	// The guest opens the control stream and then says nothing.
	st, err := OpenStream(gs, StreamHeader{Kind: KindControl})
	require.NoError(t, err)
	defer st.Close()

	start := time.Now()
	ctl, _, _, err := HostHandshake(hs, 1, 1, Welcome{}, 200*time.Millisecond)

	assert.Nil(t, ctl)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "wait for Hello")
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	assert.True(t, ne.Timeout())
	assert.Less(t, time.Since(start), 3*time.Second)
}

func TestHostHandshakeCutsOffAGuestStallingMidHello(t *testing.T) {
	// The guest sends the header of its Hello frame and then stalls. The
	// handshake timeout, not the 10 s FrameBodyTimeout, bounds the wait.
	gs, hs := sessionPair(t)
	st, err := OpenStream(gs, StreamHeader{Kind: KindControl})
	require.NoError(t, err)
	defer st.Close()
	_, err = st.Write(append(frameHeader(TypeHello, 0, 40), `{"min_vers`...))
	require.NoError(t, err)

	start := time.Now()
	_, _, _, err = HostHandshake(hs, 1, 1, Welcome{}, 300*time.Millisecond)

	require.ErrorIs(t, err, ErrTruncated)
	assert.Less(t, time.Since(start), 3*time.Second)
}

func TestHostHandshakeFailsAndClosesTheSessionWhenNoControlStreamIsOpened(t *testing.T) {
	_, hs := sessionPair(t)

	start := time.Now()
	ctl, _, _, err := HostHandshake(hs, 1, 1, Welcome{}, 200*time.Millisecond)

	assert.Nil(t, ctl)
	assert.EqualError(t, err, "guest sent no control stream within 200ms")
	assert.Less(t, time.Since(start), 3*time.Second)
	assert.True(t, hs.IsClosed())
}

func TestHostHandshakeFailsWhenTheSessionDies(t *testing.T) {
	gs, hs := sessionPair(t)
	require.NoError(t, gs.Close())

	_, _, _, err := HostHandshake(hs, 1, 1, Welcome{}, 5*time.Second)

	require.Error(t, err)
	assert.Contains(t, err.Error(), "accept control stream")
}

func TestHostRefusesAFirstStreamOfTheWrongKind(t *testing.T) {
	for _, kind := range []string{KindLog, KindEgress, KindForward} {
		t.Run(kind, func(t *testing.T) {
			gs, hs := sessionPair(t)
			h := StreamHeader{Kind: kind, Name: "daemon/stdout"}
			if kind == KindEgress {
				h = StreamHeader{Kind: kind, Host: "example.com", Port: 443, Via: ViaConnect}
			}
			if kind == KindForward {
				h = StreamHeader{Kind: kind, Name: "daemon/stdout", Port: 4096}
			}
			st, err := OpenStream(gs, h)
			require.NoError(t, err)
			defer st.Close()

			ctl, _, _, err := HostHandshake(hs, 1, 1, Welcome{}, 5*time.Second)

			assert.Nil(t, ctl)
			require.ErrorIs(t, err, ErrUnexpectedType)
			assert.EqualError(t, err, fmt.Sprintf("unexpected frame type: first stream is %q, want control", kind))
		})
	}
}

func TestHostRefusesGarbageInsteadOfAStreamHeader(t *testing.T) {
	gs, hs := sessionPair(t)
	st, err := gs.OpenStream()
	require.NoError(t, err)
	defer st.Close()
	_, err = st.Write([]byte("SSH-2.0-OpenSSH_9.6\r\n"))
	require.NoError(t, err)

	_, _, _, err = HostHandshake(hs, 1, 1, Welcome{}, 5*time.Second)

	require.ErrorIs(t, err, ErrUnknownType)
	assert.True(t, strings.HasPrefix(err.Error(), "stream header: "), err.Error())
}

func TestHostRefusesGarbageInsteadOfHello(t *testing.T) {
	gs, hs := sessionPair(t)
	st, err := OpenStream(gs, StreamHeader{Kind: KindControl})
	require.NoError(t, err)
	defer st.Close()
	_, err = st.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
	require.NoError(t, err)

	_, _, _, err = HostHandshake(hs, 1, 1, Welcome{}, 5*time.Second)

	require.ErrorIs(t, err, ErrUnknownType)
	assert.Contains(t, err.Error(), "wait for Hello")
}

func TestHostRefusesAnOversizedStreamHeaderBeforeReadingItsBody(t *testing.T) {
	gs, hs := sessionPair(t)
	st, err := gs.OpenStream()
	require.NoError(t, err)
	defer st.Close()
	// Only the header is sent: if the host tried to read the announced
	// body it would wait for the handshake timeout instead.
	_, err = st.Write(frameHeader(TypeStreamHeader, 0, MaxHeaderFrame+1))
	require.NoError(t, err)

	start := time.Now()
	_, _, _, err = HostHandshake(hs, 1, 1, Welcome{}, 5*time.Second)

	require.ErrorIs(t, err, ErrFrameTooLarge)
	assert.Less(t, time.Since(start), 2*time.Second)
}

func TestHostRefusesAHelloLargerThanTheControlLimit(t *testing.T) {
	gs, hs := sessionPair(t)
	st, err := OpenStream(gs, StreamHeader{Kind: KindControl})
	require.NoError(t, err)
	defer st.Close()
	_, err = st.Write(frameHeader(TypeHello, 0, MaxControlFrame+1))
	require.NoError(t, err)

	_, _, _, err = HostHandshake(hs, 1, 1, Welcome{}, 5*time.Second)

	require.ErrorIs(t, err, ErrFrameTooLarge)
}

func TestHostRefusesAControlStreamHeaderWithAnInvalidName(t *testing.T) {
	gs, hs := sessionPair(t)
	st, err := OpenStream(gs, StreamHeader{Kind: KindControl, Name: "evil\nname"})
	require.NoError(t, err)
	defer st.Close()

	_, _, _, err = HostHandshake(hs, 1, 1, Welcome{}, 5*time.Second)

	require.ErrorIs(t, err, ErrBadBody)
	assert.Contains(t, err.Error(), "control characters")
}

func TestReadStreamHeaderReadsWhatOpenStreamWrote(t *testing.T) {
	gs, hs := sessionPair(t)
	accepted := make(chan net.Conn, 1)
	go func() {
		st, err := hs.AcceptStream()
		if err == nil {
			accepted <- st
		}
		close(accepted)
	}()

	out, err := OpenStream(gs, StreamHeader{Kind: KindLog, Name: "daemon/stderr"})
	require.NoError(t, err)
	defer out.Close()
	_, err = out.Write([]byte("hello from the daemon\n"))
	require.NoError(t, err)

	in := <-accepted
	require.NotNil(t, in)
	defer in.Close()
	h, err := ReadStreamHeader(in, 5*time.Second)
	require.NoError(t, err)
	assert.Equal(t, StreamHeader{Kind: KindLog, Name: "daemon/stderr"}, h)

	// The raw payload follows the header untouched.
	buf := make([]byte, len("hello from the daemon\n"))
	_, err = in.Read(buf)
	require.NoError(t, err)
	assert.Equal(t, "hello from the daemon\n", string(buf))
}

func TestReadStreamHeaderTimesOutOnASilentStream(t *testing.T) {
	gs, hs := sessionPair(t)
	st, err := gs.OpenStream()
	require.NoError(t, err)
	defer st.Close()
	in, err := hs.AcceptStream()
	require.NoError(t, err)
	defer in.Close()

	start := time.Now()
	_, err = ReadStreamHeader(in, 100*time.Millisecond)

	var ne net.Error
	require.ErrorAs(t, err, &ne)
	assert.True(t, ne.Timeout())
	assert.Less(t, time.Since(start), 3*time.Second)
}

func TestReadStreamHeaderClearsItsDeadline(t *testing.T) {
	c := newFakeConn(strings.NewReader(string(AppendFrame(nil, TypeStreamHeader, []byte(`{"kind":"log"}`)))))

	_, err := ReadStreamHeader(c, time.Second)

	require.NoError(t, err)
	d := c.recorded()
	require.NotEmpty(t, d)
	assert.True(t, d[len(d)-1].IsZero(), "deadline left behind: %v", d)
	for _, dl := range d[:len(d)-1] {
		assert.False(t, dl.After(d[0]), "a body deadline must not extend the header timeout")
	}
}

func TestReadStreamHeaderRefusesAnotherFrameType(t *testing.T) {
	c := newFakeConn(strings.NewReader(string(AppendFrame(nil, TypeHello, []byte(`{}`)))))

	_, err := ReadStreamHeader(c, time.Second)

	require.ErrorIs(t, err, ErrUnexpectedType)
}

func TestReadStreamHeaderReportsAPeerError(t *testing.T) {
	c := newFakeConn(strings.NewReader(string(AppendFrame(nil, TypeError, []byte(`{"code":"internal","message":"x"}`)))))

	_, err := ReadStreamHeader(c, time.Second)

	var pe *PeerError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, CodeInternal, pe.Err.Code)
}

func TestOpenStreamFailsOnAClosedSession(t *testing.T) {
	gs, _ := sessionPair(t)
	require.NoError(t, gs.Close())

	_, err := OpenStream(gs, StreamHeader{Kind: KindLog})

	require.Error(t, err)
	assert.True(t, errors.Is(err, yamux.ErrSessionShutdown), err.Error())
	assert.Contains(t, err.Error(), "open log stream")
}
