package transport

import (
	"context"
	"fmt"
	"net"

	"github.com/mdlayher/vsock"
)

func dialVsock(ctx context.Context, cid, port uint32) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() { c, err := vsock.Dial(cid, port, nil); ch <- result{c, err} }()
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, fmt.Errorf("dial vsock://%d:%d: %w (is the vsock device present? on a VM host check vhost_vsock)", cid, port, r.err)
		}
		return r.c, nil
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.c != nil {
				r.c.Close()
			}
		}()
		return nil, fmt.Errorf("dial vsock://%d:%d: %w", cid, port, ctx.Err())
	}
}

func listenVsock(port uint32) (net.Listener, error) {
	l, err := vsock.Listen(port, nil)
	if err != nil {
		return nil, fmt.Errorf("listen vsock port %d: %w", port, err)
	}
	return l, nil
}
