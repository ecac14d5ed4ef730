package transparent

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/guest/initsys"
	"github.com/oac/sandbox-agent/protocol"
)

// TestCaptureInANetworkNamespace runs the real rules in a fresh network
// namespace (this test binary re-executed with CLONE_NEWNET; needs root).
func TestCaptureInANetworkNamespace(t *testing.T) {
	if os.Getenv("OAC_CAPTURE_CHILD") == "1" {
		captureChild(t)
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestCaptureInANetworkNamespace$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "OAC_CAPTURE_CHILD=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	out, err := cmd.CombinedOutput()
	t.Logf("child:\n%s", out)
	require.NoError(t, err)
}

type opened struct {
	host string
	port int
	via  string
}

func captureChild(t *testing.T) {
	_, err := initsys.LoopbackUp()
	require.NoError(t, err)
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	var mu sync.Mutex
	var log []opened
	open := func(ctx context.Context, host string, port int, via string) (net.Conn, protocol.EgressReply) {
		mu.Lock()
		log = append(log, opened{host, port, via})
		mu.Unlock()
		if host == "refused.test" {
			return nil, protocol.EgressReply{Code: protocol.EgressDenied, Effect: protocol.EffectNone, Reason: "port not allowed"}
		}
		c, err := net.Dial("tcp", echo.Addr().String())
		if err != nil {
			return nil, protocol.EgressReply{Code: protocol.EgressIO, Effect: protocol.EffectNone}
		}
		return c, protocol.EgressReply{}
	}
	ask := func(ctx context.Context, name string) protocol.DNSReply {
		if name == "denied.test" {
			return protocol.DNSReply{Code: protocol.EgressDenied, Effect: protocol.EffectNone, Reason: "no rule allows denied.test on any port"}
		}
		return protocol.DNSReply{}
	}
	var dropped sync.WaitGroup
	dropped.Add(1)
	var once sync.Once
	tr, err := Start(Config{Open: open, Ask: ask, OnUDPDropped: func(n uint64) { once.Do(dropped.Done) }})
	require.NoError(t, err)
	defer tr.Close()

	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		// Any server address: DNS to port 53 anywhere is redirected.
		return d.DialContext(ctx, network, "192.0.2.53:53")
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addrs, err := r.LookupNetIP(ctx, "ip4", "echo.test")
	require.NoError(t, err)
	require.Len(t, addrs, 1)
	assert.True(t, DefaultPrefix.Contains(addrs[0]), addrs[0])

	roundTrip := func(addr string) {
		t.Helper()
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		require.NoError(t, err)
		defer c.Close()
		_, err = c.Write([]byte("ping"))
		require.NoError(t, err)
		b := make([]byte, 4)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = io.ReadFull(c, b)
		require.NoError(t, err)
		assert.Equal(t, "ping", string(b))
	}
	roundTrip(net.JoinHostPort(addrs[0].String(), "443"))
	roundTrip("203.0.113.7:8080")

	start := time.Now()
	_, err = r.LookupNetIP(ctx, "ip4", "denied.test")
	var de *net.DNSError
	require.ErrorAs(t, err, &de)
	assert.True(t, de.IsNotFound, "a denied name is NXDOMAIN: %v", err)
	t.Logf("denied name failed in %s", time.Since(start))

	// A refused target: the connection is reset.
	ra, err := r.LookupNetIP(ctx, "ip4", "refused.test")
	require.NoError(t, err)
	// (The kernel completed the handshake, so the reset may come before
	// connect returns or at the first read.)
	c, err := net.DialTimeout("tcp", netip.AddrPortFrom(ra[0], 22).String(), 5*time.Second)
	if err == nil {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
		c.Close()
	}
	assert.True(t, errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF), "%v", err)

	// UDP other than DNS is dropped: sendmsg fails with EPERM.
	u, err := net.Dial("udp", "192.0.2.1:9999")
	require.NoError(t, err)
	_, err = u.Write([]byte("x"))
	assert.ErrorIs(t, err, syscall.EPERM)
	u.Close()
	waitDone(t, &dropped, 10*time.Second)

	mu.Lock()
	defer mu.Unlock()
	assert.Contains(t, log, opened{"echo.test", 443, protocol.ViaTransparent})
	assert.Contains(t, log, opened{"203.0.113.7", 8080, protocol.ViaTransparent})
	assert.Contains(t, log, opened{"refused.test", 22, protocol.ViaTransparent})
	for _, o := range log {
		assert.NotEqual(t, "denied.test", o.host)
	}
}

func waitDone(t *testing.T, wg *sync.WaitGroup, d time.Duration) {
	t.Helper()
	ch := make(chan struct{})
	go func() { wg.Wait(); close(ch) }()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatal("the dropped UDP datagram was not counted")
	}
}
