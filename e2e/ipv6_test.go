//go:build linux

package e2e

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/protocol"
)

// hostIPv6 returns a global IPv6 address of this host's interfaces (not
// loopback, not link-local), if it has one.
func hostIPv6() (netip.Addr, string) {
	ifs, _ := net.Interfaces()
	for _, i := range ifs {
		addrs, _ := i.Addrs()
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok || ipn.IP.To4() != nil {
				continue
			}
			ip, _ := netip.AddrFromSlice(ipn.IP)
			if !ip.IsLoopback() && !ip.IsLinkLocalUnicast() {
				return ip, i.Name
			}
		}
	}
	return netip.Addr{}, ""
}

// TestTransparentIPv6EgressOnBwrap: a program that prefers IPv6 (curl -6)
// or names an IPv6 literal is brokered like an IPv4 one: the resolver
// answers AAAA with a made-up IPv6 address, the capture carries the
// connection to the broker as the name (the host then dials whichever
// family the name has), an IPv6 literal stays a literal for CIDR rules,
// and every refused IPv6 form (the host's loopback in NAT64 form, a
// link-local address, an address of the host) is refused with an event.
// The link-local zone is lo's index: naming it would take the
// SIOCGIFINDEX ioctl, which the workload filter refuses (interface
// ioctls would show the host's interfaces on a socket of the host's).
func TestTransparentIPv6EgressOnBwrap(t *testing.T) {
	needBwrap(t)
	needCurl(t)
	needUnshare(t)
	publicLink6(t)
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "web over %s: %s", r.Host, r.URL.Path)
	}))
	defer web.Close()
	args := []string{"--data-plane", "fd", // the capture, not direct mode
		// Behind this name the host has IPv4 only: the guest's IPv6
		// connection reaches it anyway.
		"--upstream", "web.test:80=" + web.Listener.Addr().String(),
		// Resolved on the host (its /etc/hosts) to the public IPv6 address.
		"--allow", "public6.test:80",
		"--allow", "[" + publicAddr6 + "]:80",
	}
	h6, h6if := hostIPv6()
	hostScript := `echo "host6: none"`
	if h6.IsValid() {
		// A CIDR rule wider than the host's own address does not open it.
		args = append(args, "--allow", "["+netip.PrefixFrom(h6, 64).Masked().String()+"]:80")
		hostScript = fmt.Sprintf(`echo "host6: $($E curl -sS --noproxy '*' -m 10 'http://[%s]/' 2>&1)"`, h6)
	}
	script := `
E="env -i PATH=/usr/bin:/bin"
echo "aaaa: $($E getent ahostsv6 web.test | head -1)"
echo "curl6: $($E curl -6 -sS --noproxy '*' -m 10 http://web.test/v6 2>&1)"
echo "curl6-public: $($E curl -6 -sS --noproxy '*' -m 10 http://public6.test/name 2>&1)"
echo "curl6-literal: $($E curl -sS --noproxy '*' -m 10 'http://[` + publicAddr6 + `]/literal' 2>&1)"
echo "nat64-loopback: $($E curl -sS --noproxy '*' -m 10 'http://[64:ff9b::7f00:1]/' 2>&1)"
echo "link-local: $($E curl -sS --noproxy '*' -m 10 'http://[fe80::1%251]/' 2>&1)"
echo "denied6: $($E curl -6 -sS --noproxy '*' -m 10 http://denied.test/ 2>&1)"
` + hostScript + `
echo "done"
exec sleep 1000
`
	s := startShim(t, sandboxSpec{
		bootstrap: daemon(script),
		args:      args,
		hosts:     publicHosts + publicAddr6 + " public6.test\n",
	})
	started := s.waitFor(func(e api.Event) bool {
		return e.Event == api.KindState && strings.Contains(e.Message, "transparent egress:")
	}, bootTimeout, "transparent egress started")
	assert.Contains(t, started.Message, "outgoing TCP captured (IPv4 and IPv6)")
	s.waitLog("done", 90*time.Second)

	aaaa := s.logLine("aaaa: ")
	t.Logf("AAAA of web.test in the guest: %s", aaaa)
	if f := strings.Fields(aaaa); assert.NotEmpty(t, f) {
		a, err := netip.ParseAddr(f[0])
		require.NoError(t, err, aaaa)
		assert.True(t, protocol.GuestAddrPrefix6.Contains(a), "a made-up IPv6 address: %s", a)
	}
	assert.Equal(t, "web over web.test: /v6", s.logLine("curl6: "), "IPv6 in the guest, IPv4 behind the name on the host")
	assert.Equal(t, "public web6: /name", s.logLine("curl6-public: "), "the host dials the name's IPv6 address")
	assert.Equal(t, "public web6: /literal", s.logLine("curl6-literal: "), "an IPv6 literal, allowed by its CIDR rule")
	// Refused on port 80: the capture answers with the proxy's 403.
	assert.Contains(t, s.logLine("nat64-loopback: "), "Blocked by the sandbox's egress policy")
	assert.Contains(t, s.logLine("link-local: "), "Blocked by the sandbox's egress policy")
	assert.Equal(t, "curl: (6) Could not resolve host: denied.test", s.logLine("denied6: "))

	has := func(via, target, decision string) api.Event {
		t.Helper()
		evs := s.find(func(e api.Event) bool {
			return e.Event == api.KindEgress && e.Via == via && e.Target == target && e.Decision == decision
		})
		if !assert.NotEmpty(t, evs, "egress event %s %s %s", via, target, decision) {
			return api.Event{}
		}
		return evs[0]
	}
	has("transparent", "web.test:80", "allowed")
	pub := has("transparent", "public6.test:80", "allowed")
	assert.Equal(t, "["+publicAddr6+"]:80", pub.Address)
	has("transparent", "["+publicAddr6+"]:80", "allowed")
	assert.Contains(t, has("transparent", "[64:ff9b::7f00:1]:80", "denied").Reason, "loopback embedded in IPv6")
	assert.Contains(t, has("transparent", "[fe80::1]:80", "denied").Reason, "link-local (fe80::/10)")
	has("dns", "denied.test", "denied")
	if h6.IsValid() {
		assert.Contains(t, s.logLine("host6: "), "Blocked by the sandbox's egress policy")
		assert.Contains(t, has("transparent", "["+h6.String()+"]:80", "denied").Reason, "is an address of this host ("+h6if+")")
	}

	s.signal(syscall.SIGTERM)
	assert.Equal(t, 0, s.exit(15*time.Second))
}
