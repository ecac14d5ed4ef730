package egress

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/proxy"

	"github.com/oac/sandbox-agent/protocol"
)

// hander stands in for the host taking the client's socket: it decides
// with fh, and for an allowed connection keeps its own descriptor of the
// socket, writes reply to it and early to the upstream and joins them.
func (f *fakeHost) hander(t *testing.T, handed *atomic.Int32) Hander {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var held []net.Conn
	t.Cleanup(func() {
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return func(ctx context.Context, c *net.TCPConn, host string, port int, via string, reply, early []byte) (protocol.EgressReply, bool) {
		up, r := f.open(ctx, host, port, via)
		if !r.OK() {
			return r, true
		}
		handed.Add(1)
		file, err := c.File()
		if err != nil {
			up.Close()
			return LocalFailure(protocol.EgressIO, err.Error()), true
		}
		mine, err := net.FileConn(file)
		file.Close()
		if err != nil {
			up.Close()
			return LocalFailure(protocol.EgressIO, err.Error()), true
		}
		_, _ = mine.Write(reply)
		_, _ = up.Write(early)
		mu.Lock()
		held = append(held, mine, up)
		mu.Unlock()
		wg.Add(2)
		go func() {
			defer wg.Done()
			_, _ = io.Copy(up, mine)
		}()
		go func() {
			defer wg.Done()
			_, _ = io.Copy(mine, up)
		}()
		return r, true
	}
}

func startHandingProxies(t *testing.T, routes map[string]string) (*Proxies, *fakeHost, *atomic.Int32) {
	t.Helper()
	fh := &fakeHost{routes: routes}
	var handed atomic.Int32
	p, err := StartWith(net.Listen, func(context.Context, string, int, string) (net.Conn, protocol.EgressReply) {
		t.Error("a connection the host answered was opened again")
		return nil, LocalFailure(protocol.EgressIO, "no")
	}, "127.0.0.1:0", "127.0.0.1:0", nil, WithHand(fh.hander(t, &handed)))
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	return p, fh, &handed
}

func TestAHandedConnectGetsTheReplyAndItsEarlyBytesFromTheHost(t *testing.T) {
	echo := echoServer(t)
	p, fh, handed := startHandingProxies(t, map[string]string{"echo.test:7": echo})
	c, err := net.Dial("tcp", p.HTTPAddr)
	require.NoError(t, err)
	defer c.Close()
	_, err = io.WriteString(c, "CONNECT echo.test:7 HTTP/1.1\r\nHost: echo.test:7\r\n\r\nearly")
	require.NoError(t, err)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	require.NoError(t, err)
	assert.Equal(t, 200, resp.StatusCode)
	buf := make([]byte, 5)
	_, err = io.ReadFull(br, buf)
	require.NoError(t, err)
	assert.Equal(t, "early", string(buf), "what the client sent before the answer reaches the upstream first")
	_, err = io.WriteString(c, "more")
	require.NoError(t, err)
	buf = buf[:4]
	_, err = io.ReadFull(br, buf)
	require.NoError(t, err)
	assert.Equal(t, "more", string(buf), "the proxy let go of the socket; the host carries it")
	assert.Equal(t, int32(1), handed.Load())
	assert.Equal(t, []string{"connect echo.test:7"}, fh.callList())
}

func TestAHandedRefusalIsAnsweredByTheProxy(t *testing.T) {
	p, _, handed := startHandingProxies(t, nil)
	c, err := net.Dial("tcp", p.HTTPAddr)
	require.NoError(t, err)
	defer c.Close()
	_, err = io.WriteString(c, "CONNECT blocked.test:443 HTTP/1.1\r\nHost: blocked.test:443\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
	require.NoError(t, err)
	assert.Equal(t, 403, resp.StatusCode)
	assert.Equal(t, "3 Denied", resp.Header.Get("X-Sandbox-Egress-Code"))
	assert.Equal(t, int32(0), handed.Load())

	d, err := proxy.SOCKS5("tcp", p.SOCKSAddr, nil, proxy.Direct)
	require.NoError(t, err)
	_, err = d.Dial("tcp", "blocked.test:443")
	require.Error(t, err, "a SOCKS refusal keeps its reply code")
}

func TestAHandedSOCKSConnectionCarriesBytes(t *testing.T) {
	echo := echoServer(t)
	p, _, handed := startHandingProxies(t, map[string]string{"echo.test:7": echo})
	d, err := proxy.SOCKS5("tcp", p.SOCKSAddr, nil, proxy.Direct)
	require.NoError(t, err)
	c, err := d.Dial("tcp", "echo.test:7")
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Write([]byte("ping"))
	require.NoError(t, err)
	buf := make([]byte, 4)
	_, err = io.ReadFull(c, buf)
	require.NoError(t, err)
	assert.Equal(t, "ping", string(buf))
	assert.Equal(t, int32(1), handed.Load())
}
