//go:build linux

package e2e

// Direct mode (--data-plane direct, docs/egress.md "Direct mode") against
// the attacks that broke it on 9b648ae, on real guests:
//
//   - a hostile workload (internal/directattack as the daemon, uid 1000)
//     on every row that runs direct mode here: bwrap as root, runc, crun;
//   - hostile guest root (internal/badguest --mode rootdirect as the
//     agent) asking the host for its sockets on the fd channel: where
//     guest root holds capabilities in the host's user namespace (docker),
//     where direct mode was not asked for, and where it is offered (bwrap
//     as root, whose user namespace gives guest root nothing of the
//     host's).
//
// What reached the host is seen from the host: a packet socket on the
// host's lo counts every TCP segment to the host services the attacks aim
// at, the upstreams record every connection the host made for the
// sandbox, and /proc/net/tcp{,6} shows what the host's kernel holds.

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/api"
)

// directBins are this file's binaries, built by TestMain with the others
// (directBuilds).
var directBins struct {
	// attack is the hostile daemon; badRoot the agent that plays
	// hostile guest root.
	attack, badRoot string
}

func directBuilds(dir string) []struct{ out, pkg, ldflags string } {
	directBins.attack = dir + "/directattack"
	directBins.badRoot = dir + "/badguest-rootdirect"
	return []struct{ out, pkg, ldflags string }{
		{directBins.attack, "./internal/directattack", ""},
		{directBins.badRoot, "./internal/badguest", "-X main.defaultMode=rootdirect"},
	}
}

// directForgetConnects is how many direct connects the forget attack makes
// between the first host socket and the attack on it (issue class 2 was
// 65,600: OAC_E2E_DIRECT_FORGET=65600 runs it, for minutes).
func directForgetConnects() int {
	if n, err := strconv.Atoi(os.Getenv("OAC_E2E_DIRECT_FORGET")); err == nil && n > 0 {
		return n
	}
	return 3000
}

const (
	directHold  = 600  // host sockets the workload holds at once
	directCycle = 1000 // then opens and closes
	// directMaxStreams is the sandbox's --egress-max-streams: far below
	// what the workload holds.
	directMaxStreams = 16
)

// directRows are the rows of TestConformance that run direct mode here.
var directRows = []confRow{
	{"bwrap (root)", rowBwrap},
	{"oci runc (default root)", rowOCI("runc")},
	{"oci crun (oac-image rootfs)", rowOCI("crun")},
}

// The workload's five ways, on each row. One sandbox per row: the daemon
// makes every attack in turn (each on sockets of its own), then holds
// everything until it is stopped; each subtest checks one class.
func TestDirectModeHoldsAgainstAHostileWorkload(t *testing.T) {
	for _, row := range directRows {
		t.Run(row.name, func(t *testing.T) {
			t.Parallel()
			hostileWorkloadRow(t, row)
		})
	}
}

func hostileWorkloadRow(t *testing.T, row confRow) {
	start := time.Now()
	// Upstreams the rules allow (the host's sockets for the workload
	// connect to them) and services on the host's loopback no rule allows
	// (what the attacks aim the host's sockets at).
	up, churn, sink := startDirectUpstream(t, "hold"), startDirectUpstream(t, "close"), startDirectUpstream(t, "sink")
	raceSvc, forgetSvc := startDirectUpstream(t, "service"), startDirectUpstream(t, "service")
	lo := watchHostLo(t, raceSvc.port, forgetSvc.port)
	f := &confFixtures{
		upstream: []string{"--upstream", "up.test:80=" + up.addr, "--upstream", "churn.test:80=" + churn.addr, "--upstream", "sink.test:80=" + sink.addr},
		// The hostile daemon is installed where the stand-in daemon is
		// (the crun row's image has a file there to bind it over).
		private: privateBins{shim: bins.shim, guest: bins.guest, sandboxIO: bins.sandboxIO, daemon: directBins.attack},
	}
	env := row.setup(t, f)
	if env.bootTimeout == 0 {
		env.bootTimeout = bootTimeout
	}
	spec := env.spec
	spec.name = uniqueName("dhostile")
	spec.files = nil // no TLS here: the host's CA bundle as it is
	spec.args = append(withoutSandboxIO(spec.args), "--data-plane", "direct", "--egress-max-streams", strconv.Itoa(directMaxStreams))
	forget := directForgetConnects()
	spec.bootstrap = daemonArgv(daemonBin, "--up", "up.test:80", "--churn", "churn.test:80", "--sink", "sink.test:80",
		"--race-service", raceSvc.addr, "--forget-service", forgetSvc.addr, "--race-for", "3s",
		"--forget", strconv.Itoa(forget), "--hold", strconv.Itoa(directHold), "--cycle", strconv.Itoa(directCycle))
	s := startShim(t, spec)
	s.waitState(api.StateReady, env.bootTimeout)
	on := directModeOn(t, s)
	share, shared := portShare(on)
	r := attackResults(t, s, 60*time.Second+time.Duration(forget)*2*time.Millisecond)
	segs, drops := lo.stop()
	held := sandboxHostSockets(t, s)
	var listeners []hostSock
	for _, h := range held {
		if h.state == tcpListen {
			listeners = append(listeners, h)
		}
	}
	t.Logf("lo: %d segments to the race service :%d, %d to the forget service :%d, %d dropped by the watch", segs[raceSvc.port], raceSvc.port, segs[forgetSvc.port], forgetSvc.port, drops)
	require.Zero(t, drops, "the watch on lo saw every segment")

	t.Run("the descriptor race takes a host socket nowhere", func(t *testing.T) {
		require.Equal(t, "host", r["race-host-socket"], "the workload got a host socket")
		calls, _ := strconv.Atoi(r["race-calls"])
		assert.GreaterOrEqual(t, calls, 1000, "thousands of calls raced the swaps: %s", r["race-outcomes"])
		assert.Zero(t, segs[raceSvc.port], "TCP segments on the host's lo to the host service")
		assert.Zero(t, raceSvc.accepted.Load(), "connections the host service accepted")
		states := r["race-host-states"]
		t.Logf("the host socket's states while raced (1 established, 7 closed): %s; at the end %s, peer %s", states, r["race-host-state"], r["race-host-peer"])
		assert.NotRegexp(t, `(^|,)(2|10)\*`, states, "the host socket never connects elsewhere (SYN_SENT) nor listens")
		// A disconnect may reach it: the supervisor lets the kernel make
		// a UDP socket's connect, and a swap after its look puts the
		// host socket there; AF_UNSPEC passes Landlock and the guard's
		// connect hook (what would connect it again does not).
		assert.Contains(t, []string{up.addr, "ENOTCONN"}, r["race-host-peer"], "its peer is its upstream, or none")
		assert.Equal(t, "0", r["race-host-listening"], "the host socket does not listen")
		require.GreaterOrEqual(t, len(held), directHold, "the host's sockets the sandbox's processes hold are found")
		assert.Empty(t, listeners, "of the %d TCP sockets of the host's namespace the sandbox holds, those listening", len(held))
	})

	t.Run(fmt.Sprintf("the first host socket stays locked after %d more direct connects", forget), func(t *testing.T) {
		require.Equal(t, "host", r["forget-first-socket"])
		assert.Equal(t, fmt.Sprintf("%d/%d", forget, forget), r["forget-connects"], "every direct connect made (%s, errors %s)",
			r["forget-connects-took"], r["forget-connect-errors"])
		for _, k := range []string{"disconnect", "connect", "bind", "listen"} {
			assert.Equal(t, "EPERM", r["forget-first-"+k], "%s on the first host socket", k)
		}
		assert.Zero(t, segs[forgetSvc.port], "TCP segments on the host's lo to the host service")
		assert.Zero(t, forgetSvc.accepted.Load())
		assert.Equal(t, up.addr, r["forget-first-peer"], "still connected to its upstream")
	})

	t.Run("a host socket shows the workload nothing of the host's network", func(t *testing.T) {
		require.Equal(t, "host", r["reach-socket"])
		for _, k := range []string{"SIOCGIFCONF", "SIOCGIFHWADDR", "SIOCGSKNS", "SO_BINDTODEVICE", "IP_OPTIONS"} {
			assert.Equal(t, "EPERM", r["reach-"+k], k)
		}
		queued, _ := strconv.Atoi(r["sink-queued"])
		assert.Positive(t, queued, "a host socket whose upstream reads nothing holds unsent bytes (it closes into FIN-WAIT-1)")
	})

	t.Run(fmt.Sprintf("%d held and %d cycled host sockets take only the sandbox's port share", directHold, directCycle), func(t *testing.T) {
		assert.Equal(t, strconv.Itoa(directHold), r["hold-open"], "held at once with --egress-max-streams %d (errors %s)", directMaxStreams, r["hold-errors"])
		assert.GreaterOrEqual(t, up.peak.Load(), int64(directHold), "the upstream saw them open at once")
		cycled, _ := strconv.Atoi(r["cycle-ok"])
		t.Logf("cycle: %d of %d opened and closed in %s (errors %s)", cycled, directCycle, r["cycle-took"], r["cycle-errors"])
		assert.Positive(t, cycled)
		distinct := map[int]bool{}
		for _, u := range []*directUpstream{up, churn, sink} {
			for _, p := range u.peerPorts() {
				distinct[p] = true
			}
		}
		var ports []int
		for p := range distinct {
			ports = append(ports, p)
		}
		sort.Ints(ports)
		require.True(t, shared, "the starting event names the sandbox's port share (%q)", on)
		var outside []int
		for _, p := range ports {
			if !share.has(uint16(p)) {
				outside = append(outside, p)
			}
		}
		t.Logf("%d connections from %d host ports, share %s (%d ports)", up.accepted.Load()+churn.accepted.Load()+sink.accepted.Load(), len(ports), share, share.size())
		assert.Empty(t, outside, "host ports of the sandbox's direct sockets outside its share %s", share)
		assert.LessOrEqual(t, len(ports), share.size())
	})

	s.signal(syscall.SIGTERM)
	s.waitState(api.StateStopped, 30*time.Second)
	assert.Equal(t, 0, s.exit(30*time.Second))

	t.Run("after stop no host socket of the sandbox is left", func(t *testing.T) {
		upstreams := map[uint16]string{up.port: "up", churn.port: "churn", sink.port: "sink", raceSvc.port: "race service", forgetSvc.port: "forget service"}
		left := hostTCP(t, func(h hostSock) bool { _, ok := upstreams[h.remote.Port()]; return ok })
		counts := map[string]int{}
		for _, h := range left {
			counts[upstreams[h.remote.Port()]+" "+tcpStateName(h.state)]++
		}
		assert.Empty(t, counts, "host sockets of the sandbox left after it stopped (by peer and state)")
	})
	t.Logf("row took %s", time.Since(start).Round(time.Millisecond))
}

// Guest root (badguest as the agent) asking the host for its sockets.
func TestDirectModeHoldsAgainstAHostileGuestRoot(t *testing.T) {
	t.Run("docker: where guest root holds host capabilities a direct Connect fails the sandbox as hostile", func(t *testing.T) {
		t.Parallel()
		g := newRootAttack(t, "198.51.100.71")
		f := &confFixtures{
			upstream: g.upstreams(),
			private:  privateBins{shim: bins.shim, guest: directBins.badRoot, sandboxIO: bins.sandboxIO, daemon: bins.daemon},
		}
		env := rowDocker(t, f)
		spec := env.spec
		spec.name = uniqueName("droot")
		spec.agent = directBins.badRoot
		spec.args = append(withoutSandboxIO(spec.args), "--data-plane", "direct")
		spec.bootstrap = g.bootstrap()
		c := &confCase{env: env, ifaces: hostInterfaces()}
		s := startShim(t, spec)
		s.waitState(api.StateReady, bootTimeout)
		off := s.find(func(e api.Event) bool {
			return e.Event == api.KindState && strings.Contains(e.Message, "direct mode unavailable")
		})
		if assert.NotEmpty(t, off, "a starting event says direct mode is unavailable under docker") {
			t.Logf("%s", off[0].Message)
		}
		g.failsAsHostile(t, s)
		c.nothingLeft(t, spec.name, nil)
	})

	t.Run("bwrap (root) with --data-plane fd: a direct Connect fails the sandbox as hostile", func(t *testing.T) {
		t.Parallel()
		needBwrap(t)
		g := newRootAttack(t, "198.51.100.72")
		s := startShim(t, sandboxSpec{agent: directBins.badRoot, bootstrap: g.bootstrap(),
			args: append(g.upstreams(), "--data-plane", "fd")})
		s.waitState(api.StateReady, bootTimeout)
		g.failsAsHostile(t, s)
	})

	t.Run("bwrap (root): a host socket in guest root's hands reaches nothing of the host", func(t *testing.T) {
		t.Parallel()
		needBwrap(t)
		g := newRootAttack(t, "198.51.100.73")
		s := startShim(t, sandboxSpec{agent: directBins.badRoot, bootstrap: g.bootstrap(),
			args: append(g.upstreams(), "--data-plane", "direct")})
		s.waitState(api.StateReady, bootTimeout)
		r := attackResults(t, s, 30*time.Second)
		segs, drops := g.lo.stop()
		on := directModeSaid(s)
		t.Logf("direct mode: %s", on)
		require.Equal(t, "handed", r["direct"], "guest root got a host socket (direct mode offered: %s)", r["offered"])
		require.Zero(t, drops, "the watch on lo saw every segment")
		t.Logf("observed, not refused (the documented residual): SIOCGIFCONF %s; disconnect %s, listen %s, local address after %s",
			r["root-SIOCGIFCONF"], r["root-disconnect"], r["root-listen"], r["root-local-after"])
		for _, k := range []string{"SIOCGSKNS", "SIOCADDRT", "TCP_REPAIR", "SO_MARK", "SO_BINDTODEVICE", "IP_OPTIONS", "connect-service", "bind"} {
			assert.Equal(t, "EPERM", r["root-"+k], k)
		}
		assert.Zero(t, segs[g.svc.port], "TCP segments on the host's lo to the host service")
		assert.Zero(t, g.svc.accepted.Load(), "connections the host service accepted")
		assert.False(t, hostRoute(t, g.route), "a route to %s in the host's table", g.route)
		if share, ok := portShare(on); assert.True(t, ok, "the starting event names the port share (%q)", on) {
			local, err := netip.ParseAddrPort(r["direct-local"])
			if assert.NoError(t, err) {
				assert.True(t, share.has(local.Port()), "the handed socket's host port %d is in the share %s", local.Port(), share)
			}
		}
		if l, err := netip.ParseAddrPort(r["root-local-after"]); err == nil && l.Port() != 0 {
			t.Logf("after guest root's listen, host sockets listening on port %d: %d", l.Port(),
				len(hostTCP(t, func(h hostSock) bool { return h.state == tcpListen && h.local.Port() == l.Port() })))
		}
		s.signal(syscall.SIGTERM)
		s.waitState(api.StateStopped, 30*time.Second)
		assert.Equal(t, 0, s.exit(30*time.Second))
		assert.Empty(t, hostTCP(t, func(h hostSock) bool { return h.remote.Port() == g.up.port || h.remote.Port() == g.svc.port }),
			"host sockets to the upstream or the host service left after stop")
	})
}

// rootAttack is one hostile guest root's targets: an allowed upstream, a
// host service no rule allows, a route it tries to add.
type rootAttack struct {
	up, svc *directUpstream
	lo      *loWatch
	route   netip.Addr
}

func newRootAttack(t *testing.T, route string) *rootAttack {
	g := &rootAttack{up: startDirectUpstream(t, "hold"), svc: startDirectUpstream(t, "service"), route: netip.MustParseAddr(route)}
	g.lo = watchHostLo(t, g.svc.port)
	t.Cleanup(func() {
		if hostRoute(t, g.route) {
			_ = exec.Command("ip", "route", "del", g.route.String()+"/32", "dev", "lo").Run()
		}
	})
	return g
}

func (g *rootAttack) upstreams() []string { return []string{"--upstream", "up.test:80=" + g.up.addr} }

func (g *rootAttack) bootstrap() string {
	argv, _ := json.Marshal([]string{"/bin/true", "upstream=up.test:80", "service=" + g.svc.addr, "route=" + g.route.String()})
	return `{"version":1,"stop_grace":"100ms","daemon":{"argv":` + string(argv) + `}}`
}

// failsAsHostile: the sandbox fails as a hostile guest's, and the host
// made no socket for the request, let alone handed one.
func (g *rootAttack) failsAsHostile(t *testing.T, s *shim) {
	t.Helper()
	// The sandbox fails, or guest root got a host socket (and attacks
	// with it: what it did is in its lines).
	end := s.waitFor(func(e api.Event) bool {
		return e.Event == api.KindState && e.State == api.StateFailed || e.Event == api.KindLog && e.Line == "attack: direct=handed"
	}, 30*time.Second, "the sandbox's failure or a host socket in guest root's hands")
	if end.Event == api.KindState {
		t.Logf("failed: %s", end.Message)
		s.exitFailed(api.CodeHostileGuest, stopBound(hostileGrace)+10*time.Second)
	} else {
		s.waitLog("attack: done=", 30*time.Second)
		assert.Fail(t, "the sandbox did not fail: guest root got a host socket")
		s.signal(syscall.SIGTERM)
		s.exit(30 * time.Second)
	}
	segs, _ := g.lo.stop()
	assert.Zero(t, g.up.accepted.Load(), "connections the host made to the upstream for guest root")
	for _, e := range s.find(func(e api.Event) bool { return e.Event == api.KindLog && strings.HasPrefix(e.Line, "attack: ") }) {
		t.Logf("%s", e.Line)
		assert.NotEqual(t, "attack: direct=handed", e.Line)
	}
	assert.Empty(t, s.find(func(e api.Event) bool {
		return e.Event == api.KindEgress && e.Via == "direct" && e.Decision == "allowed"
	}), "no direct connection allowed")
	assert.Zero(t, segs[g.svc.port], "TCP segments on the host's lo to the host service")
	assert.False(t, hostRoute(t, g.route), "a route to %s in the host's table", g.route)
}

// withoutSandboxIO is a row's arguments without oac-sandbox-io (these
// sandboxes are not hosted: no Link, no private file).
func withoutSandboxIO(args []string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		if args[i] == "--sandbox-io" {
			i++
			continue
		}
		out = append(out, args[i])
	}
	return out
}

// daemonArgv is a bootstrap whose daemon is argv.
func daemonArgv(argv ...string) string {
	b, _ := json.Marshal(argv)
	return `{"version":1,"hostname":"direct","stop_grace":"2s","daemon":{"argv":` + string(b) + `}}`
}

// directModeSaid returns what the starting events say of direct mode.
func directModeSaid(s *shim) string {
	var said []string
	for _, e := range s.find(func(e api.Event) bool { return e.Event == api.KindState && strings.Contains(e.Message, "direct mode") }) {
		said = append(said, e.Message)
	}
	return strings.Join(said, "\n")
}

// directModeOn returns what the starting events say of direct mode (the
// host's and the guest's agent's), and fails when one says it is
// unavailable.
func directModeOn(t *testing.T, s *shim) string {
	t.Helper()
	var said []string
	for _, e := range s.find(func(e api.Event) bool { return e.Event == api.KindState && strings.Contains(e.Message, "direct mode") }) {
		if strings.Contains(e.Message, "direct mode unavailable") {
			t.Fatalf("direct mode is off here: %s", e.Message)
		}
		t.Logf("%s", e.Message)
		said = append(said, e.Message)
	}
	require.NotEmpty(t, said, "a starting event says direct mode is on")
	return strings.Join(said, "\n")
}

// portRange is the sandbox's share of the host's ephemeral ports.
type portRange struct{ lo, hi uint16 }

func (p portRange) has(port uint16) bool { return p.lo <= port && port <= p.hi }
func (p portRange) size() int            { return int(p.hi) - int(p.lo) + 1 }
func (p portRange) String() string       { return fmt.Sprintf("%d-%d", p.lo, p.hi) }

var shareRE = regexp.MustCompile(`host ports (\d+)-(\d+)`)

// portShare reads "host ports LO-HI" from the direct mode event.
func portShare(msg string) (portRange, bool) {
	m := shareRE.FindStringSubmatch(msg)
	if m == nil {
		return portRange{}, false
	}
	lo, _ := strconv.Atoi(m[1])
	hi, _ := strconv.Atoi(m[2])
	if lo <= 0 || hi < lo || hi > 65535 {
		return portRange{}, false
	}
	return portRange{uint16(lo), uint16(hi)}, true
}

// attackResults waits for "attack: done=" and returns every "attack:
// key=value" line.
func attackResults(t *testing.T, s *shim, timeout time.Duration) map[string]string {
	t.Helper()
	s.waitLog("attack: done=", timeout)
	res := map[string]string{}
	for _, e := range s.find(func(e api.Event) bool { return e.Event == api.KindLog && strings.HasPrefix(e.Line, "attack: ") }) {
		k, v, _ := strings.Cut(strings.TrimPrefix(e.Line, "attack: "), "=")
		res[k] = v
	}
	keys := make([]string, 0, len(res))
	for k := range res {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		t.Logf("attack: %s=%s", k, res[k])
	}
	return res
}

// directUpstream is a TCP server on the host's loopback: "hold" keeps a
// connection until the client closes it, "close" closes it at once,
// "sink" reads nothing, "service" (what no rule allows) accepts and
// closes. It records the client port of each connection: for the
// upstreams, the host port of a sandbox's direct socket.
type directUpstream struct {
	addr     string
	port     uint16
	accepted atomic.Int64
	open     atomic.Int64
	peak     atomic.Int64
	mu       sync.Mutex
	peers    map[int]bool
	conns    []net.Conn
}

func startDirectUpstream(t *testing.T, mode string) *directUpstream {
	t.Helper()
	// A port no socket of the host names as its peer yet (a server's
	// TIME_WAIT from an earlier test may name a port since reused):
	// whatever names it later connected to this server.
	var ln net.Listener
	for range 20 {
		l, err := net.Listen("tcp4", "127.0.0.1:0")
		require.NoError(t, err)
		port := uint16(l.Addr().(*net.TCPAddr).Port)
		if len(hostTCP(t, func(h hostSock) bool { return h.remote.Port() == port })) == 0 {
			ln = l
			break
		}
		l.Close()
	}
	require.NotNil(t, ln, "a listening port no socket of the host names as its peer")
	u := &directUpstream{addr: ln.Addr().String(), port: uint16(ln.Addr().(*net.TCPAddr).Port), peers: map[int]bool{}}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.accepted.Add(1)
			u.mu.Lock()
			u.peers[c.RemoteAddr().(*net.TCPAddr).Port] = true
			u.conns = append(u.conns, c)
			u.mu.Unlock()
			if n := u.open.Add(1); n > u.peak.Load() {
				u.peak.Store(n) // one accepting goroutine: no race
			}
			switch mode {
			case "hold":
				go func() {
					defer u.open.Add(-1)
					_, _ = io.Copy(io.Discard, c)
					c.Close()
				}()
			case "sink": // closed at the end of the test
			default:
				u.open.Add(-1)
				c.Close()
			}
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
		u.mu.Lock()
		for _, c := range u.conns {
			c.Close()
		}
		u.mu.Unlock()
	})
	return u
}

func (u *directUpstream) peerPorts() []int {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make([]int, 0, len(u.peers))
	for p := range u.peers {
		out = append(out, p)
	}
	sort.Ints(out)
	return out
}

// loWatch counts the TCP segments on the host's lo to some ports: what a
// host socket sends to reach a host service, SYN or data, whether or not
// a handshake completes. A socket filter keeps only those, so the
// thousands of other connections of the test do not fill its buffer.
type loWatch struct {
	fd     int
	counts map[uint16]*atomic.Int64
	quit   atomic.Bool
	done   chan struct{}
	once   sync.Once
	drops  uint32
}

func watchHostLo(t *testing.T, ports ...uint16) *loWatch {
	t.Helper()
	need(t, os.Geteuid() == 0, "a packet socket on the host's lo needs root: run the e2e tests as root")
	// Protocol 0 receives nothing until the filter is in place and the
	// bind names IPv4.
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err, "a packet socket")
	n := len(ports)
	ins := []bpf.Instruction{
		bpf.LoadAbsolute{Off: 9, Size: 1}, // the IP protocol
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.IPPROTO_TCP, SkipFalse: uint8(n + 2)},
		bpf.LoadMemShift{Off: 0},          // X = the IP header's length
		bpf.LoadIndirect{Off: 2, Size: 2}, // the TCP destination port
	}
	for i, p := range ports {
		ins = append(ins, bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(p), SkipTrue: uint8(n - i)})
	}
	ins = append(ins, bpf.RetConstant{Val: 0}, bpf.RetConstant{Val: 0xffff})
	raw, err := bpf.Assemble(ins)
	require.NoError(t, err)
	filter := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		filter[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	require.NoError(t, unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}))
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20)
	lo, err := net.InterfaceByName("lo")
	require.NoError(t, err)
	require.NoError(t, unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons16(unix.ETH_P_IP), Ifindex: lo.Index}))
	require.NoError(t, unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 50_000}))
	w := &loWatch{fd: fd, counts: map[uint16]*atomic.Int64{}, done: make(chan struct{})}
	for _, p := range ports {
		w.counts[p] = &atomic.Int64{}
	}
	go func() {
		defer close(w.done)
		buf := make([]byte, 128)
		count := func(n int) {
			if n < 24 {
				return
			}
			ihl := int(buf[0]&0xf) * 4
			if buf[9] != unix.IPPROTO_TCP || n < ihl+4 {
				return
			}
			if c, ok := w.counts[binary.BigEndian.Uint16(buf[ihl+2:])]; ok {
				c.Add(1)
			}
		}
		for !w.quit.Load() {
			if n, _, err := unix.Recvfrom(fd, buf, unix.MSG_TRUNC); err == nil {
				count(n)
			}
		}
		// Every segment sent so far is queued (lo delivers as it sends).
		for {
			n, _, err := unix.Recvfrom(fd, buf, unix.MSG_TRUNC|unix.MSG_DONTWAIT)
			if err != nil {
				return
			}
			count(n)
		}
	}()
	t.Cleanup(func() { w.stop() })
	return w
}

// stop ends the watch and returns the segments counted per port, and how
// many the kernel dropped for want of room.
func (w *loWatch) stop() (map[uint16]int64, uint32) {
	w.once.Do(func() {
		w.quit.Store(true)
		<-w.done
		if st, err := unix.GetsockoptTpacketStats(w.fd, unix.SOL_PACKET, unix.PACKET_STATISTICS); err == nil {
			w.drops = st.Drops
		}
		unix.Close(w.fd)
	})
	out := map[uint16]int64{}
	for p, c := range w.counts {
		out[p] = c.Load()
	}
	return out, w.drops
}

func htons16(v uint16) uint16 { return v<<8 | v>>8 }

// hostSock is one socket of /proc/net/tcp{,6}: the host's TCP sockets.
type hostSock struct {
	local, remote netip.AddrPort
	state         int
	inode         string
}

// TCP states as /proc/net/tcp numbers them.
const (
	tcpListen = 0x0A
)

func tcpStateName(s int) string {
	names := map[int]string{1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1", 5: "FIN_WAIT2", 6: "TIME_WAIT",
		7: "CLOSE", 8: "CLOSE_WAIT", 9: "LAST_ACK", 10: "LISTEN", 11: "CLOSING"}
	if n, ok := names[s]; ok {
		return n
	}
	return strconv.Itoa(s)
}

// hostTCP returns the host's TCP sockets that match.
func hostTCP(t *testing.T, match func(hostSock) bool) []hostSock {
	t.Helper()
	var out []hostSock
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(file)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		require.NoError(t, err)
		sc := bufio.NewScanner(f)
		sc.Scan() // the header
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 {
				continue
			}
			l, err1 := procAddr(fields[1])
			r, err2 := procAddr(fields[2])
			st, err3 := strconv.ParseInt(fields[3], 16, 32)
			if err1 != nil || err2 != nil || err3 != nil {
				continue
			}
			if h := (hostSock{l, r, int(st), fields[9]}); match(h) {
				out = append(out, h)
			}
		}
		f.Close()
	}
	return out
}

// sandboxHostSockets returns the TCP sockets of the host's namespace
// that a process of the sandbox (below the shim) holds.
func sandboxHostSockets(t *testing.T, s *shim) []hostSock {
	t.Helper()
	held := map[string]bool{}
	for _, pid := range descendants(s.cmd.Process.Pid) {
		ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		for _, e := range ents {
			if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name())); err == nil && strings.HasPrefix(l, "socket:[") {
				held[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
			}
		}
	}
	return hostTCP(t, func(h hostSock) bool { return held[h.inode] })
}

// procAddr parses "0100007F:1F90" (IPv4) or 32 hex digits and a port
// (IPv6): 32-bit words in the kernel's byte order.
func procAddr(s string) (netip.AddrPort, error) {
	a, p, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, errors.New("no port")
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return netip.AddrPort{}, err
	}
	b, err := hex.DecodeString(a)
	if err != nil || (len(b) != 4 && len(b) != 16) {
		return netip.AddrPort{}, errors.New("bad address")
	}
	for i := 0; i < len(b); i += 4 {
		binary.BigEndian.PutUint32(b[i:], binary.NativeEndian.Uint32(b[i:]))
	}
	addr, _ := netip.AddrFromSlice(b)
	return netip.AddrPortFrom(addr.Unmap(), uint16(port)), nil
}

// hostRoute reports whether the host's main table has a route to dst.
func hostRoute(t *testing.T, dst netip.Addr) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/net/route")
	require.NoError(t, err)
	a := dst.As4()
	want := strings.ToUpper(hex.EncodeToString([]byte{a[3], a[2], a[1], a[0]}))
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 { // big-endian host
		want = strings.ToUpper(hex.EncodeToString(a[:]))
	}
	for _, line := range strings.Split(string(b), "\n")[1:] {
		if f := strings.Fields(line); len(f) > 1 && f[1] == want {
			return true
		}
	}
	return false
}
