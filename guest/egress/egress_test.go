package egress

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/proxy"

	"github.com/oac/sandbox-agent/protocol"
)

// fakeHost stands in for the host broker: it maps target hosts to local
// addresses and refuses the rest as policy would.
type fakeHost struct {
	mu     sync.Mutex
	routes map[string]string
	calls  []string
}

func (f *fakeHost) open(_ context.Context, host string, port int, via string) (net.Conn, protocol.EgressReply) {
	f.mu.Lock()
	f.calls = append(f.calls, via+" "+net.JoinHostPort(host, fmt.Sprint(port)))
	addr, ok := f.routes[net.JoinHostPort(host, fmt.Sprint(port))]
	f.mu.Unlock()
	if !ok {
		return nil, protocol.EgressReply{Code: protocol.EgressDenied, Error: "Denied", Effect: protocol.EffectNone,
			Reason: "no rule allows " + net.JoinHostPort(host, fmt.Sprint(port)), Rule: "api.example.com:443"}
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, protocol.EgressReply{Code: protocol.EgressConnectionRefused, Error: "ConnectionRefused", Effect: protocol.EffectNone, Reason: err.Error()}
	}
	return c, protocol.EgressReply{}
}

func (f *fakeHost) callList() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

func startProxies(t *testing.T, routes map[string]string) (*Proxies, *fakeHost) {
	t.Helper()
	fh := &fakeHost{routes: routes}
	p, err := Start(fh.open, "127.0.0.1:0", "127.0.0.1:0", nil)
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	return p, fh
}

func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

func TestConnectTunnelsAfterTheHostSaysYes(t *testing.T) {
	echo := echoServer(t)
	p, fh := startProxies(t, map[string]string{"echo.test:7": echo})
	c, err := net.Dial("tcp", p.HTTPAddr)
	require.NoError(t, err)
	defer c.Close()
	// The first payload bytes arrive with the request: they must be
	// carried, not lost in the proxy's read buffer.
	_, err = io.WriteString(c, "CONNECT echo.test:7 HTTP/1.1\r\nHost: echo.test:7\r\n\r\nearly")
	require.NoError(t, err)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	require.NoError(t, err)
	assert.Equal(t, 200, resp.StatusCode)
	buf := make([]byte, 5)
	_, err = io.ReadFull(br, buf)
	require.NoError(t, err)
	assert.Equal(t, "early", string(buf))
	assert.Equal(t, []string{"connect echo.test:7"}, fh.callList())
}

func TestConnectDeniedIsAnExplicit403(t *testing.T) {
	p, _ := startProxies(t, nil)
	c, err := net.Dial("tcp", p.HTTPAddr)
	require.NoError(t, err)
	defer c.Close()
	_, err = io.WriteString(c, "CONNECT blocked.test:443 HTTP/1.1\r\nHost: blocked.test:443\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	assert.Equal(t, 403, resp.StatusCode)
	assert.Equal(t, "denied", resp.Header.Get("X-Sandbox-Egress"))
	assert.Equal(t, "3 Denied", resp.Header.Get("X-Sandbox-Egress-Code"))
	assert.Equal(t, "none", resp.Header.Get("X-Sandbox-Egress-Effect"))
	assert.Equal(t, "no rule allows blocked.test:443", resp.Header.Get("X-Sandbox-Egress-Reason"))
	assert.Equal(t, "api.example.com:443", resp.Header.Get("X-Sandbox-Egress-Rule"))
	assert.Contains(t, string(body), "not a network fault")
	assert.Contains(t, string(body), "Retrying will not help")
}

func TestAbsoluteFormRequestsReuseOneStreamPerTarget(t *testing.T) {
	var hits int
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hits++
		mu.Unlock()
		assert.Empty(t, r.Header.Get("Proxy-Connection"), "hop-by-hop headers are removed")
		assert.Equal(t, "/path", r.URL.Path, "origin-form upstream")
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %s %s", r.Method, r.Host, body)
	}))
	defer srv.Close()
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Transfer-Encoding", "chunked")
		w.(http.Flusher).Flush()
		io.WriteString(w, "other")
	}))
	defer other.Close()
	p, fh := startProxies(t, map[string]string{
		"site.test:80":    strings.TrimPrefix(srv.URL, "http://"),
		"other.test:8080": strings.TrimPrefix(other.URL, "http://"),
	})
	pu, _ := url.Parse("http://" + p.HTTPAddr)
	client := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu), MaxConnsPerHost: 1}}
	defer client.CloseIdleConnections()

	for i := range 3 {
		resp, err := client.Post("http://site.test/path", "text/plain", strings.NewReader(fmt.Sprint("body", i)))
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, fmt.Sprintf("POST site.test body%d", i), string(b))
	}
	resp, err := client.Get("http://other.test:8080/")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, "other", string(b))
	resp, err = client.Get("http://blocked.test/")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 403, resp.StatusCode)
	assert.Equal(t, "denied", resp.Header.Get("X-Sandbox-Egress"))
	calls := fh.callList()
	assert.Equal(t, "http site.test:80", calls[0])
	assert.Equal(t, 1, strings.Count(strings.Join(calls, "\n"), "site.test:80"), "keep-alive reuses the stream: %v", calls)
	assert.Equal(t, 3, hits)
}

func TestExpectContinueIsAnsweredByTheProxy(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Write(b)
	}))
	defer srv.Close()
	p, _ := startProxies(t, map[string]string{"site.test:80": strings.TrimPrefix(srv.URL, "http://")})
	c, err := net.Dial("tcp", p.HTTPAddr)
	require.NoError(t, err)
	defer c.Close()
	_, err = io.WriteString(c, "PUT http://site.test/x HTTP/1.1\r\nHost: site.test\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n")
	require.NoError(t, err)
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "HTTP/1.1 100 Continue\r\n", line)
	_, _ = br.ReadString('\n')
	_, err = io.WriteString(c, "data")
	require.NoError(t, err)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	assert.Equal(t, "data", string(b))
}

func TestMalformedAndOversizedRequests(t *testing.T) {
	p, fh := startProxies(t, nil)
	for _, c := range []struct {
		req    string
		status int
	}{
		{"GET /local HTTP/1.1\r\nHost: x\r\n\r\n", 400},
		{"GET https://site.test/ HTTP/1.1\r\nHost: site.test\r\n\r\n", 400},
		{"CONNECT site.test HTTP/1.1\r\n\r\n", 400},
		{"CONNECT site.test:0 HTTP/1.1\r\n\r\n", 400},
		{"CONNECT site.test:99999 HTTP/1.1\r\n\r\n", 400},
		{"GET http://user:pw@site.test/ HTTP/1.1\r\nHost: site.test\r\n\r\n", 400},
		{"GET http://site.test/ HTTP/1.1\r\nX: " + strings.Repeat("a", MaxHeaderBytes) + "\r\n\r\n", 431},
		{"garbage\r\n\r\n", 400},
	} {
		conn, err := net.Dial("tcp", p.HTTPAddr)
		require.NoError(t, err)
		go io.WriteString(conn, c.req)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if assert.NoError(t, err, c.req[:min(20, len(c.req))]) {
			assert.Equal(t, c.status, resp.StatusCode, c.req[:min(20, len(c.req))])
			assert.Equal(t, "error", resp.Header.Get("X-Sandbox-Egress"))
		}
		conn.Close()
	}
	assert.Empty(t, fh.callList(), "nothing malformed reaches the host")
}

func TestSOCKS5ConnectSendsNamesUnresolved(t *testing.T) {
	echo := echoServer(t)
	p, fh := startProxies(t, map[string]string{"echo.test:7": echo})
	d, err := proxy.SOCKS5("tcp", p.SOCKSAddr, nil, proxy.Direct)
	require.NoError(t, err)
	c, err := d.Dial("tcp", "echo.test:7")
	require.NoError(t, err)
	_, err = c.Write([]byte("ping"))
	require.NoError(t, err)
	buf := make([]byte, 4)
	_, err = io.ReadFull(c, buf)
	require.NoError(t, err)
	assert.Equal(t, "ping", string(buf))
	c.Close()
	assert.Equal(t, []string{"socks5 echo.test:7"}, fh.callList())
}

func TestSOCKS5RefusalsUseMatchingReplyCodes(t *testing.T) {
	p, _ := startProxies(t, nil)
	reply := func(req []byte) []byte {
		c, err := net.Dial("tcp", p.SOCKSAddr)
		require.NoError(t, err)
		defer c.Close()
		_, err = c.Write(append([]byte{5, 1, 0}, req...))
		require.NoError(t, err)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b, _ := io.ReadAll(c)
		return b
	}
	denied := reply([]byte{5, 1, 0, 3, 12, 'b', 'l', 'o', 'c', 'k', 'e', 'd', '.', 't', 'e', 's', 't', 0, 80})
	assert.Equal(t, []byte{5, 0, 5, socksNotAllowed, 0, 1, 0, 0, 0, 0, 0, 0}, denied)
	bind := reply([]byte{5, 2, 0, 1, 1, 2, 3, 4, 0, 80})
	assert.Equal(t, []byte{5, 0, 5, socksCommandNotSupported, 0, 1, 0, 0, 0, 0, 0, 0}, bind)
	badType := reply([]byte{5, 1, 0, 9})
	assert.Equal(t, []byte{5, 0, 5, socksAddrNotSupported, 0, 1, 0, 0, 0, 0, 0, 0}, badType)

	assert.Equal(t, byte(socksHostUnreachable), socksReplyCode(protocol.EgressNameNotResolved))
	assert.Equal(t, byte(socksConnectionRefused), socksReplyCode(protocol.EgressConnectionRefused))
	assert.Equal(t, byte(socksNetworkUnreachable), socksReplyCode(protocol.EgressUnreachable))
	assert.Equal(t, byte(socksTTLExpired), socksReplyCode(protocol.EgressTimedOut))
	assert.Equal(t, byte(socksGeneralFailure), socksReplyCode(protocol.EgressResourceExhausted))
}

func TestNoAuthMethodIsRequired(t *testing.T) {
	p, _ := startProxies(t, nil)
	c, err := net.Dial("tcp", p.SOCKSAddr)
	require.NoError(t, err)
	defer c.Close()
	_, _ = c.Write([]byte{5, 1, 2})
	b, _ := io.ReadAll(c)
	assert.Equal(t, []byte{5, 0xff}, b)
}

func TestProxyEnvKeepsTheBootstrapsChoice(t *testing.T) {
	vars := ProxyEnv(HTTPAddr, SOCKSAddr)
	assert.Contains(t, vars, "HTTP_PROXY=http://127.0.0.1:3128")
	assert.Contains(t, vars, "https_proxy=http://127.0.0.1:3128")
	assert.Contains(t, vars, "ALL_PROXY=socks5h://127.0.0.1:1080")
	assert.Contains(t, vars, "no_proxy=localhost,127.0.0.1,::1")
	assert.Contains(t, vars, "OAC_EGRESS_REFUSALS=http://127.0.0.1:3128/egress/refusals", "where the workload asks why")
	env := WithProxyEnv([]string{"PATH=/bin", "https_proxy=http://mine:1"}, vars)
	assert.Contains(t, env, "https_proxy=http://mine:1")
	assert.NotContains(t, env, "HTTPS_PROXY=http://127.0.0.1:3128", "either case set by the bootstrap wins")
	assert.NotContains(t, env, "https_proxy=http://127.0.0.1:3128")
	assert.Contains(t, env, "HTTP_PROXY=http://127.0.0.1:3128")
	assert.Len(t, env, 2+6+1)
}

func TestRefusalResponsesForOtherCodes(t *testing.T) {
	for code, status := range map[protocol.EgressCode]int{
		protocol.EgressResourceExhausted: 503, protocol.EgressTimedOut: 504, protocol.EgressConnectionRefused: 502,
		protocol.EgressNameNotResolved: 502, protocol.EgressInvalidArgument: 400,
	} {
		s := refusalResponse(Target{Host: "x.test", Port: 1}, protocol.EgressReply{Code: code, Effect: protocol.EffectNone, Reason: "r"})
		resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(s)), nil)
		require.NoError(t, err)
		assert.Equal(t, status, resp.StatusCode, code.String())
		assert.Equal(t, "failed", resp.Header.Get("X-Sandbox-Egress"))
	}
}

// FuzzParseRequest: the HTTP request parser never panics, and any target
// it accepts is a valid egress header.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
		"GET http://example.com/x?y HTTP/1.1\r\nHost: example.com\r\nProxy-Connection: keep-alive\r\n\r\n",
		"GET http://[::1]:8080/ HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n",
		"POST http://a.test/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		"GET / HTTP/1.1\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		lr := &limitedReader{r: bytes.NewReader(data), n: MaxHeaderBytes}
		req, tg, err := parseRequest(bufio.NewReader(lr))
		if err != nil {
			return
		}
		require.NotNil(t, req)
		h := protocol.StreamHeader{Kind: protocol.KindEgress, Host: tg.Host, Port: tg.Port}
		require.NoError(t, h.Validate())
	})
}

// FuzzSOCKSHandshake: the SOCKS5 parser never panics, never reads past a
// bounded input, and any target it accepts is a valid egress header.
func FuzzSOCKSHandshake(f *testing.F) {
	f.Add([]byte{5, 1, 0, 5, 1, 0, 3, 11, 'e', 'x', 'a', 'm', 'p', 'l', 'e', '.', 'c', 'o', 'm', 1, 187})
	f.Add([]byte{5, 1, 0, 5, 1, 0, 1, 127, 0, 0, 1, 0, 80})
	f.Add([]byte{5, 2, 0, 2, 5, 1, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 22})
	f.Add([]byte{4, 1, 0, 80, 127, 0, 0, 1, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		tg, err := socksHandshake(bufio.NewReader(bytes.NewReader(data)), io.Discard)
		if err != nil {
			return
		}
		h := protocol.StreamHeader{Kind: protocol.KindEgress, Host: tg.Host, Port: tg.Port}
		require.NoError(t, h.Validate())
	})
}

func TestKeptAliveStreamClosedByTheUpstreamIsRetriedForBodilessRequests(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	// The upstream answers one request per connection, then closes
	// without saying so (no Connection: close).
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				body := "answer for " + req.URL.Path
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			}()
		}
	}()
	p, fh := startProxies(t, map[string]string{"site.test:80": ln.Addr().String()})
	c, err := net.Dial("tcp", p.HTTPAddr)
	require.NoError(t, err)
	defer c.Close()
	br := bufio.NewReader(c)
	for _, path := range []string{"/one", "/two"} {
		_, err = io.WriteString(c, "GET http://site.test"+path+" HTTP/1.1\r\nHost: spoofed.test\r\n\r\n")
		require.NoError(t, err)
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		assert.Equal(t, "answer for "+path, string(b))
		time.Sleep(20 * time.Millisecond) // let the upstream's close arrive
	}
	assert.Len(t, fh.callList(), 2, "the second request went over a fresh stream")
}

// endlessServer answers every connection (an HTTP request or a tunnel)
// with an endless body, and reports how long after the client's kill each
// connection saw its end.
func endlessServer(t *testing.T) (addr string, ended chan time.Time) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	ended = make(chan time.Time, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = bufio.NewReader(c).ReadString('\n') // the request line, or anything
				_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 1000000000\r\n\r\n")
				chunk := make([]byte, 32<<10)
				_ = c.SetWriteDeadline(time.Now().Add(30 * time.Second))
				for range 30000 { // at most about 1 GB
					if _, err := c.Write(chunk); err != nil {
						break
					}
				}
				ended <- time.Now()
			}()
		}
	}()
	return ln.Addr().String(), ended
}

// Finding 6: a client killed mid-download must end the upstream
// connection at once, not after the proxy read the rest of the response
// (an endless one, before) or after a stream timeout.
func TestAKilledClientEndsTheUpstreamConnectionAtOnce(t *testing.T) {
	for _, how := range []string{"plain HTTP", "CONNECT"} {
		t.Run(strings.ReplaceAll(how, " ", "_"), func(t *testing.T) {
			addr, ended := endlessServer(t)
			p, _ := startProxies(t, map[string]string{"big.test:80": addr})
			c, err := net.Dial("tcp", p.HTTPAddr)
			require.NoError(t, err)
			if how == "CONNECT" {
				_, err = io.WriteString(c, "CONNECT big.test:80 HTTP/1.1\r\nHost: big.test:80\r\n\r\nGET / HTTP/1.1\r\n\r\n")
			} else {
				_, err = io.WriteString(c, "GET http://big.test/ HTTP/1.1\r\nHost: big.test\r\n\r\n")
			}
			require.NoError(t, err)
			_, err = io.ReadFull(c, make([]byte, 256<<10)) // mid-download
			require.NoError(t, err)
			_ = c.(*net.TCPConn).SetLinger(0)
			killed := time.Now()
			c.Close() // as the kernel does for a killed process with unread data: a reset
			select {
			case at := <-ended:
				t.Logf("upstream ended %s after the client was killed", at.Sub(killed).Round(time.Millisecond))
				// Nothing waits in between (0-7 ms measured): the bound is
				// margin for a busy machine, far below the response's end.
				assert.Less(t, at.Sub(killed), time.Second, "the abort reaches the upstream at once")
			case <-time.After(10 * time.Second):
				t.Fatal("the upstream connection outlived its killed client")
			}
		})
	}
}
