//go:build kubernetes

package kubernetes

import (
	"net"
	"sync"
)

// onceListener hands out the one connection the bridge makes, or the
// error that kept it from being made.
type onceListener struct {
	ch     chan net.Conn
	mu     sync.Mutex
	err    error
	closed chan struct{}
	once   sync.Once
}

func newOnceListener() *onceListener {
	return &onceListener{ch: make(chan net.Conn, 1), closed: make(chan struct{})}
}

func (l *onceListener) deliver(c net.Conn) {
	select {
	case l.ch <- c:
	default:
		c.Close()
	}
}

func (l *onceListener) fail(err error) {
	l.mu.Lock()
	l.err = err
	l.mu.Unlock()
	l.Close()
}

// Accept implements net.Listener.
func (l *onceListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.closed:
		select {
		case c := <-l.ch:
			return c, nil
		default:
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.err != nil {
			return nil, l.err
		}
		return nil, net.ErrClosed
	}
}

// Close implements net.Listener.
func (l *onceListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

// Addr implements net.Listener.
func (l *onceListener) Addr() net.Addr { return bridgeAddr{} }

type bridgeAddr struct{}

func (bridgeAddr) Network() string { return "pods/exec" }
func (bridgeAddr) String() string  { return "pods/exec" }
