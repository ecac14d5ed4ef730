package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/oac/sandbox-agent/internal/pipe"
	"github.com/oac/sandbox-agent/internal/yamux"
	"github.com/oac/sandbox-agent/protocol"
)

// Forward stream limits inside the guest.
const (
	// forwardHeaderTimeout bounds the wait for a host stream's header.
	forwardHeaderTimeout = 5 * time.Second
	// forwardDialTimeout bounds the dial to the guest port.
	forwardDialTimeout = 5 * time.Second
)

// forwardDialer dials the guest port of a forward stream. It is only ever
// given a port: the address is always 127.0.0.1.
type forwardDialer func(ctx context.Context, port int) (net.Conn, error)

// dialLoopback is the real forwardDialer: IPv4 loopback, nothing else.
func dialLoopback(ctx context.Context, port int) (net.Conn, error) {
	d := net.Dialer{Timeout: forwardDialTimeout}
	return d.DialContext(ctx, "tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
}

// serveHostStreams accepts the streams the host opens until the session
// ends, serving forward streams: each is joined to 127.0.0.1:PORT inside
// the guest. Streams of any other kind are closed. At most limit streams
// are served at once; the next one is closed at once (the host sees its
// connection end). It returns once every stream it served has ended.
func serveHostStreams(ctx context.Context, sess *yamux.Session, dial forwardDialer, limit int, log *slog.Logger) {
	var wg sync.WaitGroup
	defer wg.Wait()
	sem := make(chan struct{}, limit)
	for {
		st, err := sess.AcceptStream()
		if err != nil {
			return
		}
		select {
		case sem <- struct{}{}:
		default:
			log.Warn("too many forward streams, refusing one", "limit", limit)
			st.Close()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			defer st.Close()
			if err := serveForward(ctx, st, dial); err != nil {
				log.Warn("forward stream", "err", err)
			}
		}()
	}
}

func serveForward(ctx context.Context, st net.Conn, dial forwardDialer) error {
	h, err := protocol.ReadStreamHeader(st, forwardHeaderTimeout)
	if err != nil {
		return err
	}
	if h.Kind != protocol.KindForward {
		return fmt.Errorf("the host opened a %q stream; only forward streams are accepted", h.Kind)
	}
	return joinForward(ctx, st, h.Port, dial)
}

// joinForward joins a forwarded connection (a stream, or the guest's end
// of a data plane pair) to 127.0.0.1:port.
func joinForward(ctx context.Context, st net.Conn, port int, dial forwardDialer) error {
	c, err := dial(ctx, port)
	if err != nil {
		return fmt.Errorf("forward to guest port %d: %w", port, err)
	}
	defer c.Close()
	if _, _, err = pipe.Join(st, c, nil); err != nil {
		return fmt.Errorf("forward to guest port %d: %w", port, err)
	}
	return nil
}
