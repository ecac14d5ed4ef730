package transport

import (
	"context"
	"fmt"
	"net"

	"github.com/mdlayher/vsock"
)

type vsockDialer func(ctx context.Context, cid, port uint32, cfg *vsock.Config) (*vsock.Conn, error)

func dialVsock(ctx context.Context, cid, port uint32) (net.Conn, error) {
	return dialVsockWith(ctx, vsock.DialContext, cid, port)
}

// dialVsockWith dials with dial (vsock.DialContext, which gives up when ctx
// ends; tests pass their own).
func dialVsockWith(ctx context.Context, dial vsockDialer, cid, port uint32) (net.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("dial vsock://%d:%d: %w", cid, port, err)
	}
	c, err := dial(ctx, cid, port, nil)
	if err != nil {
		// Never return c here: a nil *vsock.Conn is not a nil net.Conn.
		if ctx.Err() != nil {
			return nil, fmt.Errorf("dial vsock://%d:%d: %w", cid, port, ctx.Err())
		}
		return nil, fmt.Errorf("dial vsock://%d:%d: %w (is the vsock device present? on a VM host check vhost_vsock)", cid, port, err)
	}
	return c, nil
}
