//go:build linux

package transparent

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/guest/egress"
	"github.com/oac/sandbox-agent/protocol"
)

// refusing is an Opener whose host denies everything.
func refusing(ctx context.Context, host string, port int, via string) (net.Conn, protocol.EgressReply) {
	return nil, protocol.EgressReply{Code: protocol.EgressDenied, Error: "Denied", Effect: protocol.EffectNone,
		Reason: "no rule allows " + net.JoinHostPort(host, fmt.Sprint(port)) + "; nothing was resolved"}
}

// handled gives the capture one connection for host:port and returns the
// client's side.
func handled(t *testing.T, tr *Transparent, host string, port int) net.Conn {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	s, err := ln.Accept()
	require.NoError(t, err)
	go tr.Handle(s, host, port)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

// A program that ignores proxies and asks a denied name on port 80 reads
// the proxy's explanation, not a reset; on another port it is reset.
func TestARefusedPort80ConnectionGetsTheExplanatory403(t *testing.T) {
	tr, err := Start(Config{Open: refusing, Ask: func(context.Context, string) protocol.DNSReply { return protocol.DNSReply{} },
		DNSAddr: "127.0.0.1:0", NoInstall: true})
	require.NoError(t, err)
	defer tr.Close()

	c := handled(t, tr, "denied.example", 80)
	_, err = io.WriteString(c, "GET / HTTP/1.1\r\nHost: denied.example\r\nUser-Agent: curl\r\nAccept: */*\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	assert.Equal(t, "denied", resp.Header.Get("X-Sandbox-Egress"))
	assert.Equal(t, "3 Denied", resp.Header.Get("X-Sandbox-Egress-Code"))
	assert.Contains(t, string(body), "Blocked by the sandbox's egress policy: this is not a network fault.")
	assert.Contains(t, string(body), "The sandbox host refused the connection to denied.example:80.")
	assert.Contains(t, string(body), "Reason: no rule allows denied.example:80; nothing was resolved")

	// The answer comes after the request's head, as a server's does (a
	// client may drop an answer that came before its request): nothing
	// arrives while the head is incomplete.
	c = handled(t, tr, "denied.example", 80)
	_, err = io.WriteString(c, "GET / HTTP/1.1\r\nHost: denied.example\r\n")
	require.NoError(t, err)
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	n, err := c.Read(make([]byte, 1))
	assert.Zero(t, n, "nothing before the head is complete")
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	assert.True(t, ne.Timeout())
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, err = io.WriteString(c, "\r\n")
	require.NoError(t, err)
	resp, err = http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)

	// A client that closes at once after the answer, and one that sends
	// nothing: both get the answer and the capture lets go.
	c = handled(t, tr, "denied.example", 80)
	got, _ := io.ReadAll(c)
	assert.True(t, strings.HasPrefix(string(got), "HTTP/1.1 403 Forbidden\r\n"), "%q", got)

	c = handled(t, tr, "denied.example", 443)
	got, err = io.ReadAll(c)
	assert.Empty(t, got)
	assert.ErrorIs(t, err, syscall.ECONNRESET, "another port is reset")
}

// A raw TCP client whose connection was reset can learn why: the guest's
// way out lists the refusal under the client's own source port, with
// the rule and the reason, as policy.
func TestAResetConnectionCanAskWhy(t *testing.T) {
	exit := egress.NewExit(nil, egress.Opens("session", func(ctx context.Context, host string, port int, via string) (net.Conn, protocol.EgressReply) {
		_, r := refusing(ctx, host, port, via)
		r.Rule = "web.example:443"
		return nil, r
	}))
	tr, err := Start(Config{Exit: exit, Ask: func(context.Context, string) protocol.DNSReply { return protocol.DNSReply{} },
		DNSAddr: "127.0.0.1:0", NoInstall: true})
	require.NoError(t, err)
	defer tr.Close()

	c := handled(t, tr, "db.example", 5432)
	_, err = io.ReadAll(c)
	require.ErrorIs(t, err, syscall.ECONNRESET, "the reset stays: nothing else is safe to write into an unknown protocol")
	mine := c.LocalAddr().(*net.TCPAddr).Port
	got := exit.Refusals().Recent(mine, "")
	require.Len(t, got, 1)
	assert.Equal(t, "db.example:5432", got[0].Target)
	assert.Equal(t, protocol.ViaTransparent, got[0].Via)
	assert.Equal(t, egress.RefusalPolicy, got[0].Kind)
	assert.Equal(t, "web.example:443", got[0].Rule)
	assert.Equal(t, "no rule allows db.example:5432; nothing was resolved", got[0].Reason)
}
