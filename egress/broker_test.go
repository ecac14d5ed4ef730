package egress

import (
	"context"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/protocol"
)

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

func (r *recorder) all() []api.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]api.Event(nil), r.evs...)
}

func (r *recorder) find(kind string) (api.Event, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.evs {
		if e.Event == kind {
			return e, true
		}
	}
	return api.Event{}, false
}

// open serves one egress stream for host:port and returns the guest's end
// and the host's answer.
func open(t *testing.T, b *Broker, rec *recorder, host string, port int) (net.Conn, protocol.EgressReply, chan struct{}) {
	t.Helper()
	guest, hostEnd := net.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.Serve(context.Background(), hostEnd, protocol.StreamHeader{Kind: protocol.KindEgress, Host: host, Port: port, Via: protocol.ViaConnect}, rec.emit)
	}()
	r, err := protocol.ReadEgressReply(guest, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { guest.Close() })
	return guest, r, done
}

func port(t *testing.T, addr string) int {
	ap, err := netip.ParseAddrPort(addr)
	require.NoError(t, err)
	return int(ap.Port())
}

func TestBrokerCarriesAnAllowedConnectionAndReportsBytes(t *testing.T) {
	addr, _ := echoServer(t)
	pol, err := ParsePolicy(nil, []string{"echo.test:7=" + addr})
	require.NoError(t, err)
	b := New(Config{Policy: pol})
	rec := &recorder{}
	guest, r, done := open(t, b, rec, "Echo.Test.", 7)
	require.True(t, r.OK(), "%+v", r)
	assert.Equal(t, "upstream echo.test:7="+addr, r.Rule)
	_, err = guest.Write([]byte("hello"))
	require.NoError(t, err)
	buf := make([]byte, 5)
	_, err = io.ReadFull(guest, buf)
	require.NoError(t, err)
	assert.Equal(t, "hello", string(buf))
	guest.Close()
	<-done
	dec, ok := rec.find(api.KindEgress)
	require.True(t, ok)
	assert.Equal(t, DecisionAllowed, dec.Decision)
	assert.Equal(t, "echo.test:7", dec.Target)
	assert.Equal(t, addr, dec.Address)
	cl, ok := rec.find(api.KindEgressClosed)
	require.True(t, ok)
	assert.Equal(t, dec.Conn, cl.Conn)
	assert.Equal(t, int64(5), *cl.BytesOut)
	assert.Equal(t, int64(5), *cl.BytesIn)
	assert.NotNil(t, cl.DurationMS)
	assert.Equal(t, 0, b.Active())
}

func TestBrokerDeniesWithReasonAndDialsNothing(t *testing.T) {
	b := New(Config{Resolver: fakeDNS{}})
	var dials atomic.Int32
	b.dialed = func(string, string) { dials.Add(1) }
	rec := &recorder{}
	_, r, done := open(t, b, rec, "api.example.com", 443)
	<-done
	assert.Equal(t, protocol.EgressDenied, r.Code)
	assert.Equal(t, "Denied", r.Error)
	assert.Equal(t, protocol.EffectNone, r.Effect)
	assert.Contains(t, r.Reason, "port 443 is not allowed by any rule")
	e, _ := rec.find(api.KindEgress)
	assert.Equal(t, DecisionDenied, e.Decision)
	assert.Equal(t, "Denied", e.Code)
	assert.Equal(t, "api.example.com:443", e.Target)
	_, closed := rec.find(api.KindEgressClosed)
	assert.False(t, closed, "a refused stream has no close event")
	assert.Zero(t, dials.Load())
}

func TestTheEventsNameTheConnectionByItsSourcePortInTheGuest(t *testing.T) {
	b := New(Config{Resolver: fakeDNS{}})
	var events []api.Event
	a := b.Open(context.Background(), protocol.StreamHeader{Kind: protocol.KindEgress, Host: "db.example.com", Port: 5432, Via: protocol.ViaTransparent, SrcPort: 40312},
		func(e api.Event) { events = append(events, e) })
	defer a.Close()
	assert.False(t, a.Answered(nil))
	require.Len(t, events, 1)
	assert.Equal(t, 40312, events[0].SourcePort)
	assert.Equal(t, "db.example.com:5432", events[0].Target)
	assert.Equal(t, DecisionDenied, events[0].Decision)

	events = nil
	a = b.Open(context.Background(), protocol.StreamHeader{Kind: protocol.KindEgress, Host: "db.example.com", Port: 5432, SrcPort: 70000}, func(e api.Event) { events = append(events, e) })
	a.Answered(nil)
	require.Len(t, events, 1)
	assert.Zero(t, events[0].SourcePort, "an invalid header's port is not echoed")
}

func TestBrokerResolvesOnceAndDialsTheCheckedAddress(t *testing.T) {
	addr, _ := echoServer(t)
	p := port(t, addr)
	// The name is allowed; loopback needs the explicit CIDR rule. A second
	// lookup would answer the metadata address: it must never happen.
	pol, err := ParsePolicy([]string{"rebind.test:" + itoa(p), "127.0.0.1/32:" + itoa(p)}, nil)
	require.NoError(t, err)
	var lookups atomic.Int32
	res := resolverFunc(func(name string) ([]netip.Addr, error) {
		if lookups.Add(1) == 1 {
			return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
		}
		return []netip.Addr{netip.MustParseAddr("169.254.169.254")}, nil
	})
	b := New(Config{Policy: pol, Resolver: res})
	var dialed []string
	var mu sync.Mutex
	b.dialed = func(_, a string) { mu.Lock(); dialed = append(dialed, a); mu.Unlock() }
	rec := &recorder{}
	guest, r, done := open(t, b, rec, "rebind.test", p)
	require.True(t, r.OK(), "%+v", r)
	guest.Close()
	<-done
	assert.Equal(t, int32(1), lookups.Load())
	mu.Lock()
	assert.Equal(t, []string{"127.0.0.1:" + itoa(p)}, dialed)
	mu.Unlock()
}

type resolverFunc func(string) ([]netip.Addr, error)

func (f resolverFunc) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	return f(host)
}

func TestBrokerStreamLimitGivesResourceExhausted(t *testing.T) {
	addr, _ := echoServer(t)
	pol, err := ParsePolicy(nil, []string{"echo.test:7=" + addr})
	require.NoError(t, err)
	b := New(Config{Policy: pol, MaxStreams: 2})
	rec := &recorder{}
	for range 2 {
		_, r, _ := open(t, b, rec, "echo.test", 7)
		require.True(t, r.OK())
	}
	_, r, done := open(t, b, rec, "echo.test", 7)
	<-done
	assert.Equal(t, protocol.EgressResourceExhausted, r.Code)
	assert.Contains(t, r.Reason, "limit of 2 concurrent egress connections")
}

func TestBrokerConnectFailures(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := ln.Addr().String()
	ln.Close()
	pol, err := ParsePolicy([]string{"slow.test:443"}, []string{"gone.test:80=" + closed})
	require.NoError(t, err)
	slow := resolverFunc(func(string) ([]netip.Addr, error) { return nil, context.DeadlineExceeded })
	b := New(Config{Policy: pol, Resolver: slow, ConnectTimeout: 200 * time.Millisecond})
	rec := &recorder{}
	_, r, _ := open(t, b, rec, "gone.test", 80)
	assert.Equal(t, protocol.EgressConnectionRefused, r.Code, "%+v", r)
	assert.Equal(t, protocol.EffectNone, r.Effect)
	_, r, _ = open(t, b, rec, "slow.test", 443)
	assert.Equal(t, protocol.EgressNameResolutionFailed, r.Code, "%+v", r)
	assert.Equal(t, "slow.test:443", r.Rule)
}

func TestBrokerIdleTimeoutClosesWithTimedOut(t *testing.T) {
	addr, _ := echoServer(t)
	pol, err := ParsePolicy(nil, []string{"echo.test:7=" + addr})
	require.NoError(t, err)
	b := New(Config{Policy: pol, IdleTimeout: 100 * time.Millisecond})
	rec := &recorder{}
	guest, r, done := open(t, b, rec, "echo.test", 7)
	require.True(t, r.OK())
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("an idle connection was not closed")
	}
	_, err = guest.Read(make([]byte, 1))
	assert.Error(t, err, "the guest's end sees the close")
	cl, ok := rec.find(api.KindEgressClosed)
	require.True(t, ok)
	assert.Equal(t, "TimedOut", cl.Code)
	assert.Contains(t, cl.Reason, "idle timeout")
}

func TestBrokerRefusesInvalidHeaders(t *testing.T) {
	b := New(Config{})
	rec := &recorder{}
	for _, h := range []protocol.StreamHeader{
		{Kind: protocol.KindEgress, Host: "a\nb", Port: 443},
		{Kind: protocol.KindEgress, Host: "a", Port: 0},
		{Kind: protocol.KindLog, Name: "x"},
	} {
		guest, hostEnd := net.Pipe()
		go b.Serve(context.Background(), hostEnd, h, rec.emit)
		r, err := protocol.ReadEgressReply(guest, 5*time.Second)
		require.NoError(t, err)
		assert.Equal(t, protocol.EgressInvalidArgument, r.Code)
		guest.Close()
	}
	// Each Serve emits its event on its own goroutine, in any order.
	assert.Eventually(t, func() bool {
		for _, e := range rec.all() {
			if e.Event == api.KindEgress && e.Target == "a?b:443" {
				return true
			}
		}
		return false
	}, 5*time.Second, 10*time.Millisecond, "guest text is escaped in events")
}

func TestPolicySwapWhileServing(t *testing.T) {
	addr, _ := echoServer(t)
	allow, err := ParsePolicy(nil, []string{"echo.test:7=" + addr})
	require.NoError(t, err)
	b := New(Config{Policy: allow})
	rec := &recorder{}
	guest, r, done := open(t, b, rec, "echo.test", 7)
	require.True(t, r.OK())

	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if i%2 == 0 {
				b.SetPolicy(nil)
			} else {
				b.SetPolicy(allow)
			}
		}
	}()
	for range 20 {
		g, _, d := open(t, b, rec, "echo.test", 7)
		g.Close()
		<-d
	}
	close(stop)
	wg.Wait()

	b.SetPolicy(nil)
	_, r, _ = open(t, b, rec, "echo.test", 7)
	assert.Equal(t, protocol.EgressDenied, r.Code, "new streams see the new policy")
	_, err = guest.Write([]byte("still"))
	require.NoError(t, err)
	buf := make([]byte, 5)
	_, err = io.ReadFull(guest, buf)
	require.NoError(t, err, "a connected stream keeps running after the swap")
	guest.Close()
	<-done
}

func TestADialsErrorIsTheCodeTheGuestCanActOn(t *testing.T) {
	ctx := context.Background()
	for err, code := range map[error]protocol.EgressCode{
		syscall.ECONNREFUSED:  protocol.EgressConnectionRefused,
		syscall.ENETUNREACH:   protocol.EgressUnreachable,
		syscall.EHOSTUNREACH:  protocol.EgressUnreachable,
		syscall.EADDRNOTAVAIL: protocol.EgressResourceExhausted, // no free local port: not the upstream's fault
		syscall.EMFILE:        protocol.EgressResourceExhausted,
	} {
		f := dialFailure(ctx, "192.0.2.1:443", &net.OpError{Op: "dial", Err: &os.SyscallError{Syscall: "connect", Err: err}})
		assert.Equal(t, code, f.Code, "%v", err)
	}
}
