package egress

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
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

// startHanding starts proxies whose way out hands sockets through hand and
// opens connections through open.
func startHanding(open Opener, httpAddr, socksAddr string, log *slog.Logger, hand Hander) (*Proxies, error) {
	return StartWith(net.Listen, NewExit(nil, Hands("hand", hand), Opens("session", open)), httpAddr, socksAddr, log)
}

func startHandingProxies(t *testing.T, routes map[string]string) (*Proxies, *fakeHost, *atomic.Int32) {
	t.Helper()
	fh := &fakeHost{routes: routes}
	var handed atomic.Int32
	p, err := startHanding(func(context.Context, string, int, string) (net.Conn, protocol.EgressReply) {
		t.Error("a connection the host answered was opened again")
		return nil, LocalFailure(protocol.EgressIO, "no")
	}, "127.0.0.1:0", "127.0.0.1:0", nil, fh.hander(t, &handed))
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

// headServer answers one request per connection with what it received
// before the body: the head, and the body's bytes after it.
func headServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				var head strings.Builder
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						return
					}
					head.WriteString(line)
					if line == "\r\n" {
						break
					}
				}
				req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(head.String())))
				if err != nil {
					return
				}
				body := make([]byte, req.ContentLength)
				_, _ = io.ReadFull(br, body)
				answer := head.String() + "|" + string(body)
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(answer), answer)
			}()
		}
	}()
	return l.Addr().String()
}

func TestAPlainHTTPRequestIsHandedWithItsHeadInOriginFormAndConnectionClose(t *testing.T) {
	p, fh, handed := startHandingProxies(t, map[string]string{"web.test:80": headServer(t)})
	c, err := net.Dial("tcp", p.HTTPAddr)
	require.NoError(t, err)
	defer c.Close()
	_, err = io.WriteString(c, "POST http://web.test/upload?x=1 HTTP/1.1\r\nHost: web.test\r\nProxy-Authorization: Basic c2VjcmV0\r\n"+
		"Proxy-Connection: keep-alive\r\nContent-Length: 5\r\nX-Mine: yes\r\n\r\nhello")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	got, _ := io.ReadAll(resp.Body)
	head, body, _ := strings.Cut(string(got), "|")
	assert.Equal(t, "hello", body, "the body follows the head unchanged")
	assert.True(t, strings.HasPrefix(head, "POST /upload?x=1 HTTP/1.1\r\nHost: web.test\r\n"), "origin form: %q", head)
	assert.Contains(t, head, "Connection: close\r\n", "the connection carries this request only")
	assert.Contains(t, head, "Content-Length: 5\r\n")
	assert.Contains(t, head, "X-Mine: yes\r\n")
	assert.NotContains(t, head, "Proxy-", "the proxy's own headers never reach the upstream")
	assert.Equal(t, int32(1), handed.Load())
	assert.Equal(t, []string{"http web.test:80"}, fh.callList())
}

func TestAHandedPlainHTTPRefusalIsAnsweredByTheProxy(t *testing.T) {
	p, _, handed := startHandingProxies(t, nil)
	c, err := net.Dial("tcp", p.HTTPAddr)
	require.NoError(t, err)
	defer c.Close()
	_, err = io.WriteString(c, "GET http://blocked.test/ HTTP/1.1\r\nHost: blocked.test\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	assert.Equal(t, 403, resp.StatusCode)
	assert.Equal(t, "denied", resp.Header.Get("X-Sandbox-Egress"))
	assert.Equal(t, int32(0), handed.Load())
}

func TestAChunkedRequestIsHandedWithItsFramingAndAnUpgradeKeepsItsHeaders(t *testing.T) {
	var got []string
	var mu sync.Mutex
	p, err := startHanding(func(context.Context, string, int, string) (net.Conn, protocol.EgressReply) {
		return nil, LocalFailure(protocol.EgressIO, "no")
	}, "127.0.0.1:0", "127.0.0.1:0", nil, func(ctx context.Context, c *net.TCPConn, host string, port int, via string, reply, early []byte) (protocol.EgressReply, bool) {
		mu.Lock()
		got = append(got, via+" "+string(reply)+"|"+string(early))
		mu.Unlock()
		return LocalFailure(protocol.EgressDenied, "recorded"), true
	})
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	for _, req := range []string{
		"POST http://web.test/c HTTP/1.1\r\nHost: web.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		"GET http://web.test/ws HTTP/1.1\r\nHost: web.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
	} {
		c, err := net.Dial("tcp", p.HTTPAddr)
		require.NoError(t, err)
		_, err = io.WriteString(c, req)
		require.NoError(t, err)
		_, _ = http.ReadResponse(bufio.NewReader(c), nil)
		c.Close()
	}
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, got, 2)
	assert.True(t, strings.HasPrefix(got[0], "http |POST /c HTTP/1.1\r\n"), got[0])
	assert.Contains(t, got[0], "Transfer-Encoding: chunked\r\n")
	assert.NotContains(t, got[0], "Content-Length")
	assert.True(t, strings.HasSuffix(got[0], "\r\n\r\n5\r\nhello\r\n0\r\n\r\n"), "the chunks follow the head as the client sent them: %q", got[0])
	assert.Contains(t, got[1], "Connection: Upgrade\r\n")
	assert.Contains(t, got[1], "Upgrade: websocket\r\n")
	assert.NotContains(t, got[1], "close")
}

func TestARequestTooLargeToHandGoesAsAStream(t *testing.T) {
	web := headServer(t)
	fh := &fakeHost{routes: map[string]string{"web.test:80": web}}
	var handed atomic.Int32
	p, err := startHanding(fh.open, "127.0.0.1:0", "127.0.0.1:0", nil, fh.hander(t, &handed))
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	c, err := net.Dial("tcp", p.HTTPAddr)
	require.NoError(t, err)
	defer c.Close()
	big := strings.Repeat("v", protocol.MaxHandEarly)
	_, err = io.WriteString(c, "GET http://web.test/big HTTP/1.1\r\nHost: web.test\r\nX-Big: "+big+"\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	got, _ := io.ReadAll(resp.Body)
	assert.Contains(t, string(got), "GET /big HTTP/1.1")
	assert.Equal(t, int32(0), handed.Load(), "over the early-bytes bound: the request went as a stream")
}
