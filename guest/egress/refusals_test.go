package egress

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/protocol"
)

// askWhy asks the proxy at addr for its refusal list, in origin form (a
// client that honours NO_PROXY), with query.
func askWhy(t *testing.T, addr, query string) (int, refusalsAnswer) {
	t.Helper()
	resp, err := (&http.Client{Transport: &http.Transport{Proxy: nil}}).Get("http://" + addr + RefusalsPath + query)
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	var ans refusalsAnswer
	if resp.StatusCode == http.StatusOK {
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&ans))
	}
	return resp.StatusCode, ans
}

func TestTheWorkloadReadsWhyItsConnectionWasRefused(t *testing.T) {
	p, _ := startProxies(t, nil)
	c, err := net.Dial("tcp", p.HTTPAddr)
	require.NoError(t, err)
	defer c.Close()
	_, err = io.WriteString(c, "CONNECT blocked.test:22 HTTP/1.1\r\nHost: blocked.test:22\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
	require.NoError(t, err)
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	mine := c.LocalAddr().(*net.TCPAddr).Port

	status, ans := askWhy(t, p.HTTPAddr, fmt.Sprintf("?port=%d", mine))
	require.Equal(t, http.StatusOK, status)
	require.Len(t, ans.Refusals, 1)
	got := ans.Refusals[0]
	assert.Equal(t, mine, got.SourcePort)
	assert.Equal(t, "blocked.test:22", got.Target)
	assert.Equal(t, protocol.ViaConnect, got.Via)
	assert.Equal(t, RefusalPolicy, got.Kind, "policy, not the network")
	assert.Equal(t, "Denied", got.Code)
	assert.Equal(t, "api.example.com:443", got.Rule)
	assert.Equal(t, "no rule allows blocked.test:22", got.Reason)
	assert.WithinDuration(t, time.Now(), got.Time, time.Minute)
	assert.Equal(t, MaxRefusals, ans.Max)
	assert.Equal(t, int(RefusalAge/time.Second), ans.MaxAgeS)

	_, ans = askWhy(t, p.HTTPAddr, fmt.Sprintf("?port=%d", mine%65535+1))
	assert.Empty(t, ans.Refusals, "another connection's port finds nothing")
	_, ans = askWhy(t, p.HTTPAddr, "?target=BLOCKED.test:22")
	assert.Len(t, ans.Refusals, 1, "by target, in any case")
}

func TestAClientThatIgnoresNoProxyReachesTheListThroughTheProxy(t *testing.T) {
	p, fh := startProxies(t, nil)
	c, err := net.Dial("tcp", p.HTTPAddr)
	require.NoError(t, err)
	defer c.Close()
	_, err = fmt.Fprintf(c, "GET http://%s%s HTTP/1.1\r\nHost: %s\r\n\r\n", p.HTTPAddr, RefusalsPath, p.HTTPAddr)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Empty(t, fh.callList(), "the host was not asked")
}

func TestABadQuestionIsAnsweredWithWhatToAsk(t *testing.T) {
	p, _ := startProxies(t, nil)
	for _, q := range []string{"?port=0", "?port=70000", "?port=x", "?port=1&port=2", "?host=a", "?target=" + strings.Repeat("a", 2000)} {
		status, _ := askWhy(t, p.HTTPAddr, q)
		assert.Equal(t, http.StatusBadRequest, status, q)
	}
	resp, err := http.Post("http://"+p.HTTPAddr+RefusalsPath, "text/plain", strings.NewReader("x"))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
}

func TestTheListKeepsTheNewestAndForgetsTheOld(t *testing.T) {
	l := NewRefusals()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l.now = func() time.Time { return now }
	for i := 1; i <= MaxRefusals+10; i++ {
		l.add(Target{Host: "a.test", Port: 443, Via: protocol.ViaTransparent, SrcPort: i}, denied)
	}
	got := l.Recent(0, "")
	require.Len(t, got, MaxRefusals, "bounded in count")
	assert.Equal(t, MaxRefusals+10, got[0].SourcePort, "newest first")
	assert.Equal(t, 11, got[MaxRefusals-1].SourcePort, "the oldest went first")
	assert.Empty(t, l.Recent(5, ""), "forgotten")

	now = now.Add(RefusalAge + time.Second)
	assert.Empty(t, l.Recent(0, ""), "bounded in age")
}

func TestARefusalsTextIsSanitized(t *testing.T) {
	l := NewRefusals()
	l.add(Target{Host: "a.test", Port: 443}, protocol.EgressReply{Code: protocol.EgressDenied, Reason: "bad\x1b[31m\nline", Rule: strings.Repeat("r", 4*protocol.MaxEgressText)})
	got := l.Recent(0, "")[0]
	assert.NotContains(t, got.Reason, "\x1b")
	assert.NotContains(t, got.Reason, "\n")
	assert.LessOrEqual(t, len(got.Rule), protocol.MaxEgressText)
}

func TestRefusalKinds(t *testing.T) {
	for code, kind := range map[protocol.EgressCode]string{
		protocol.EgressDenied: RefusalPolicy, protocol.EgressResourceExhausted: RefusalLimit,
		protocol.EgressInvalidArgument: RefusalRequest, protocol.EgressNameNotResolved: RefusalNetwork,
		protocol.EgressConnectionRefused: RefusalNetwork, protocol.EgressTimedOut: RefusalNetwork,
		protocol.EgressIO: RefusalSandbox, protocol.EgressCancelled: RefusalSandbox,
	} {
		assert.Equal(t, kind, RefusalKind(code), code.String())
	}
}

// FuzzRefusalsQuery: the workload's query never panics, and what it
// accepts is in bounds.
func FuzzRefusalsQuery(f *testing.F) {
	for _, s := range []string{"", "port=40000", "target=a.test:443", "port=1&target=%5B::1%5D:22", "port=0", "port=1&port=2", "x=%zz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		port, target, err := parseRefusalsQuery(raw)
		if err != nil {
			return
		}
		require.True(t, port >= 0 && port <= 65535)
		require.LessOrEqual(t, len(target), protocol.MaxEgressHost+6)
	})
}
