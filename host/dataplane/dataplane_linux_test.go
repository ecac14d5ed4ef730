package dataplane

import (
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/egress"
	"github.com/oac/sandbox-agent/protocol"
)

// needRoot skips where the fd channel cannot run: its pairs are made by a
// thread that joins the guest's network namespace (CAP_SYS_ADMIN). CI runs
// as root, where this never skips.
func needRoot(t *testing.T) {
	t.Helper()
	if !CanMakePairs() {
		if os.Getenv("CI") != "" {
			t.Fatal("the fd channel needs CAP_SYS_ADMIN; CI runs the tests as root")
		}
		t.Skip("the fd channel needs CAP_SYS_ADMIN: run the tests as root")
	}
}

func TestChannelAnswersAnAllowedConnectWithTheGuestsEndOfASplicedPair(t *testing.T) {
	needRoot(t)
	h := startHost(t, 8, nil, protocol.CapDataFD)
	g, _ := h.openChannel(t)
	r, c := g.connect(7, "up.test")
	assert.Equal(t, uint64(7), r.ID, "the answer names its request")
	require.NotNil(t, c, "an OK answer carries the guest's end")
	echoes(t, c)
	c.Close()
	require.Eventually(t, func() bool { return len(h.events.of(api.KindEgressClosed)) == 1 }, 5*time.Second, 10*time.Millisecond)
	allowed := h.events.of(api.KindEgress)
	require.Len(t, allowed, 1)
	assert.Equal(t, "allowed", allowed[0].Decision)
	assert.Equal(t, protocol.ViaTransparent, allowed[0].Via, "the same events as an egress stream")
	closed := h.events.of(api.KindEgressClosed)[0]
	assert.Equal(t, int64(22), *closed.BytesOut)
	assert.Equal(t, int64(22), *closed.BytesIn)
}

func TestChannelRefusalCarriesNoDescriptor(t *testing.T) {
	needRoot(t)
	h := startHost(t, 8, nil, protocol.CapDataFD)
	g, _ := h.openChannel(t)
	r, c := g.connect(1, "blocked.example.com")
	assert.Nil(t, c)
	assert.Equal(t, protocol.EgressDenied, r.Code)
	assert.NotEmpty(t, r.Reason)
	// The next answer is still matched with its own descriptor.
	r, c = g.connect(2, "up.test")
	require.True(t, r.OK())
	echoes(t, c)
	assert.Equal(t, int32(1), h.accepted.Load(), "only the allowed target was dialed")
	require.Eventually(t, func() bool { return len(h.events.of(api.KindEgress)) == 2 }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, "denied", h.events.of(api.KindEgress)[0].Decision)
}

func TestAConnectionWithoutTheSessionsTokenGetsNothing(t *testing.T) {
	needRoot(t)
	h := startHost(t, 8, nil, protocol.CapDataFD, protocol.CapDataDial)
	for name, first := range map[string]func(g *guest){
		"channel": func(g *guest) { g.send(protocol.TypeChannel, protocol.Channel{Token: "not-the-token"}) },
		"dialed":  func(g *guest) { g.send(protocol.TypeConnect, protocol.Connect{Token: "", Host: "up.test", Port: 80}) },
		"garbage": func(g *guest) { _, _ = g.c.Write([]byte("GET / HTTP/1.1\r\n\r\n")) },
	} {
		t.Run(name, func(t *testing.T) {
			g := h.dial(t)
			first(g)
			assert.True(t, closedSoon(g.c, 5*time.Second), "closed at once")
		})
	}
	assert.Equal(t, int32(0), h.accepted.Load(), "nothing was dialed")
	assert.Empty(t, h.events.of(api.KindEgress), "nothing was decided")
	assert.Empty(t, h.violations, "a stranger knocking is no violation by the guest")
}

func TestAConnectionThatNeverNamesItselfIsClosedAtTheHeaderTimeout(t *testing.T) {
	h := startHost(t, 8, nil, protocol.CapDataDial)
	g := h.dial(t)
	start := time.Now()
	require.True(t, closedSoon(g.c, 10*time.Second))
	assert.GreaterOrEqual(t, time.Since(start), 2*time.Second-50*time.Millisecond, "HeaderTimeout (2 s here)")
}

func TestTheGuestBreakingTheChannelIsReported(t *testing.T) {
	needRoot(t)
	for name, bad := range map[string]func(g *guest){
		"oversized frame": func(g *guest) {
			_, _ = g.c.Write(protocol.AppendFrame(nil, protocol.TypeConnect, make([]byte, protocol.MaxHeaderFrame+1)))
		},
		"wrong frame type": func(g *guest) { g.send(protocol.TypeHello, protocol.Hello{}) },
		"Connect without id": func(g *guest) {
			g.send(protocol.TypeConnect, protocol.Connect{Host: "up.test", Port: 80})
		},
		"malformed body": func(g *guest) {
			_, _ = g.c.Write(protocol.AppendFrame(nil, protocol.TypeConnect, []byte(`{"id":1,"host":`)))
		},
	} {
		t.Run(strings.ReplaceAll(name, " ", "_"), func(t *testing.T) {
			h := startHost(t, 8, nil, protocol.CapDataFD)
			g, _ := h.openChannel(t)
			bad(g)
			select {
			case err := <-h.violations:
				assert.ErrorIs(t, err, ErrViolation)
			case <-time.After(5 * time.Second):
				t.Fatal("no violation reported")
			}
			assert.True(t, closedSoon(g.c, 5*time.Second), "the channel is closed")
		})
	}
}

// openFDs counts this process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

// A guest asking for pairs as fast as it can and keeping every one gets
// at most the broker's stream limit; the host's descriptors stay bounded.
func TestPairsAreBoundedByTheBrokersStreamLimit(t *testing.T) {
	needRoot(t)
	const limit = 16
	h := startHost(t, limit, nil, protocol.CapDataFD)
	g, ch := h.openChannel(t)
	before := openFDs(t)
	const asks = 200
	for i := 1; i <= asks; i++ {
		g.send(protocol.TypeConnect, protocol.Connect{ID: uint64(i), Host: "up.test", Port: 80})
	}
	ok, exhausted := 0, 0
	var held []*net.UnixConn
	for range asks {
		var r protocol.Connected
		require.NoError(t, g.recv(protocol.TypeConnected, &r))
		switch {
		case r.OK():
			c, err := g.r.TakeConn()
			require.NoError(t, err)
			held = append(held, c)
			ok++
		case r.Code == protocol.EgressResourceExhausted:
			exhausted++
		default:
			t.Fatalf("unexpected answer %+v", r)
		}
	}
	assert.Equal(t, limit, ok, "one pair per stream slot")
	assert.Equal(t, asks-limit, exhausted, "every other request answered ResourceExhausted, none left hanging")
	// The slots are the bound: exactly limit are taken, by the held
	// connections. Open also counts requests still being answered: a
	// refused one's answer reaches the guest before its goroutine is done,
	// so it settles to limit rather than being there at once.
	assert.Equal(t, limit, h.broker.Active(), "one stream slot per held connection, no more")
	require.Eventually(t, func() bool { return ch.Open() == int64(limit) }, 10*time.Second, time.Millisecond,
		"the refused requests are done, the held ones are carried")
	// Per held connection the host holds 6 (HostFDsPerConnection: the
	// upstream socket, its end of the pair, a splice pipe each way); this
	// test process also holds the guest's end and the echo server's
	// socket and splice pipe: 4 more. Plus the pairs made ahead and slack
	// for the runtime.
	grown := openFDs(t) - before
	t.Logf("%d descriptors for %d held connections", grown, limit)
	assert.LessOrEqual(t, grown, limit*(HostFDsPerConnection+4)+2*pairsAhead+16)
	for _, c := range held {
		c.Close()
	}
	require.Eventually(t, func() bool { return ch.Open() == 0 }, 10*time.Second, 10*time.Millisecond,
		"closing the guest's ends frees the slots")
	r, c := g.connect(asks+1, "up.test")
	require.True(t, r.OK(), "a slot is free again")
	echoes(t, c)
}

func TestStopEndsCarriedConnectionsAndServe(t *testing.T) {
	needRoot(t)
	h := startHost(t, 8, nil, protocol.CapDataFD, protocol.CapDataDial)
	g, _ := h.openChannel(t)
	_, c := g.connect(1, "up.test")
	echoes(t, c)
	d := h.dial(t)
	d.send(protocol.TypeConnect, protocol.Connect{Token: testToken, Host: "up.test", Port: 80})
	var r protocol.Connected
	require.NoError(t, d.recv(protocol.TypeConnected, &r))
	require.True(t, r.OK())
	echoes(t, d.c)
	start := time.Now()
	h.cancel()
	assert.True(t, closedSoon(c, 5*time.Second), "the pair's connection ends")
	assert.True(t, closedSoon(d.c, 5*time.Second), "the dialed connection ends")
	assert.True(t, closedSoon(g.c, 5*time.Second), "the channel ends")
	h.ln.Close()
	select {
	case <-h.served:
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after the stop")
	}
	t.Logf("stopped in %s", time.Since(start).Round(time.Millisecond))
	closed := h.events.of(api.KindEgressClosed)
	require.Len(t, closed, 2)
	for _, e := range closed {
		assert.Equal(t, protocol.EgressCancelled.String(), e.Code)
	}
}

// A guest that stops reading its channel loses it at the write timeout;
// the host never blocks on it.
func TestAGuestThatStopsReadingLosesItsChannel(t *testing.T) {
	needRoot(t)
	h := startHost(t, 4, func(c *Config) { c.WriteTimeout = 300 * time.Millisecond }, protocol.CapDataFD)
	g, ch := h.openChannel(t)
	// Denied requests are answered at once: enough to fill the socket
	// buffers of a guest that reads nothing.
	start := time.Now()
	go func() {
		for i := uint64(1); ; i++ {
			if protocol.WriteMessage(g.c, protocol.TypeConnect, protocol.Connect{ID: i, Host: "blocked.example.com", Port: 80}) != nil {
				return
			}
		}
	}()
	select {
	case <-ch.Done():
		t.Logf("channel closed after %s", time.Since(start).Round(time.Millisecond))
	case <-time.After(30 * time.Second):
		t.Fatal("the host kept writing into a channel nobody reads")
	}
}

func TestADialedConnectionCarriesEgress(t *testing.T) {
	h := startHost(t, 8, nil, protocol.CapDataDial)
	d := h.dial(t)
	d.send(protocol.TypeConnect, protocol.Connect{Token: testToken, Host: "up.test", Port: 80, Via: protocol.ViaConnect})
	var r protocol.Connected
	require.NoError(t, d.recv(protocol.TypeConnected, &r))
	require.True(t, r.OK(), r.Reason)
	echoes(t, d.c)
	require.NoError(t, d.c.CloseWrite())
	assert.True(t, closedSoon(d.c, 5*time.Second), "the half-close reached the upstream, whose close came back")

	refused := h.dial(t)
	refused.send(protocol.TypeConnect, protocol.Connect{Token: testToken, Host: "blocked.example.com", Port: 80})
	require.NoError(t, refused.recv(protocol.TypeConnected, &r))
	assert.Equal(t, protocol.EgressDenied, r.Code)
	assert.True(t, closedSoon(refused.c, 5*time.Second), "a refused connection is closed after its answer")
}

func TestACarrierTheHostDidNotOfferIsRefused(t *testing.T) {
	h := startHost(t, 8, nil, protocol.CapDataDial)
	g := h.dial(t)
	g.send(protocol.TypeChannel, protocol.Channel{Token: testToken})
	assert.True(t, closedSoon(g.c, 5*time.Second))
	assert.Empty(t, h.channel)
}

func TestOneFDChannelPerSession(t *testing.T) {
	needRoot(t)
	h := startHost(t, 8, nil, protocol.CapDataFD)
	h.openChannel(t)
	second := h.dial(t)
	second.send(protocol.TypeChannel, protocol.Channel{Token: testToken})
	assert.True(t, closedSoon(second.c, 5*time.Second))
}

func TestForwardHandsTheGuestItsEndOfAPair(t *testing.T) {
	needRoot(t)
	h := startHost(t, 8, nil, protocol.CapDataFD)
	g, ch := h.openChannel(t)
	hostEnd, err := ch.Forward(4096, "daemon")
	require.NoError(t, err)
	defer hostEnd.Close()
	var fw protocol.Forward
	require.NoError(t, g.recv(protocol.TypeForward, &fw))
	assert.Equal(t, protocol.Forward{Port: 4096, Name: "daemon"}, fw)
	guestEnd, err := g.r.TakeConn()
	require.NoError(t, err)
	defer guestEnd.Close()
	_, err = hostEnd.Write([]byte("ping"))
	require.NoError(t, err)
	b := make([]byte, 4)
	_, err = guestEnd.Read(b)
	require.NoError(t, err)
	assert.Equal(t, "ping", string(b))
	_, err = ch.Forward(0, "")
	assert.Error(t, err, "port 0 is refused before anything is sent")
	_, err = ch.Forward(70000, "")
	assert.Error(t, err)
}

func TestTokensCompareWhole(t *testing.T) {
	assert.True(t, protocol.TokenMatches(testToken, testToken))
	assert.False(t, protocol.TokenMatches("", ""), "no token matches nothing")
	assert.False(t, protocol.TokenMatches(testToken[:31], testToken))
	assert.False(t, protocol.TokenMatches(testToken+"0", testToken))
	tok, err := protocol.NewDataToken()
	require.NoError(t, err)
	assert.Len(t, tok, 2*protocol.DataTokenBytes)
	_, err = strconv.ParseUint(tok[:8], 16, 64)
	assert.NoError(t, err)
}

// hostFor starts a host whose broker allows name:80 as a named upstream
// at addr, and opens its fd channel.
func hostFor(t *testing.T, name, addr string) (*host, *guest) {
	t.Helper()
	h := startHost(t, 8, func(c *Config) {
		pol, err := egress.ParsePolicy(nil, []string{name + ":80=" + addr})
		require.NoError(t, err)
		c.Broker = egress.New(egress.Config{Policy: pol})
	}, protocol.CapDataFD)
	g, _ := h.openChannel(t)
	return h, g
}

// A guest whose client died closes its end: the host ends the upstream at
// once and says the guest aborted, as it does for an aborted stream.
func TestAGuestThatClosesItsEndMidDownloadAborts(t *testing.T) {
	needRoot(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	ended := make(chan time.Time, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		chunk := make([]byte, 32<<10)
		_ = c.SetWriteDeadline(time.Now().Add(30 * time.Second))
		for range 100000 {
			if _, err := c.Write(chunk); err != nil {
				break
			}
		}
		ended <- time.Now()
	}()
	h, g := hostFor(t, "big.test", ln.Addr().String())
	r, c := g.connect(1, "big.test")
	require.True(t, r.OK(), r.Reason)
	_, err = io.ReadFull(c, make([]byte, 1<<20))
	require.NoError(t, err)
	closedAt := time.Now()
	c.Close() // with unread bytes, as a guest whose client was killed
	select {
	case at := <-ended:
		assert.Less(t, at.Sub(closedAt), time.Second, "the upstream ends at once")
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream outlived the guest's end")
	}
	require.Eventually(t, func() bool { return len(h.events.of(api.KindEgressClosed)) == 1 }, 5*time.Second, 10*time.Millisecond)
	e := h.events.of(api.KindEgressClosed)[0]
	assert.Equal(t, egress.ErrGuestAborted.Error(), e.Reason)
	assert.Equal(t, protocol.EgressCancelled.String(), e.Code)
}

// An upstream that resets is the upstream's failure, not the guest's.
func TestAnUpstreamResetIsNotTheGuestAborting(t *testing.T) {
	needRoot(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		_, _ = c.Write(make([]byte, 64<<10))
		_, _ = c.Read(make([]byte, 1))
		_ = c.(*net.TCPConn).SetLinger(0)
		c.Close() // RST
	}()
	h, g := hostFor(t, "rst.test", ln.Addr().String())
	r, c := g.connect(1, "rst.test")
	require.True(t, r.OK(), r.Reason)
	_, err = c.Write([]byte("x"))
	require.NoError(t, err)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = io.Copy(io.Discard, c)
	var ne net.Error
	assert.False(t, errors.As(err, &ne) && ne.Timeout(), "the connection ends with the upstream")
	require.Eventually(t, func() bool { return len(h.events.of(api.KindEgressClosed)) == 1 }, 5*time.Second, 10*time.Millisecond)
	assert.NotEqual(t, egress.ErrGuestAborted.Error(), h.events.of(api.KindEgressClosed)[0].Reason)
}
