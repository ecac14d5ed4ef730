package dataplane

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/egress"
	"github.com/oac/sandbox-agent/host/directguard"
	"github.com/oac/sandbox-agent/protocol"
)

const testToken = "0123456789abcdef0123456789abcdef"

// echoServer accepts on 127.0.0.1 and echoes until EOF.
func echoServer(t *testing.T) (addr string, accepted *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	accepted = &atomic.Int32{}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String(), accepted
}

type recorder struct {
	mu  sync.Mutex
	evs []api.Event
}

func (r *recorder) emit(e api.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.evs = append(r.evs, e)
}

func (r *recorder) of(kind string) []api.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []api.Event
	for _, e := range r.evs {
		if e.Event == kind {
			out = append(out, e)
		}
	}
	return out
}

// host is the host's side of a data plane under test: a unix listener
// standing in for the provider's transport, a broker that allows only the
// named upstream up.test:80 (an echo server), and Serve.
type host struct {
	path       string
	ln         *net.UnixListener
	events     *recorder
	accepted   *atomic.Int32
	broker     *egress.Broker
	channel    chan *Channel
	violations chan error
	cancel     context.CancelFunc
	served     chan struct{}
}

func startHost(t *testing.T, maxStreams int, tweak func(*Config), offer ...string) *host {
	t.Helper()
	// A guest with ids of its own dials it too: every parent searchable.
	dir, err := os.MkdirTemp("", "oac-dataplane-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	h := &host{path: filepath.Join(dir, "agent.sock"), events: &recorder{}, channel: make(chan *Channel, 1), violations: make(chan error, 16), served: make(chan struct{})}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: h.path, Net: "unix"})
	require.NoError(t, err)
	require.NoError(t, os.Chmod(h.path, 0o666))
	h.ln = ln
	up, accepted := echoServer(t)
	h.accepted = accepted
	pol, err := egress.ParsePolicy(nil, []string{"up.test:80=" + up})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	h.broker = egress.New(egress.Config{Policy: pol, MaxStreams: maxStreams})
	cfg := Config{
		Ctx: ctx, Broker: h.broker, Emit: h.events.emit,
		HeaderTimeout: 2 * time.Second, Token: testToken, Offer: offer,
		OnChannel:   func(ch *Channel) { h.channel <- ch },
		OnViolation: func(err error) { h.violations <- err },
	}
	if slices.Contains(offer, protocol.CapDataDirect) {
		g, err := directguard.Open(directguard.Config{ShareDir: t.TempDir()})
		require.NoError(t, err, "direct mode's guard (root, cgroup v2)")
		t.Cleanup(func() { g.Close() })
		cfg.Direct = g
	}
	if tweak != nil {
		tweak(&cfg)
	}
	go func() {
		defer close(h.served)
		Serve(func(ctx context.Context) (net.Conn, error) {
			stop := context.AfterFunc(ctx, func() { _ = ln.SetDeadline(time.Now()) })
			defer stop()
			c, err := ln.Accept()
			if err != nil && ctx.Err() != nil {
				return nil, net.ErrClosed
			}
			return c, err
		}, cfg)
	}()
	t.Cleanup(h.stop)
	return h
}

// stop ends Serve as the sandbox does and waits for it.
func (h *host) stop() {
	h.cancel()
	h.ln.Close()
	<-h.served
}

// guest is a guest's side spoken frame by frame (the real one is package
// guest/dataplane; here the test may also break the protocol).
type guest struct {
	t *testing.T
	c *net.UnixConn
	r *protocol.FDReader
}

func (h *host) dial(t *testing.T) *guest {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: h.path, Net: "unix"})
	require.NoError(t, err)
	g := &guest{t: t, c: c, r: protocol.NewFDReader(c)}
	t.Cleanup(func() { c.Close(); g.r.Close() })
	return g
}

// openChannel dials and sets up the fd channel.
func (h *host) openChannel(t *testing.T) (*guest, *Channel) {
	t.Helper()
	g := h.channelUp(t)
	select {
	case ch := <-h.channel:
		return g, ch
	case <-time.After(5 * time.Second):
		t.Fatal("the host did not take the channel")
		return nil, nil
	}
}

// channelUp dials and sends the Channel frame, and reads the host's
// acceptance.
func (h *host) channelUp(t *testing.T) *guest {
	t.Helper()
	g := h.dial(t)
	g.send(protocol.TypeChannel, protocol.Channel{Token: testToken})
	var ack protocol.Channel
	require.NoError(t, g.recv(protocol.TypeChannel, &ack))
	return g
}

func (g *guest) send(typ protocol.Type, v any) {
	g.t.Helper()
	require.NoError(g.t, protocol.WriteMessage(g.c, typ, v))
}

func (g *guest) recv(typ protocol.Type, v any) error {
	_ = g.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer func() { _ = g.c.SetReadDeadline(time.Time{}) }()
	return protocol.ReadMessage(g.r, protocol.MaxHeaderFrame, typ, v)
}

// connect asks for up.test:80 (or target) and returns the answer and, for
// an OK one, the guest's end.
func (g *guest) connect(id uint64, target string) (protocol.Connected, *net.UnixConn) {
	g.t.Helper()
	g.send(protocol.TypeConnect, protocol.Connect{ID: id, Host: target, Port: 80, Via: protocol.ViaTransparent})
	var r protocol.Connected
	require.NoError(g.t, g.recv(protocol.TypeConnected, &r))
	if !r.OK() {
		return r, nil
	}
	c, err := g.r.TakeConn()
	require.NoError(g.t, err)
	g.t.Cleanup(func() { c.Close() })
	return r, c
}

// echoes checks that c carries bytes to the echo server and back.
func echoes(t *testing.T, c net.Conn) {
	t.Helper()
	msg := []byte("through the data plane")
	_, err := c.Write(msg)
	require.NoError(t, err)
	got := make([]byte, len(msg))
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = io.ReadFull(c, got)
	require.NoError(t, err)
	require.Equal(t, msg, got)
}

// closedSoon reports whether c's peer ends it (EOF or an error) within d.
func closedSoon(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}
