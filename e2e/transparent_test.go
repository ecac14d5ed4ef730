//go:build linux

package e2e

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/dns/dnsmessage"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/e2e/internal/standin/linkrelay"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

// dnsStandin is a DNS server on the host's loopback that oac-shim's
// resolver is pointed at (its /etc/resolv.conf, in a private mount
// namespace). It answers A for its names, nothing else, and records every
// question: the proof that a denied name never became a packet the host
// sent.
type dnsStandin struct {
	addr  string
	mu    sync.Mutex
	asked []string
}

func startDNSStandin(t *testing.T, names map[string][4]byte) *dnsStandin {
	return startDNSAnswering(t, func(name string, _ int) ([4]byte, bool) { a, ok := names[name]; return a, ok })
}

// startDNSAnswering is startDNSStandin answering A questions with answer,
// which also gets how many A questions for the name came before this one.
func startDNSAnswering(t *testing.T, answer func(name string, asked int) ([4]byte, bool)) *dnsStandin {
	t.Helper()
	var pc net.PacketConn
	var err error
	// Port 53 (resolv.conf has no port) on a random 127/8 address, so
	// concurrent runs do not collide.
	for range 20 {
		addr := fmt.Sprintf("127.%d.%d.%d:53", 100+rand.IntN(100), rand.IntN(250)+1, rand.IntN(250)+1)
		if pc, err = net.ListenPacket("udp", addr); err == nil {
			break
		}
	}
	require.NoError(t, err)
	t.Cleanup(func() { pc.Close() })
	d := &dnsStandin{addr: pc.LocalAddr().(*net.UDPAddr).IP.String()}
	askedA := map[string]int{}
	go func() {
		buf := make([]byte, 4096)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			var m dnsmessage.Message
			if m.Unpack(buf[:n]) != nil || len(m.Questions) != 1 {
				continue
			}
			q := m.Questions[0]
			name := strings.TrimSuffix(strings.ToLower(q.Name.String()), ".")
			d.mu.Lock()
			d.asked = append(d.asked, name)
			d.mu.Unlock()
			m.Header.Response, m.Header.RecursionAvailable = true, true
			m.Answers, m.Additionals, m.Authorities = nil, nil, nil
			a, ok := answer(name, askedA[name])
			if q.Type == dnsmessage.TypeA {
				askedA[name]++
			}
			switch {
			case !ok:
				m.Header.RCode = dnsmessage.RCodeNameError
			case q.Type == dnsmessage.TypeA:
				m.Answers = []dnsmessage.Resource{{Header: dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 5},
					Body: &dnsmessage.AResource{A: a}}}
			}
			if out, err := m.Pack(); err == nil {
				_, _ = pc.WriteTo(out, from)
			}
		}
	}()
	return d
}

func (d *dnsStandin) questions() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.asked...)
}

// echoServer answers each line with "echo: LINE".
func echoServer(t *testing.T, addr string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	serveEcho(t, ln)
	return ln
}

// serveEcho answers each line on ln's connections with "echo: LINE" until
// the test ends.
func serveEcho(t *testing.T, ln net.Listener) {
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					fmt.Fprintf(c, "echo: %s\n", sc.Text())
				}
			}()
		}
	}()
}

// hostIPv4 returns a non-loopback IPv4 address of this host, if any.
func hostIPv4() string {
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() && !ipn.IP.IsLinkLocalUnicast() {
			return ipn.IP.String()
		}
	}
	return ""
}

// relayFixture is the TLS Link stand-in for relay.test and the CA bundle
// (the host's plus the test CA) the guest trusts through /etc/ssl.
func relayFixture(t *testing.T) (*linkrelay.Relay, *httptest.Server, string) {
	relay, srv, caPEM := relayServer(t)
	bundle, _ := os.ReadFile("/etc/ssl/certs/ca-certificates.crt")
	return relay, srv, string(bundle) + "\n" + caPEM
}

// relayServer is relayFixture with the test CA alone.
func relayServer(t *testing.T) (*linkrelay.Relay, *httptest.Server, string) {
	t.Helper()
	cert, caPEM := tlsFor(t, "relay.test")
	relay := &linkrelay.Relay{Digest: bootstrap.CredentialDigest(linkCredential)}
	srv := httptest.NewUnstartedServer(relay)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	t.Cleanup(func() { relay.Close(); srv.Close() })
	return relay, srv, caPEM
}

// hostedWithScript is a hosted bootstrap: oac-sandbox-io (the stand-in)
// with a Link URL on relay.test, and a bash script as the daemon.
func hostedWithScript(t *testing.T, script string) string {
	grace := bootstrap.Duration(2 * time.Second)
	return encode(t, &bootstrap.Bootstrap{
		Version: 1, Hostname: "transparent",
		SandboxIO: &bootstrap.SandboxIOSpec{Bootstrap: &bootstrap.SandboxIO{
			Version: 1, LinkURL: "wss://relay.test" + linkrelay.Path, Credential: linkCredential,
			Resource: bootstrap.Resource{TenantID: tenantID, EnvironmentID: environmentID, Kind: "allocation", ID: allocationID, Generation: 1},
		}},
		Daemon:    &bootstrap.Process{Argv: []string{"/bin/bash", "-c", script}},
		StopGrace: &grace,
	})
}

func TestTransparentEgressForProxyUnawareProgramsOnBwrap(t *testing.T) {
	needBwrap(t)
	needCurl(t)
	needUnshare(t)
	relay, relaySrv, caBundle := relayFixture(t)
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "plain hello from %s%s", r.Host, r.URL.Path)
	}))
	defer web.Close()
	raw := echoServer(t, "127.0.0.1:0")
	byName := echoServer(t, "127.0.0.1:0")
	dns := startDNSStandin(t, map[string][4]byte{"real.dns.test": {127, 0, 0, 1}})
	_, hasNode := exec.LookPath("node")
	ip := hostIPv4()
	// The capture is what this test proves: the handed path, not direct
	// mode (which takes a raw connect before the capture sees it).
	args := append(identityArgs(), "--data-plane", "fd",
		"--upstream", "relay.test:443="+relaySrv.Listener.Addr().String(),
		"--upstream", "web.test:80="+web.Listener.Addr().String(),
		"--upstream", fmt.Sprintf("raw.test:7000=127.0.0.1:%d", portOf(raw)),
		// Resolved on the host through the DNS stand-in; loopback needs
		// the CIDR rule.
		"--allow", fmt.Sprintf("real.dns.test:%d", portOf(byName)),
		"--allow", fmt.Sprintf("127.0.0.1/32:%d", portOf(byName)),
	)
	ipScript := `echo "ip: none"`
	if ip != "" {
		lit := echoServer(t, ip+":0")
		args = append(args, "--allow", fmt.Sprintf("%s/32:%d", ip, portOf(lit)))
		ipScript = fmt.Sprintf(`echo "ip: $($E bash -c 'exec 3<>/dev/tcp/%s/%d && echo literal >&3 && head -1 <&3' 2>&1)"`, ip, portOf(lit))
	}
	// Every client runs with an empty environment but PATH: no proxy
	// variable anywhere.
	script := `
E="env -i PATH=/usr/bin:/bin"
echo "resolv: $(grep -c '^nameserver 127.0.0.1$' /etc/resolv.conf)"
echo "curl: $($E curl -sS --noproxy '*' -m 10 http://web.test/page 2>&1)"
echo "curl-tls: $($E curl -sS --noproxy '*' -m 10 https://relay.test/tls 2>&1)"
echo "raw: $($E bash -c 'exec 3<>/dev/tcp/raw.test/7000 && echo hello >&3 && head -1 <&3' 2>&1)"
` + fmt.Sprintf(`echo "dnsname: $($E bash -c 'exec 3<>/dev/tcp/real.dns.test/%d && echo named >&3 && head -1 <&3' 2>&1)"`, portOf(byName)) + `
` + ipScript + `
if command -v node >/dev/null; then
  echo "node: $($E node -e 'fetch("http://web.test/node").then(r => r.text()).then(t => console.log(t), e => console.log("error", e.cause || e))' 2>&1)"
else echo "node: absent"; fi
s=$(date +%s%N); $E timeout 5 getent hosts denied.test >/dev/null; rc=$?
echo "denied-getent: rc=$rc ms=$(( ($(date +%s%N)-s)/1000000 ))"
echo "denied-curl: $($E timeout 5 curl -sS --noproxy '*' -m 5 http://denied.test/ 2>&1)"
echo x > /dev/udp/192.0.2.1/9 2>/dev/null
echo "done"
exec sleep 1000
`
	s := startShim(t, sandboxSpec{
		bootstrap: hostedWithScript(t, script),
		args:      args,
		files: map[string]string{
			"/etc/hosts":                         "127.0.0.1 localhost\n::1 localhost\n",
			"/etc/resolv.conf":                   "nameserver " + dns.addr + "\n",
			"/etc/ssl/certs/ca-certificates.crt": caBundle,
		},
	})
	s.waitFor(func(e api.Event) bool {
		return e.Event == api.KindState && strings.Contains(e.Message, "transparent egress:")
	},
		bootTimeout, "transparent egress started")
	s.waitLog("done", 60*time.Second)

	// oac-sandbox-io, with an empty environment, reached the TLS Link by
	// its name and the relay accepted its credential by digest.
	connected := s.waitLog("sandbox-io: link=connected ", 30*time.Second)
	assert.Contains(t, connected, "status=101")
	assert.Equal(t, "0", s.logLine("sandbox-io: env="), "oac-sandbox-io has an empty environment")
	accepted, refused := relay.Counts()
	assert.GreaterOrEqual(t, accepted, 1)
	assert.Zero(t, refused)
	for _, line := range s.raw {
		assert.NotContains(t, line, linkCredential, "the credential never appears in events")
	}

	assert.Equal(t, "1", s.logLine("resolv: "))
	assert.Equal(t, "plain hello from web.test/page", s.logLine("curl: "))
	assert.Equal(t, "link relay stand-in: /tls", s.logLine("curl-tls: "), "curl verifies relay.test with the system roots")
	assert.Equal(t, "echo: hello", s.logLine("raw: "))
	assert.Equal(t, "echo: named", s.logLine("dnsname: "))
	if ip != "" {
		assert.Equal(t, "echo: literal", s.logLine("ip: "), "an IP literal is captured and allowed by its CIDR rule")
	}
	if hasNode == nil {
		assert.Equal(t, "plain hello from web.test/node", s.logLine("node: "), "Node's fetch ignores proxy variables")
	}

	// A denied name: NXDOMAIN (getent's 2), not a timeout (124), and the
	// reason in the events.
	denied := s.logLine("denied-getent: ")
	t.Logf("denied name: %s", denied)
	assert.True(t, strings.HasPrefix(denied, "rc=2 "), denied)
	assert.Equal(t, "curl: (6) Could not resolve host: denied.test", s.logLine("denied-curl: "))
	ev := s.find(func(e api.Event) bool {
		return e.Event == api.KindEgress && e.Via == "dns" && e.Target == "denied.test"
	})
	require.NotEmpty(t, ev)
	assert.Equal(t, "denied", ev[0].Decision)
	assert.Equal(t, "Denied", ev[0].Code)
	assert.Equal(t, "no rule allows denied.test on any port; nothing was resolved", ev[0].Reason)
	// The host never sent a DNS packet for it; it did for the allowed one.
	asked := dns.questions()
	assert.Contains(t, asked, "real.dns.test")
	for _, q := range asked {
		assert.NotContains(t, q, "denied", "a denied name never leaves as a DNS packet")
	}

	// Every transparent connection is an egress stream like a proxied one.
	for _, target := range []string{"relay.test:443", "web.test:80", "raw.test:7000", fmt.Sprintf("real.dns.test:%d", portOf(byName))} {
		evs := s.find(func(e api.Event) bool {
			return e.Event == api.KindEgress && e.Via == "transparent" && e.Target == target && e.Decision == "allowed"
		})
		assert.NotEmpty(t, evs, "an allowed transparent egress event for %s", target)
	}
	udp := s.waitFor(func(e api.Event) bool { return e.Event == api.KindLog && e.Stream == "oac-guest/egress" }, 10*time.Second, "udp report")
	assert.Contains(t, udp.Line, "udp denied: ")
	assert.Contains(t, udp.Line, "UDP other than DNS is not carried out of the sandbox")

	s.signal(syscall.SIGTERM)
	assert.Equal(t, 0, s.exit(15*time.Second))
}

// TestTransparentEgressOnAVM boots a real VM whose oac-sandbox-io (the
// stand-in, in the initramfs with the test CA as its system roots) reaches
// the TLS Link stand-in by name with an empty environment: the resolver
// and nftables capture in a real kernel (modules from the initramfs).
func TestTransparentEgressOnAVM(t *testing.T) {
	t.Parallel()
	kernel, _ := needVM(t)
	relay, relaySrv, caPEM := relayServer(t)
	dir := t.TempDir()
	ca := dir + "/ca.pem"
	require.NoError(t, os.WriteFile(ca, []byte(caPEM), 0o644))
	img := dir + "/initramfs.img"
	out, err := exec.Command(bins.image, "initramfs", "--agent", bins.guest,
		"--kernel-modules", kernelCache()+"/modules",
		"--file", bins.vmdaemon+":"+vmDaemon,
		"--file", bins.sandboxIO+":/usr/local/bin/oac-sandbox-io",
		"--file", ca+":/etc/ssl/certs/ca-certificates.crt:0644",
		"-o", img).CombinedOutput()
	require.NoError(t, err, "oac-image: %s", out)
	grace := bootstrap.Duration(3 * time.Second)
	boot := encode(t, &bootstrap.Bootstrap{
		Version: 1, Hostname: "vmtransparent",
		SandboxIO: &bootstrap.SandboxIOSpec{Bootstrap: &bootstrap.SandboxIO{
			Version: 1, LinkURL: "wss://relay.test" + linkrelay.Path, Credential: linkCredential,
			Resource: bootstrap.Resource{TenantID: tenantID, EnvironmentID: environmentID, Kind: "allocation", ID: allocationID, Generation: 1},
		}},
		Daemon:    &bootstrap.Process{Argv: []string{vmDaemon}},
		StopGrace: &grace,
	})
	s := startShim(t, sandboxSpec{
		provider: "qemu", name: uniqueName("vmtr"), bootstrap: boot,
		args: []string{"--kernel", kernel, "--initramfs", img, "--boot-timeout", vmBootTimeout.String(),
			"--host-grace", vmHostGrace.String(),
			"--tenant", tenantID, "--environment", environmentID, "--allocation", allocationID,
			"--upstream", "relay.test:443=" + relaySrv.Listener.Addr().String()},
	})
	s.waitFor(func(e api.Event) bool {
		return e.Event == api.KindState && strings.Contains(e.Message, "transparent egress:")
	}, vmBootTimeout, "transparent egress started in the VM")
	connected := s.waitLog("sandbox-io: link=connected ", 60*time.Second)
	assert.Contains(t, connected, "status=101")
	assert.Equal(t, "0", s.logLine("sandbox-io: env="), "oac-sandbox-io has an empty environment")
	accepted, refused := relay.Counts()
	assert.GreaterOrEqual(t, accepted, 1)
	assert.Zero(t, refused)
	assert.NotEmpty(t, s.find(func(e api.Event) bool {
		return e.Event == api.KindEgress && e.Via == "transparent" && e.Target == "relay.test:443" && e.Decision == "allowed"
	}))
	assert.NotEmpty(t, s.find(func(e api.Event) bool {
		return e.Event == api.KindEgress && e.Via == "dns" && e.Target == "relay.test" && e.Decision == "allowed"
	}))
	s.signal(syscall.SIGTERM)
	s.waitState(api.StateStopped, 20*time.Second)
	assert.Equal(t, 0, s.exit(15*time.Second))
}
