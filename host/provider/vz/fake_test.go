package vz

import (
	"context"
	"io"
	"net"
	"sync"
)

type fakeHV struct {
	unavailable error
	newErr      error
	cfg         VMConfig
	m           *fakeMachine
}

func (h *fakeHV) Available() error { return h.unavailable }
func (h *fakeHV) NewMachine(cfg VMConfig, console io.Writer) (Machine, error) {
	if h.newErr != nil {
		return nil, h.newErr
	}
	h.cfg = cfg
	h.m = &fakeMachine{changes: make(chan State, 8), console: console, conns: make(chan net.Conn, 1), closed: make(chan struct{})}
	return h.m, nil
}

type fakeMachine struct {
	mu       sync.Mutex
	state    State
	changes  chan State
	console  io.Writer
	conns    chan net.Conn
	closed   chan struct{}
	once     sync.Once
	port     uint32
	startErr error
}

func (m *fakeMachine) set(s State) {
	m.mu.Lock()
	m.state = s
	m.mu.Unlock()
	m.changes <- s
}
func (m *fakeMachine) Start(context.Context) error {
	if m.startErr != nil {
		return m.startErr
	}
	m.set(StateStarting)
	m.set(StateRunning)
	_, _ = m.console.Write([]byte("Linux version 6.1\r\n"))
	return nil
}
func (m *fakeMachine) Stop() error { m.set(StateStopped); return nil }
func (m *fakeMachine) State() State {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.state
}
func (m *fakeMachine) StateChanged() <-chan State { return m.changes }
func (m *fakeMachine) ListenVsock(port uint32) (net.Listener, error) {
	m.port = port
	return &chanListener{m: m}, nil
}

// guestDial connects the "guest" to the host's listener.
func (m *fakeMachine) guestDial() net.Conn {
	host, guest := net.Pipe()
	m.conns <- host
	return guest
}

type chanListener struct{ m *fakeMachine }

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.m.conns:
		return c, nil
	case <-l.m.closed:
		return nil, net.ErrClosed
	}
}
func (l *chanListener) Close() error   { l.m.once.Do(func() { close(l.m.closed) }); return nil }
func (l *chanListener) Addr() net.Addr { return &net.UnixAddr{Name: "vsock", Net: "vsock"} }
