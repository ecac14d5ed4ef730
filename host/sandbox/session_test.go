package sandbox

import (
	"io"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/internal/yamux"
	"github.com/oac/sandbox-agent/protocol"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

// connectGuestWith is connectGuest with capabilities in Hello.
func connectGuestWithCaps(t *testing.T, p *fakeProvider, caps ...string) *fakeGuest {
	t.Helper()
	conn := <-p.guest
	sess, err := yamux.Client(conn, protocol.MuxConfig(nil))
	require.NoError(t, err)
	t.Cleanup(func() { sess.Close() })
	ctl, _, err := protocol.GuestHandshake(sess, protocol.Hello{MinVersion: 1, MaxVersion: 1, AgentVersion: "fake", PID: 1, Capabilities: caps}, 5*time.Second)
	require.NoError(t, err)
	g := &fakeGuest{p: p, sess: sess, ctl: ctl}
	require.NoError(t, ctl.RecvMessage(protocol.TypeBootstrap, &g.boot))
	return g
}

func TestAttachHandsOverTheSessionForForwardsAndTimeAndDetaches(t *testing.T) {
	p, rec := newFakeProvider(), newRecorder()
	var mu sync.Mutex
	var attached []*Session
	cancel, done := runSandbox(t, Config{Provider: p, Events: rec, Bootstrap: &bootstrap.Bootstrap{Version: 1},
		Attach: func(s *Session) { mu.Lock(); attached = append(attached, s); mu.Unlock() },
		MapURL: func(u string) string {
			if u == "http://127.0.0.1:4096" {
				return "http://127.0.0.1:34567"
			}
			return ""
		},
	})
	g := connectGuestWithCaps(t, p, protocol.CapForward, protocol.CapTime)
	g.send(t, protocol.State{State: protocol.StateReady, URL: "http://127.0.0.1:4096", Username: "runtime"})
	ready := rec.waitState(t, api.StateReady)
	assert.Equal(t, "http://127.0.0.1:34567", ready.URL, "the host's address of the daemon")
	assert.Equal(t, "http://127.0.0.1:4096", ready.GuestURL)

	mu.Lock()
	require.Len(t, attached, 1)
	s := attached[0]
	mu.Unlock()
	require.NotNil(t, s)
	assert.True(t, s.Can(protocol.CapForward))

	// A forward stream arrives at the guest with the port in its header.
	accepted := make(chan protocol.StreamHeader, 1)
	go func() {
		st, err := g.sess.AcceptStream()
		if err != nil {
			return
		}
		h, _ := protocol.ReadStreamHeader(st, 5*time.Second)
		accepted <- h
		_, _ = io.Copy(st, st)
		st.Close()
	}()
	c, err := s.OpenForward(4096, "daemon")
	require.NoError(t, err)
	_, err = c.Write([]byte("ping"))
	require.NoError(t, err)
	buf := make([]byte, 4)
	_, err = io.ReadFull(c, buf)
	require.NoError(t, err)
	assert.Equal(t, "ping", string(buf))
	c.Close()
	assert.Equal(t, protocol.StreamHeader{Kind: protocol.KindForward, Name: "daemon", Port: 4096}, <-accepted)

	at, err := s.PushTime()
	require.NoError(t, err)
	var tm protocol.Time
	require.NoError(t, g.ctl.RecvMessage(protocol.TypeTime, &tm))
	assert.Equal(t, at.UnixNano(), tm.TimeUnixNano)

	cancel(nil)
	var sd protocol.Shutdown
	require.NoError(t, g.ctl.RecvMessage(protocol.TypeShutdown, &sd))
	// The host may close the session before this lands (a known race in
	// the fake guest, also seen in TestReadyThenOrderlyStopOnCancel).
	_ = g.ctl.Send(protocol.TypeState, protocol.State{State: protocol.StateStopped})
	g.exit()
	require.NoError(t, wait(t, done))
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, attached, 2)
	assert.Nil(t, attached[1], "detached when the session ended")
	_, err = s.OpenForward(4096, "late")
	assert.Error(t, err, "a forward after the end fails")
}

func TestGuestWithoutCapabilitiesGetsNoForwardsNorTime(t *testing.T) {
	p, rec := newFakeProvider(), newRecorder()
	got := make(chan *Session, 2)
	cancel, done := runSandbox(t, Config{Provider: p, Events: rec, Attach: func(s *Session) { got <- s }})
	g := connectGuestWithCaps(t, p)
	s := <-got
	_, err := s.OpenForward(4096, "")
	require.ErrorIs(t, err, ErrNotSupported)
	_, err = s.PushTime()
	require.ErrorIs(t, err, ErrNotSupported)
	g.send(t, protocol.State{State: protocol.StateReady, URL: "http://127.0.0.1:4096"})
	ready := rec.waitState(t, api.StateReady)
	assert.Equal(t, "http://127.0.0.1:4096", ready.URL, "no MapURL: the guest's URL")
	assert.Empty(t, ready.GuestURL)
	cancel(nil)
	var sd protocol.Shutdown
	require.NoError(t, g.ctl.RecvMessage(protocol.TypeShutdown, &sd))
	// The host may close the session before this lands (a known race in
	// the fake guest, also seen in TestReadyThenOrderlyStopOnCancel).
	_ = g.ctl.Send(protocol.TypeState, protocol.State{State: protocol.StateStopped})
	g.exit()
	require.NoError(t, wait(t, done))
}
