package provider

import (
	"context"
	"fmt"
	"net"
	"time"
)

// DeadlineListener is a listener whose Accept can be interrupted with a
// deadline (*net.UnixListener and AF_VSOCK listeners are).
type DeadlineListener interface {
	net.Listener
	SetDeadline(time.Time) error
}

// Accept returns the next connection on ln, giving up when ctx ends or
// runtimeDone is closed (then it returns runtimeErr()). An interrupted
// Accept leaves ln usable.
func Accept(ctx context.Context, ln DeadlineListener, runtimeDone <-chan struct{}, runtimeErr func() error) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() { c, err := ln.Accept(); ch <- result{c, err} }()
	interrupt := func() {
		_ = ln.SetDeadline(time.Now())
		if r := <-ch; r.c != nil {
			r.c.Close()
		}
		_ = ln.SetDeadline(time.Time{})
	}
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, fmt.Errorf("accept guest connection: %w", r.err)
		}
		return r.c, nil
	case <-ctx.Done():
		interrupt()
		return nil, fmt.Errorf("accept guest connection: %w", ctx.Err())
	case <-runtimeDone:
		interrupt()
		return nil, runtimeErr()
	}
}
