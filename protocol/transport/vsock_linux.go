package transport

import (
	"context"
	"fmt"
	"net"

	"github.com/mdlayher/vsock"
)

// vsockDial is vsock.Dial; tests replace it.
var vsockDial = vsock.Dial

func dialVsock(ctx context.Context, cid, port uint32) (net.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("dial vsock://%d:%d: %w", cid, port, err)
	}
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		c, err := vsockDial(cid, port, nil)
		if err != nil {
			// Not result{c, err}: a nil *vsock.Conn in r.c is not a nil
			// net.Conn, and closing it below would panic.
			ch <- result{err: err}
			return
		}
		ch <- result{c: c}
	}()
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
		return nil, fmt.Errorf("listen vsock port %d: %w (is the vsock device present? check /dev/vsock and that nothing else listens on the port)", port, err)
	}
	return l, nil
}
