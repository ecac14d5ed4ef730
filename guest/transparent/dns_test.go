package transparent

import (
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/dns/dnsmessage"

	"github.com/oac/sandbox-agent/protocol"
)

func testResolver() (*Resolver, *atomic.Int32) {
	var asked atomic.Int32
	ask := func(ctx context.Context, name string) protocol.DNSReply {
		asked.Add(1)
		switch name {
		case "denied.test":
			return protocol.DNSReply{Code: protocol.EgressDenied, Effect: protocol.EffectNone, Reason: "no rule allows denied.test on any port; nothing was resolved"}
		case "gone.test":
			return protocol.DNSReply{Code: protocol.EgressNameNotResolved, Effect: protocol.EffectNone, Reason: "gone.test does not resolve on the host"}
		case "slow.test":
			return protocol.DNSReply{Code: protocol.EgressTimedOut, Effect: protocol.EffectPossible, Reason: "timed out"}
		}
		return protocol.DNSReply{}
	}
	return NewResolver(ask, NewPool(DefaultPrefix)), &asked
}

func query(t *testing.T, name string, typ dnsmessage.Type, edns bool) []byte {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 0x1234, RecursionDesired: true})
	b.EnableCompression()
	require.NoError(t, b.StartQuestions())
	require.NoError(t, b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET}))
	if edns {
		require.NoError(t, b.StartAdditionals())
		var rh dnsmessage.ResourceHeader
		require.NoError(t, rh.SetEDNS0(1232, dnsmessage.RCodeSuccess, false))
		require.NoError(t, b.OPTResource(rh, dnsmessage.OPTResource{}))
	}
	out, err := b.Finish()
	require.NoError(t, err)
	return out
}

func parse(t *testing.T, b []byte) dnsmessage.Message {
	t.Helper()
	require.NotNil(t, b)
	var m dnsmessage.Message
	require.NoError(t, m.Unpack(b))
	return m
}

func TestResolverAnswersAllowedNamesWithStableFakeAddresses(t *testing.T) {
	r, asked := testResolver()
	ctx := context.Background()
	m := parse(t, r.Handle(ctx, query(t, "API.Example.test.", dnsmessage.TypeA, false), true))
	assert.True(t, m.Header.Response)
	assert.Equal(t, uint16(0x1234), m.Header.ID)
	assert.Equal(t, dnsmessage.RCodeSuccess, m.Header.RCode)
	require.Len(t, m.Answers, 1)
	a := m.Answers[0].Body.(*dnsmessage.AResource).A
	assert.Equal(t, [4]byte{198, 18, 0, 2}, a)
	assert.Equal(t, uint32(AllowedTTL/time.Second), m.Answers[0].Header.TTL)

	// Same name, any case: same address, answered from the cache.
	m = parse(t, r.Handle(ctx, query(t, "api.example.test.", dnsmessage.TypeA, false), true))
	assert.Equal(t, a, m.Answers[0].Body.(*dnsmessage.AResource).A)
	assert.Equal(t, int32(1), asked.Load())
	name, ok := r.pool.Name(netipFrom4(a))
	assert.True(t, ok)
	assert.Equal(t, "api.example.test", name)

	// AAAA of an allowed name: no data, so nothing for Happy Eyeballs.
	m = parse(t, r.Handle(ctx, query(t, "api.example.test.", dnsmessage.TypeAAAA, false), true))
	assert.Equal(t, dnsmessage.RCodeSuccess, m.Header.RCode)
	assert.Empty(t, m.Answers)

	// PTR of the fake address maps back, without asking the host.
	m = parse(t, r.Handle(ctx, query(t, "2.0.18.198.in-addr.arpa.", dnsmessage.TypePTR, false), true))
	require.Len(t, m.Answers, 1)
	assert.Equal(t, "api.example.test.", m.Answers[0].Body.(*dnsmessage.PTRResource).PTR.String())
	m = parse(t, r.Handle(ctx, query(t, "1.1.168.192.in-addr.arpa.", dnsmessage.TypePTR, false), true))
	assert.Equal(t, dnsmessage.RCodeNameError, m.Header.RCode)
	m = parse(t, r.Handle(ctx, query(t, "localhost.", dnsmessage.TypeA, false), true))
	assert.Equal(t, [4]byte{127, 0, 0, 1}, m.Answers[0].Body.(*dnsmessage.AResource).A)
	assert.Equal(t, int32(1), asked.Load())
}

func netipFrom4(a [4]byte) netip.Addr { return netip.AddrFrom4(a) }

func netipMustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func TestResolverDeniedNameIsNXDOMAINWithTheReasonAsExtendedError(t *testing.T) {
	r, _ := testResolver()
	ctx := context.Background()
	m := parse(t, r.Handle(ctx, query(t, "denied.test.", dnsmessage.TypeA, true), true))
	assert.Equal(t, dnsmessage.RCodeNameError, m.Header.RCode)
	assert.Empty(t, m.Answers)
	require.Len(t, m.Additionals, 1)
	opt := m.Additionals[0].Body.(*dnsmessage.OPTResource)
	require.Len(t, opt.Options, 1)
	assert.Equal(t, uint16(optEDE), opt.Options[0].Code)
	assert.Equal(t, uint16(edeBlocked), binary.BigEndian.Uint16(opt.Options[0].Data))
	assert.Equal(t, "sandbox egress policy: no rule allows denied.test on any port; nothing was resolved", string(opt.Options[0].Data[2:]))

	// Without EDNS: the same NXDOMAIN, no OPT record.
	m = parse(t, r.Handle(ctx, query(t, "denied.test.", dnsmessage.TypeAAAA, false), true))
	assert.Equal(t, dnsmessage.RCodeNameError, m.Header.RCode)
	assert.Empty(t, m.Additionals)
	m = parse(t, r.Handle(ctx, query(t, "gone.test.", dnsmessage.TypeA, false), true))
	assert.Equal(t, dnsmessage.RCodeNameError, m.Header.RCode)
	// A host that could not decide: SERVFAIL, never silence.
	m = parse(t, r.Handle(ctx, query(t, "slow.test.", dnsmessage.TypeA, false), true))
	assert.Equal(t, dnsmessage.RCodeServerFailure, m.Header.RCode)
}

func TestResolverRefusesWhatIsNotOneQuery(t *testing.T) {
	r, asked := testResolver()
	ctx := context.Background()
	assert.Nil(t, r.Handle(ctx, []byte{1, 2, 3}, true), "shorter than a header: nothing to answer")
	resp := query(t, "a.test.", dnsmessage.TypeA, false)
	resp[2] |= 0x80 // QR: a response
	assert.Nil(t, r.Handle(ctx, resp, true))

	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 7})
	require.NoError(t, b.StartQuestions())
	for _, n := range []string{"a.test.", "b.test."} {
		require.NoError(t, b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(n), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}))
	}
	two, err := b.Finish()
	require.NoError(t, err)
	assert.Equal(t, dnsmessage.RCodeFormatError, parse(t, r.Handle(ctx, two, true)).Header.RCode)

	upd := query(t, "a.test.", dnsmessage.TypeA, false)
	upd[2] |= 5 << 3 // opcode UPDATE
	assert.Equal(t, dnsmessage.RCodeNotImplemented, parse(t, r.Handle(ctx, upd, true)).Header.RCode)
	assert.Zero(t, asked.Load())
}

func TestPoolWrapsAroundAndForgetsTheOldestName(t *testing.T) {
	p := NewPool(netipMustPrefix("10.0.0.0/29")) // .1 is Self; .2-.6 handed out; .7 broadcast
	var got []string
	for i := range 6 {
		got = append(got, p.Addr(string(rune('a'+i))).String())
	}
	assert.Equal(t, []string{"10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6", "10.0.0.2"}, got)
	_, ok := p.Name(p.Addr("f"))
	assert.True(t, ok)
	assert.Equal(t, 5, p.Len(), "a lost its address to f")
}

// FuzzResolverHandle feeds arbitrary bytes as a query (UDP and TCP): it
// must never panic, never answer a response, and every answer must parse
// and fit the transport.
func FuzzResolverHandle(f *testing.F) {
	f.Add([]byte{0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 'a', 4, 't', 'e', 's', 't', 0, 0, 1, 0, 1}, true)
	f.Add([]byte{0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 6, 'd', 'e', 'n', 'i', 'e', 'd', 4, 't', 'e', 's', 't', 0, 0, 1, 0, 1,
		0, 0, 41, 4, 0xd0, 0, 0, 0, 0, 0, 0}, true)
	f.Add([]byte{0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0}, false)
	r, _ := testResolver()
	f.Fuzz(func(t *testing.T, msg []byte, udp bool) {
		if len(msg) > MaxDNSMessage {
			return
		}
		out := r.Handle(context.Background(), msg, udp)
		if out == nil {
			return
		}
		var m dnsmessage.Message
		if err := m.Unpack(out); err != nil {
			t.Fatalf("answer does not parse: %v", err)
		}
		if !m.Header.Response {
			t.Fatal("answer is not a response")
		}
		if udp && len(out) > ednsSize {
			t.Fatalf("UDP answer of %d bytes", len(out))
		}
	})
}

// busyOnce is the host's network, whose first TCP listen finds the UDP
// port it was given in use for TCP.
type busyOnce struct {
	HostNet
	refused int
}

func (b *busyOnce) Listen(network, address string) (net.Listener, error) {
	if b.refused == 0 {
		b.refused++
		return nil, &net.OpError{Op: "listen", Net: network, Err: os.NewSyscallError("bind", syscall.EADDRINUSE)}
	}
	return b.HostNet.Listen(network, address)
}

func TestAnEphemeralResolverTakesAnotherPortWhenTCPHasItsUDPPort(t *testing.T) {
	n := &busyOnce{}
	s, err := ServeDNSIn(n, NewResolver(nil, nil), "127.0.0.1:0", nil)
	require.NoError(t, err)
	defer s.Close()
	assert.Equal(t, 1, n.refused)

	_, err = ServeDNSIn(&busyOnce{}, NewResolver(nil, nil), "127.0.0.1:5353", nil)
	assert.ErrorIs(t, err, syscall.EADDRINUSE, "a fixed port is the port asked for, or an error")
}
