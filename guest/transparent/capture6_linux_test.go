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

	"github.com/google/nftables"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/guest/initsys"
	"github.com/oac/sandbox-agent/protocol"
)

// inNewNetns runs the test named name again in a fresh network namespace
// (this test binary re-executed with CLONE_NEWNET; needs root) and
// reports whether this is that child.
func inNewNetns(t *testing.T, name string) bool {
	t.Helper()
	if os.Getenv("OAC_CAPTURE6_CHILD") == name {
		return true
	}
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("a network namespace needs root: run the tests as root")
		}
		t.Skip("needs root for a network namespace")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "OAC_CAPTURE6_CHILD="+name)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	out, err := cmd.CombinedOutput()
	t.Logf("child:\n%s", out)
	require.NoError(t, err)
	return false
}

// recordingOpener opens every target on an echo server and records it;
// refused.test is refused.
type recordingOpener struct {
	echo net.Listener
	mu   sync.Mutex
	log  []opened
}

func newRecordingOpener(t *testing.T) *recordingOpener {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { echo.Close() })
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return &recordingOpener{echo: echo}
}

func (o *recordingOpener) open(ctx context.Context, host string, port int, via string) (net.Conn, protocol.EgressReply) {
	o.mu.Lock()
	o.log = append(o.log, opened{host, port, via})
	o.mu.Unlock()
	if host == "refused.test" {
		return nil, protocol.EgressReply{Code: protocol.EgressDenied, Effect: protocol.EffectNone, Reason: "port not allowed"}
	}
	c, err := net.Dial("tcp", o.echo.Addr().String())
	if err != nil {
		return nil, protocol.EgressReply{Code: protocol.EgressIO, Effect: protocol.EffectNone}
	}
	return c, protocol.EgressReply{}
}

func (o *recordingOpener) opened() []opened {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]opened(nil), o.log...)
}

func allowAllButDenied(ctx context.Context, name string) protocol.DNSReply {
	if name == "denied.test" {
		return protocol.DNSReply{Code: protocol.EgressDenied, Effect: protocol.EffectNone, Reason: "no rule allows denied.test on any port"}
	}
	return protocol.DNSReply{}
}

// resolverVia asks the resolver through server (any address: DNS to
// port 53 anywhere is redirected, over IPv4 or IPv6).
func resolverVia(server string) *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, server)
	}}
}

func echoRoundTrip(t *testing.T, addr string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err, addr)
	defer c.Close()
	_, err = c.Write([]byte("ping"))
	require.NoError(t, err)
	b := make([]byte, 4)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = io.ReadFull(c, b)
	require.NoError(t, err, addr)
	assert.Equal(t, "ping", string(b), addr)
}

func TestIPv6IsCapturedLikeIPv4(t *testing.T) {
	if !inNewNetns(t, "TestIPv6IsCapturedLikeIPv4") {
		return
	}
	_, err := initsys.LoopbackUp()
	require.NoError(t, err)
	o := newRecordingOpener(t)
	tr, err := Start(Config{Open: o.open, Ask: allowAllButDenied})
	require.NoError(t, err)
	defer tr.Close()
	assert.Equal(t, "IPv4 and IPv6", tr.Families)
	assert.NotEmpty(t, tr.CaptureAddr6)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// DNS over IPv6 to any server is the resolver too; an allowed name's
	// IPv6 address carries its IPv4 one.
	r6 := resolverVia("[2001:db8::53]:53")
	a6, err := r6.LookupNetIP(ctx, "ip6", "echo.test")
	require.NoError(t, err)
	require.Len(t, a6, 1)
	assert.True(t, DefaultPrefix6.Contains(a6[0]), a6[0])
	a4, err := resolverVia("192.0.2.53:53").LookupNetIP(ctx, "ip4", "echo.test")
	require.NoError(t, err)
	require.Len(t, a4, 1)
	assert.Equal(t, a4[0].As4(), [4]byte(a6[0].AsSlice()[12:]), "one name, one pair of addresses")
	_, err = r6.LookupNetIP(ctx, "ip6", "denied.test")
	var de *net.DNSError
	require.ErrorAs(t, err, &de)
	assert.True(t, de.IsNotFound, "a denied name is NXDOMAIN over IPv6 too: %v", err)

	// The fake address is carried as its name, an IPv6 literal as itself
	// (zone dropped: the host judges the address).
	echoRoundTrip(t, net.JoinHostPort(a6[0].String(), "443"))
	echoRoundTrip(t, "[2001:db8::7]:8080")
	echoRoundTrip(t, "[fe80::1%lo]:8081")
	echoRoundTrip(t, "[64:ff9b::7f00:1]:8082")

	// ::1 is the guest's own loopback, as 127/8 is: not captured.
	own, err := net.Listen("tcp6", "[::1]:0")
	require.NoError(t, err)
	defer own.Close()
	go func() {
		if c, err := own.Accept(); err == nil {
			_, _ = c.Write([]byte("own!"))
			c.Close()
		}
	}()
	c, err := net.DialTimeout("tcp6", own.Addr().String(), 5*time.Second)
	require.NoError(t, err)
	b, _ := io.ReadAll(c)
	c.Close()
	assert.Equal(t, "own!", string(b))

	// A refused target: the connection is reset.
	c, err = net.DialTimeout("tcp", netip.AddrPortFrom(tr.pool.Addr6("refused.test"), 22).String(), 5*time.Second)
	if err == nil {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
		c.Close()
	}
	assert.True(t, errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF), "%v", err)

	// UDP over IPv6 other than DNS is dropped: sendmsg fails with EPERM.
	u, err := net.Dial("udp", "[2001:db8::1]:9999")
	require.NoError(t, err)
	_, err = u.Write([]byte("x"))
	assert.ErrorIs(t, err, syscall.EPERM)
	u.Close()
	n, err := UDPDropped6()
	require.NoError(t, err)
	assert.Equal(t, uint64(1), n)

	log := o.opened()
	assert.Contains(t, log, opened{"echo.test", 443, protocol.ViaTransparent})
	assert.Contains(t, log, opened{"2001:db8::7", 8080, protocol.ViaTransparent})
	assert.Contains(t, log, opened{"fe80::1", 8081, protocol.ViaTransparent})
	assert.Contains(t, log, opened{"64:ff9b::7f00:1", 8082, protocol.ViaTransparent})
	assert.Contains(t, log, opened{"refused.test", 22, protocol.ViaTransparent})
	assert.Len(t, log, 5, "the guest's own ::1 is not captured: %v", log)

	// Close leaves no table of either family.
	tr.Close()
	nc, err := nftables.New()
	require.NoError(t, err)
	_, err = nc.ListTableOfFamily(TableName, nftables.TableFamilyIPv6)
	assert.Error(t, err, "the ip6 table is gone")
	_, err = nc.ListTableOfFamily(TableName, nftables.TableFamilyIPv4)
	assert.Error(t, err, "the ip table is gone")
}

// A guest whose kernel has IPv6 turned off keeps the IPv4 capture whole,
// says why IPv6 is not captured, and answers AAAA with nothing.
func TestWithoutIPv6TheCaptureIsIPv4OnlyAndSaysWhy(t *testing.T) {
	if !inNewNetns(t, "TestWithoutIPv6TheCaptureIsIPv4OnlyAndSaysWhy") {
		return
	}
	for _, f := range []string{"/proc/sys/net/ipv6/conf/all/disable_ipv6", "/proc/sys/net/ipv6/conf/default/disable_ipv6"} {
		require.NoError(t, os.WriteFile(f, []byte("1\n"), 0o644))
	}
	_, err := initsys.LoopbackUp()
	require.NoError(t, err)
	o := newRecordingOpener(t)
	tr, err := Start(Config{Open: o.open, Ask: allowAllButDenied})
	require.NoError(t, err)
	defer tr.Close()
	t.Logf("families: %s", tr.Families)
	assert.Regexp(t, `^IPv4 only \(IPv6 not captured: .+\)$`, tr.Families)
	assert.Nil(t, tr.DNS6)
	nc, err := nftables.New()
	require.NoError(t, err)
	_, err = nc.ListTableOfFamily(TableName, nftables.TableFamilyIPv6)
	assert.Error(t, err, "nothing of IPv6 is left installed")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := resolverVia("192.0.2.53:53")
	_, err = r.LookupNetIP(ctx, "ip6", "echo.test")
	var de *net.DNSError
	require.ErrorAs(t, err, &de, "AAAA has no answer")
	a4, err := r.LookupNetIP(ctx, "ip4", "echo.test")
	require.NoError(t, err)
	echoRoundTrip(t, net.JoinHostPort(a4[0].String(), "443"))
	assert.Equal(t, []opened{{"echo.test", 443, protocol.ViaTransparent}}, o.opened())
}
