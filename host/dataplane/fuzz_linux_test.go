package dataplane

import (
	"context"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/egress"
	"github.com/oac/sandbox-agent/protocol"
)

// FuzzDataConnection feeds arbitrary bytes to the host as the first bytes
// of a data plane connection, as a hostile guest or any process of a VM
// could. It must never panic or hang, never decide anything for a
// connection that did not present the token, and never report a stranger
// as the guest breaking the protocol.
func FuzzDataConnection(f *testing.F) {
	f.Add(protocol.AppendFrame(nil, protocol.TypeConnect, []byte(`{"token":"`+testToken+`","host":"up.test","port":80}`)))
	f.Add(protocol.AppendFrame(nil, protocol.TypeConnect, []byte(`{"token":"`+testToken+`","id":9,"host":"up.test","port":80}`)))
	f.Add(protocol.AppendFrame(nil, protocol.TypeConnect, []byte(`{"token":"wrong","host":"up.test","port":80}`)))
	f.Add(protocol.AppendFrame(nil, protocol.TypeChannel, []byte(`{"token":"`+testToken+`"}`)))
	f.Add(protocol.AppendFrame(nil, protocol.TypeHello, []byte(`{}`)))
	f.Add(protocol.AppendFrame(nil, protocol.TypeConnect, []byte(`{"token":"`+testToken+`","host":"up.test","port":80,"hand":true,"reply":"MjAw","early":"eA=="}`)))
	f.Add(append(protocol.AppendFrame(nil, protocol.TypeChannel, []byte(`{"token":"`+testToken+`"}`)),
		protocol.AppendFrame(nil, protocol.TypeConnect, []byte(`{"id":1,"host":"up.test","port":80,"hand":true}`))...))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		require.NoError(t, err)
		conn := func(fd int) *net.UnixConn {
			f := os.NewFile(uintptr(fd), "fuzz")
			defer f.Close()
			c, err := net.FileConn(f)
			require.NoError(t, err)
			return c.(*net.UnixConn)
		}
		guest, host := conn(fds[0]), conn(fds[1])
		defer guest.Close()
		var decided, violations atomic.Int32
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		cfg := Config{
			Ctx: ctx, HeaderTimeout: 200 * time.Millisecond, Token: testToken,
			Broker:      egress.New(egress.Config{}), // denies everything, dials nothing
			Offer:       []string{protocol.CapDataFD, protocol.CapDataHand, protocol.CapDataDial},
			Emit:        func(api.Event) { decided.Add(1) },
			OnViolation: func(error) { violations.Add(1) },
		}
		cfg.defaults()
		go func() {
			_, _ = guest.Write(data)
			_ = guest.CloseWrite()
		}()
		done := make(chan struct{})
		go func() {
			defer close(done)
			var taken atomic.Bool
			_ = serveConn(host, cfg, func() {}, &taken)
		}()
		select {
		case <-done:
		case <-time.After(2 * time.Second):
			cancel()
			<-done
		}
		hasToken := false
		if f, err := protocol.ReadFrame(&byteReader{b: data}, protocol.MaxHeaderFrame); err == nil {
			var c protocol.Connect
			hasToken = f.Decode(&c) == nil && protocol.TokenMatches(c.Token, testToken)
		}
		if !hasToken {
			require.Zero(t, decided.Load(), "decided for a connection without the token")
			require.Zero(t, violations.Load(), "a stranger is not the guest")
		}
	})
}

type byteReader struct{ b []byte }

func (r *byteReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, os.ErrClosed
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}
