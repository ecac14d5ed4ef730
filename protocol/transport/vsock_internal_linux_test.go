package transport

import (
	"context"
	"errors"
	"testing"

	"github.com/mdlayher/vsock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// A vsock dial that fails only after the caller gave up used to crash the
// process: the abandoned result held a nil *vsock.Conn that the cleanup
// goroutine saw as a non-nil net.Conn and closed.
func TestVsockDialThatFailsAfterTheContextEndedDoesNotPanic(t *testing.T) {
	dialing, release := make(chan struct{}), make(chan struct{})
	old := vsockDial
	t.Cleanup(func() { vsockDial = old })
	vsockDial = func(cid, port uint32, _ *vsock.Config) (*vsock.Conn, error) {
		close(dialing)
		<-release
		return nil, errors.New("connect: connection timed out")
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-dialing; cancel() }()

	c, err := dialVsock(ctx, 2, 1024)

	assert.Nil(t, c)
	require.ErrorIs(t, err, context.Canceled)
	close(release)
	// The abandoned dial fails now; its cleanup must finish without a panic.
	goleak.VerifyNone(t)
}

func TestVsockDialReportsAFailedDialWithAHint(t *testing.T) {
	old := vsockDial
	t.Cleanup(func() { vsockDial = old })
	vsockDial = func(cid, port uint32, _ *vsock.Config) (*vsock.Conn, error) {
		return nil, errors.New("socket: address family not supported by protocol")
	}

	c, err := dialVsock(context.Background(), 2, 1024)

	assert.Nil(t, c, "a failed dial must return a nil net.Conn, not a nil *vsock.Conn")
	require.Error(t, err)
	assert.EqualError(t, err, "dial vsock://2:1024: socket: address family not supported by protocol (is the vsock device present? on a VM host check vhost_vsock)")
}
