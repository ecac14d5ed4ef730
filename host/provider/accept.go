package provider

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"
)

// DeadlineListener is a listener whose Accept can be interrupted with a
// deadline (*net.UnixListener and AF_VSOCK listeners are).
type DeadlineListener interface {
	net.Listener
	SetDeadline(time.Time) error
}

// Listen sets the listener Accept takes the guest's connection from.
// Until it is set, Accept fails with ErrNotStarted.
func (p *Process) Listen(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
}

// ListenData sets the listener like Listen and says which data plane
// carriers its connections allow (protocol.CapDataFD: the guest shares
// this kernel and dials a unix socket; protocol.CapDataDial: the guest can
// dial the listener again, once per connection). Accept then takes the
// data plane's connections too.
func (p *Process) ListenData(ln net.Listener, carriers ...string) {
	p.mu.Lock()
	p.ln, p.carriers = ln, carriers
	p.mu.Unlock()
}

// DataCarriers implements DataPlane.
func (p *Process) DataCarriers() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.carriers
}

// Accept returns the guest's connection, giving up when ctx ends or the
// runtime exits (then with Err). An interrupted Accept leaves a listener
// with deadlines usable and closes any other (a sandbox accepts one
// connection).
func (p *Process) Accept(ctx context.Context) (net.Conn, error) {
	p.mu.Lock()
	ln, done := p.ln, p.done
	p.mu.Unlock()
	if ln == nil {
		return nil, ErrNotStarted
	}
	return accept(ctx, ln, done, p.Err)
}

// accept returns the next connection on ln, giving up when ctx ends or
// runtimeDone is closed (then it returns runtimeErr()). An interrupted
// Accept leaves a DeadlineListener usable; any other listener is closed.
func accept(ctx context.Context, ln net.Listener, runtimeDone <-chan struct{}, runtimeErr func() error) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() { c, err := ln.Accept(); ch <- result{c, err} }()
	interrupt := func() {
		dl, ok := ln.(DeadlineListener)
		if !ok {
			ln.Close()
			return
		}
		_ = dl.SetDeadline(time.Now())
		if r := <-ch; r.c != nil {
			r.c.Close()
		}
		_ = dl.SetDeadline(time.Time{})
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

// ConnListener is a listener that hands out c once (a runtime whose
// transport is its own stdio); a second Accept waits until the listener
// is closed or its deadline passes.
func ConnListener(c net.Conn) DeadlineListener {
	l := &connListener{c: c, wake: make(chan struct{})}
	return l
}

type connListener struct {
	mu       sync.Mutex
	c        net.Conn
	closed   bool
	deadline time.Time
	wake     chan struct{} // closed and replaced when closed or the deadline changes
}

func (l *connListener) Accept() (net.Conn, error) {
	for {
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			return nil, net.ErrClosed
		}
		if c := l.c; c != nil {
			l.c = nil
			l.mu.Unlock()
			return c, nil
		}
		var timeout <-chan time.Time
		if !l.deadline.IsZero() {
			d := time.Until(l.deadline)
			if d <= 0 {
				l.mu.Unlock()
				return nil, errDeadline
			}
			t := time.NewTimer(d)
			defer t.Stop()
			timeout = t.C
		}
		wake := l.wake
		l.mu.Unlock()
		select {
		case <-wake:
		case <-timeout:
		}
	}
}

var errDeadline = fmt.Errorf("accept: %w", timeoutError{})

type timeoutError struct{}

func (timeoutError) Error() string { return "i/o timeout" }
func (timeoutError) Timeout() bool { return true }

func (l *connListener) SetDeadline(t time.Time) error {
	l.mu.Lock()
	l.deadline = t
	close(l.wake)
	l.wake = make(chan struct{})
	l.mu.Unlock()
	return nil
}

func (l *connListener) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		l.closed = true
		close(l.wake)
		l.wake = make(chan struct{})
	}
	return nil
}

func (l *connListener) Addr() net.Addr {
	return connAddr{}
}

type connAddr struct{}

func (connAddr) Network() string { return "stdio" }
func (connAddr) String() string  { return "stdio" }
