package protocol

import (
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/internal/yamux"
)

func TestHostHandshakeStampsTheClockWhenWelcomeIsSent(t *testing.T) {
	a, b := net.Pipe()
	host, err := yamux.Server(a, MuxConfig(nil))
	require.NoError(t, err)
	defer host.Close()
	guest, err := yamux.Client(b, MuxConfig(nil))
	require.NoError(t, err)
	defer guest.Close()

	stale := time.Now().Add(-time.Hour).UnixNano()
	type res struct {
		w   Welcome
		err error
	}
	hc := make(chan res, 1)
	go func() {
		_, _, w, err := HostHandshake(host, MinVersion, MaxVersion, Welcome{HostVersion: "h", TimeUnixNano: stale}, 5*time.Second)
		hc <- res{w, err}
	}()
	// The guest takes a while to say Hello, as a booting VM does.
	time.Sleep(200 * time.Millisecond)
	before := time.Now()
	_, w, err := GuestHandshake(guest, Hello{MinVersion: 1, MaxVersion: 1, AgentVersion: "g", PID: 1}, 5*time.Second)
	require.NoError(t, err)
	r := <-hc
	require.NoError(t, r.err)
	assert.Equal(t, r.w, w)
	assert.Equal(t, 1, w.Version)
	assert.GreaterOrEqual(t, w.TimeUnixNano, before.UnixNano(), "stamped at send time, not when the caller built it")
	assert.LessOrEqual(t, w.TimeUnixNano, time.Now().UnixNano())
}
