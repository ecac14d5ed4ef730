package egress

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/protocol"
)

// countingResolver answers from a table and records every name asked.
type countingResolver struct {
	mu    sync.Mutex
	asked []string
	addrs map[string][]netip.Addr
}

func (r *countingResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asked = append(r.asked, host)
	if a, ok := r.addrs[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func TestDecideNameFollowsThePolicyWithoutAPort(t *testing.T) {
	pol, err := ParsePolicy([]string{"api.example.com:443", "*.svc.test:8000-8100", "meta.test:80", "203.0.113.0/24:22", "inside.test:80", "10.1.2.0/24:80"},
		[]string{"llm-gateway:443=127.0.0.1:8443"})
	require.NoError(t, err)
	table := map[string][]netip.Addr{
		"api.example.com": addrs("93.184.216.34"),
		"a.svc.test":      addrs("10.0.0.5", "93.184.216.7"),
		"meta.test":       addrs("169.254.169.254"),
		"inside.test":     addrs("10.1.2.3"),
		"free.test":       addrs("203.0.113.9"),
	}
	for _, c := range []struct {
		name, rule string
		code       protocol.EgressCode
		lookups    int
		reason     string
	}{
		{"API.Example.COM.", "api.example.com:443", 0, 1, ""},
		{"llm-gateway", "upstream llm-gateway:443=127.0.0.1:8443", 0, 0, ""},
		{"a.svc.test", "*.svc.test:8000-8100", 0, 1, ""},
		{"meta.test", "meta.test:80", protocol.EgressDenied, 1, "meta.test resolves to 169.254.169.254, which is cloud metadata"},
		{"inside.test", "10.1.2.0/24:80", 0, 1, ""},
		{"missing.svc.test", "", protocol.EgressNameNotResolved, 1, "missing.svc.test does not resolve on the host"},
		// A CIDR rule allows addresses, not names: a name no name rule
		// covers is never resolved.
		{"free.test", "", protocol.EgressDenied, 0, "no rule allows free.test on any port; nothing was resolved"},
		{"svc.test", "", protocol.EgressDenied, 0, "no rule allows svc.test on any port; nothing was resolved"},
		{"203.0.113.9", "", protocol.EgressInvalidArgument, 0, "is an address, not a name"},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := 0
			d := pol.DecideName(nil, c.name, func(name string) ([]netip.Addr, error) {
				n++
				if a, ok := table[name]; ok {
					return a, nil
				}
				return nil, &net.DNSError{Err: "no such host", Name: name, IsNotFound: true}
			})
			assert.Equal(t, c.lookups, n, "lookups")
			if c.code == 0 {
				require.Nil(t, d.Failure)
				assert.Equal(t, c.rule, d.Rule)
				return
			}
			require.NotNil(t, d.Failure)
			assert.Equal(t, c.code, d.Failure.Code)
			assert.Contains(t, d.Failure.Reason, c.reason)
		})
	}
}

func serveDNS(t *testing.T, b *Broker, rec *recorder, name string) protocol.DNSReply {
	t.Helper()
	guest, hostEnd := net.Pipe()
	defer guest.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.ServeDNS(context.Background(), hostEnd, protocol.StreamHeader{Kind: protocol.KindDNS, Host: name}, rec.emit)
	}()
	r, err := protocol.ReadDNSReply(guest, 10*time.Second)
	require.NoError(t, err)
	<-done // the event is emitted after the answer
	return r
}

func TestServeDNSAnswersAndEmitsWithoutResolvingDeniedNames(t *testing.T) {
	pol, err := ParsePolicy([]string{"api.example.com:443", "192.0.2.0/24:443"}, nil)
	require.NoError(t, err)
	res := &countingResolver{addrs: map[string][]netip.Addr{"api.example.com": addrs("93.184.216.34")}}
	b := New(Config{Policy: pol, Resolver: res})
	rec := &recorder{}
	r := serveDNS(t, b, rec, "api.example.com")
	assert.True(t, r.OK())
	assert.Equal(t, "api.example.com:443", r.Rule)

	r = serveDNS(t, b, rec, "exfil-secret-data.attacker.test")
	assert.Equal(t, protocol.EgressDenied, r.Code)
	assert.Equal(t, "Denied", r.Error)
	assert.Equal(t, protocol.EffectNone, r.Effect)
	assert.Equal(t, []string{"api.example.com"}, res.asked, "a denied name is never resolved on the host")

	rec.mu.Lock()
	defer rec.mu.Unlock()
	require.Len(t, rec.evs, 2)
	assert.Equal(t, api.Event{Event: api.KindEgress, Conn: 1, Via: "dns", Target: "api.example.com", Decision: "allowed", Rule: "api.example.com:443", Message: "dns allowed"}, rec.evs[0])
	e := rec.evs[1]
	assert.Equal(t, "denied", e.Decision)
	assert.Equal(t, "dns", e.Via)
	assert.Equal(t, "exfil-secret-data.attacker.test", e.Target)
	assert.Equal(t, "no rule allows exfil-secret-data.attacker.test on any port; nothing was resolved", e.Reason)
}

func TestServeDNSRefusesABadHeader(t *testing.T) {
	b := New(Config{})
	rec := &recorder{}
	guest, hostEnd := net.Pipe()
	defer guest.Close()
	go b.ServeDNS(context.Background(), hostEnd, protocol.StreamHeader{Kind: protocol.KindDNS, Host: "a b"}, rec.emit)
	r, err := protocol.ReadDNSReply(guest, 10*time.Second)
	require.NoError(t, err)
	assert.Equal(t, protocol.EgressInvalidArgument, r.Code)
}
