package transport

import (
	"context"
	"errors"
	"testing"

	"github.com/mdlayher/vsock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A dial that fails because the caller gave up reports the cancellation,
// and a failed dial never hands back a typed-nil *vsock.Conn as a non-nil
// net.Conn (closing that used to crash the process).
func TestVsockDialThatFailsAfterTheContextEndedReportsTheCancellation(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	dial := func(ctx context.Context, cid, port uint32, _ *vsock.Config) (*vsock.Conn, error) {
		cancel()
		<-ctx.Done()
		return nil, errors.New("connect: operation canceled")
	}
	c, err := dialVsockWith(ctx, dial, 2, 1024)
	assert.Nil(t, c)
	require.ErrorIs(t, err, context.Canceled)
}

func TestVsockDialReportsAFailedDialWithAHint(t *testing.T) {
	dial := func(ctx context.Context, cid, port uint32, _ *vsock.Config) (*vsock.Conn, error) {
		return nil, errors.New("socket: address family not supported by protocol")
	}
	c, err := dialVsockWith(context.Background(), dial, 2, 1024)
	assert.Nil(t, c, "a failed dial must return a nil net.Conn, not a nil *vsock.Conn")
	assert.EqualError(t, err, "dial vsock://2:1024: socket: address family not supported by protocol (is the vsock device present? on a VM host check vhost_vsock)")
}

func TestVsockDialWithAnEndedContextDoesNotDial(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	dial := func(context.Context, uint32, uint32, *vsock.Config) (*vsock.Conn, error) {
		t.Fatal("dialed although the context had ended")
		return nil, nil
	}
	_, err := dialVsockWith(ctx, dial, 2, 1024)
	require.ErrorIs(t, err, context.Canceled)
}
