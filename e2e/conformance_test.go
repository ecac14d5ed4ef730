//go:build linux

package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/e2e/internal/standin/linkrelay"
	"github.com/oac/sandbox-agent/e2e/internal/standin/selfreport"
	"github.com/oac/sandbox-agent/internal/kcluster"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

// TestConformance is one table: each row is a provider that runs on these
// machines, each column a promise every provider keeps. A row boots the
// same hosted bootstrap (identity, sandbox_io with a wss Link on the relay
// stand-in, the daemon stand-in with credentials, health and egress
// probes) and each promise checks what it promises against it. With
// CI=true every row runs and a provider that cannot run fails its row.
// The table is printed (and written to $OAC_CONFORMANCE_TABLE when set).
//
// A column is one function: append a confPromise to confPromises (c.live
// returns the row's running sandbox, booting it if needed; c.start boots
// one of the promise's own). A row is one function too: append a confRow
// whose setup returns how to run that provider.
func TestConformance(t *testing.T) {
	fix := newConfFixtures(t)
	res := newConfResults()
	t.Run("rows", func(t *testing.T) {
		for _, row := range confRows {
			t.Run(row.name, func(t *testing.T) {
				t.Parallel()
				runConfRow(t, row, fix, res)
			})
		}
	})
	writeVMRowResults(t, res) // inside the AppArmor VM only
	table := res.table()
	table += "\ncrash points (each command killed at each point it passes; the next command on the name):\n\n" + res.crashTable()
	fmt.Printf("\nconformance (%s):\n%s\n", time.Now().UTC().Format("2006-01-02"), table)
	if p := os.Getenv("OAC_CONFORMANCE_TABLE"); p != "" {
		require.NoError(t, os.WriteFile(p, []byte(table), 0o644))
	}
}

// confPromise is one column.
type confPromise struct {
	name  string
	check func(t *testing.T, c *confCase)
}

// confPromises are the columns, in order. Promises that need the row's
// running sandbox come before the one that stops it.
var confPromises = []confPromise{
	{"hosted bootstrap ready", promiseHostedReady},
	{"private file, ids, no caps, health", promiseContract},
	{"egress: proxies and capture", promiseEgress},
	{"egress: a refused raw connection fails and says why", promiseRefusalExplained},
	{"data plane: bytes both ways, events, pair ends", promiseDataPlane},
	{"workload sees only lo", promiseOnlyLoopback},
	{"no platform door", promiseNoPlatformDoor},
	{"SIGTERM: stopped, nothing left", promiseStopLeavesNothing},
	{"kill -9 of the shim, restart: nothing left", promiseKillLeavesNothing},
	{"kept: workspace and /usr/local survive stop/start", promiseKeptSurvives},
	{"reset: both gone, sandbox kept", promiseKeptReset},
	{"destroy: nothing left on host", promiseKeptDestroy},
	{"warm, then claimed: every promise holds", promiseWarmThenClaimed},
	// Last: it boots a sandbox of its own, and what a row's provider
	// leaves is checked with no other sandbox of the row running.
	{"direct mode: on, or says why and carries the same", promiseDirect},
}

// confRow is one provider.
type confRow struct {
	name string
	// setup checks what the provider needs (need: fails with CI=true) and
	// says how to run it.
	setup func(t *testing.T, f *confFixtures) confEnv
}

// confRows are the rows, in order.
var confRows = []confRow{
	{"bwrap (root)", rowBwrap},
	{"bwrap (unprivileged user)", rowBwrapRootless},
	{"oci runc (default root)", rowOCI("runc")},
	{"oci crun (oac-image rootfs)", rowOCI("crun")},
	{"docker (real engine)", rowDocker},
	{appArmorRow, rowDockerAppArmor},
	{"qemu (TCG)", rowQemu},
	{"wsl (fake wsl.exe)", rowWSL},
	{"kubernetes (real single-node cluster)", rowKubernetes},
	{"kubernetes via agent-sandbox (warm pool)", rowKubernetesAgentSandbox},
}

// confEnv is how a row runs a sandbox.
type confEnv struct {
	spec sandboxSpec // provider, args, env, user, shim, files; name and bootstrap are set per sandbox
	// bootTimeout bounds boot to ready (default bootTimeout).
	bootTimeout time.Duration
	// stateDir is the sandbox's state directory on the host.
	stateDir func(name string) string
	// leftovers lists what the provider itself left of a sandbox that
	// ended (a container, a cgroup, an image layer, a distribution), on
	// top of the checks every row gets: processes, mounts, the state
	// directory, network interfaces.
	leftovers func(name string) []string
	// peer, when set, is an address the guest's own network reaches that
	// the workload must not (a WSL distribution's interface).
	peer *confPeer
	// carrier is what carries the row's egress connections beside the
	// session (carrierFD, carrierHand, carrierDial), or carrierSession.
	carrier string
	// cluster: the row runs on the test cluster, whose bridge and Pod
	// veths are its to check; other rows running beside it ignore them.
	cluster bool
	// direct: every guarantee of direct mode holds for this row on these
	// machines (a guest sharing this kernel, which has Landlock's TCP
	// rules and cgroup v2, with a root shim, and a guest root with no
	// capability in the host's user namespace): it must be on.
	direct bool
	// onLive, when set, looks at the row's sandbox once it is ready.
	onLive func(t *testing.T, c *confCase)
	// crashCell, when set, picks the crash cells the row runs (the others
	// are "not run"); nil: every cell.
	crashCell func(cell crashCell) bool
	// claimVolumes: a warm sandbox's claim can bring volumes on this row
	// (provider.Capabilities.ClaimVolumes with a root shim); elsewhere it
	// is refused as unsupported.
	claimVolumes bool
}

// rawVia is the via of the workload's raw connections on the row: direct
// mode's, where it is on (the default), else the capture's.
func (e confEnv) rawVia() string {
	if e.direct {
		return "direct"
	}
	return "transparent"
}

// confPeer is a server on a network the guest's namespace has.
type confPeer struct {
	addr string
	// reach dials addr from the guest's namespace: the proof the
	// interface is real.
	reach func() (string, error)
}

// confFixtures are shared by every row: the Link relay, a web server the
// egress rules allow, the upstream flags, the CA bundle and a copy of
// the binaries in a directory only root can reach.
type confFixtures struct {
	relay    *linkrelay.Relay
	upstream []string // --upstream flags
	identity []string // --tenant, --environment, --allocation
	caBundle string   // content: the host's bundle and the run's CA
	private  privateBins
}

// privateBins are the binaries a sandbox runs, installed somewhere.
type privateBins struct{ shim, guest, sandboxIO, daemon, crashShim string }

func newConfFixtures(t *testing.T) *confFixtures {
	testCA(t)
	// The Link is on a public address with no rule for it: the broker
	// resolves relay.test there (hosts) and the default lets it through.
	relay, _ := publicLink(t)
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "conformance web: %s", r.URL.Path)
	}))
	t.Cleanup(web.Close)
	bundle, err := os.ReadFile(runCA.bundle)
	require.NoError(t, err)
	return &confFixtures{
		relay: relay,
		upstream: []string{
			"--upstream", "web.test:80=" + web.Listener.Addr().String(),
			"--upstream", "echo.test:7=" + rawEcho(t),
		},
		identity: []string{"--tenant", tenantID, "--environment", environmentID, "--allocation", allocationID},
		caBundle: string(bundle),
		// Installed inside a directory only root can traverse, as go
		// install puts binaries in /root/go/bin: the guest's root (an
		// unprivileged host id) cannot reach them there.
		private: installBins(t, filepath.Join(bins.dir, "root-only"), 0, 0),
	}
}

// installBins copies the binaries a sandbox runs into dir/go/bin, dir
// being mode 0700 and owned by uid:gid.
func installBins(t *testing.T, dir string, uid, gid int) privateBins {
	t.Helper()
	bin := filepath.Join(dir, "go", "bin")
	require.NoError(t, os.MkdirAll(bin, 0o755))
	require.NoError(t, os.Chmod(dir, 0o700))
	var p privateBins
	for _, b := range []struct {
		dst *string
		src string
	}{{&p.shim, bins.shim}, {&p.guest, bins.guest}, {&p.sandboxIO, bins.sandboxIO}, {&p.daemon, bins.daemon}, {&p.crashShim, bins.crashShim}} {
		data, err := os.ReadFile(b.src)
		require.NoError(t, err)
		*b.dst = filepath.Join(bin, filepath.Base(b.src))
		require.NoError(t, os.WriteFile(*b.dst, data, 0o755))
		require.NoError(t, os.Chown(*b.dst, uid, gid))
	}
	for _, d := range []string{dir, filepath.Join(dir, "go"), bin} {
		require.NoError(t, os.Chown(d, uid, gid))
	}
	return p
}

// installs are the flags that install the stand-ins from p.
func (p privateBins) installs() []string {
	return []string{"--sandbox-io", p.sandboxIO, "--install", "oac-daemon-standin=" + p.daemon}
}

// confBootstrap is the hosted bootstrap every row boots: oac-sandbox-io
// with a wss Link on the relay, the daemon stand-in with credentials and
// health, its probes (through the proxies, and direct: only the capture
// can carry those) and a marker to find it on the host.
func confBootstrap(name string, peer *confPeer, daemonArgs ...string) string {
	grace := bootstrap.Duration(3 * time.Second)
	argv := []string{daemonBin, "serve", "--hostname", "127.0.0.1", "--port", strconv.Itoa(daemonPort), "--marker", name,
		"--probe", "proxy-allowed=proxy:http://web.test/proxy",
		"--probe", "proxy-denied=proxy:http://denied.test/",
		"--probe", "direct-allowed=direct:http://web.test/direct",
		"--probe", "direct-denied=direct:http://denied.test/",
		"--probe", "echo-proxy=echo-proxy:echo.test:7",
		"--probe", "echo-direct=echo-direct:echo.test:7",
		"--probe", "why=why:web.test:5432",
		// IPv6: a client that uses IPv6 only, and IPv6 literals the
		// broker refuses (the host's loopback in NAT64 form, a link-local
		// address) on port 80, where the capture answers with the 403.
		"--probe6", "direct6-allowed=http://web.test/direct6",
		"--probe6", "direct6-denied=http://denied.test/",
		"--probe", "nat64-loopback=direct:http://[64:ff9b::7f00:1]/",
		"--probe", "link-local=direct:http://[fe80::1%25lo]/",
	}
	if peer != nil {
		argv = append(argv, "--probe", "peer=dial:"+peer.addr)
	}
	argv = append(argv, daemonArgs...)
	b := &bootstrap.Bootstrap{
		Version: 1, Hostname: "conformance",
		SandboxIO: &bootstrap.SandboxIOSpec{Bootstrap: &bootstrap.SandboxIO{
			Version: 1, LinkURL: "wss://relay.test" + linkrelay.Path, Credential: linkCredential,
			Resource: bootstrap.Resource{TenantID: tenantID, EnvironmentID: environmentID, Kind: "allocation", ID: allocationID, Generation: 1},
		}},
		Daemon:      &bootstrap.Process{Argv: argv},
		Credentials: &bootstrap.Credentials{UsernameEnv: "OAC_SERVER_USERNAME", PasswordEnv: "OAC_SERVER_PASSWORD"},
		Health:      &bootstrap.Health{Port: daemonPort},
		StopGrace:   &grace,
	}
	data, _ := json.Marshal(b)
	return string(data)
}

// confCase is one row's run: its environment and its running sandbox.
type confCase struct {
	row     confRow
	env     confEnv
	fix     *confFixtures
	rowT    *testing.T
	name    string
	s       *shim
	bootErr string
	procs   []procID
	ifaces  []string
	mu      sync.Mutex
	// kept is the kept-sandbox columns' sandbox.
	kept keptState
}

// live returns the row's running sandbox, booting it on first use (or
// again after a promise stopped it); the shim reports to t.
func (c *confCase) live(t *testing.T) *shim {
	t.Helper()
	if c.bootErr != "" {
		t.Fatalf("the row's sandbox did not boot: %s", c.bootErr)
	}
	if c.s != nil && !c.s.exited() {
		c.s.t = t
		return c.s
	}
	c.name = uniqueName("conf")
	s := c.start(t, c.name)
	ok := false
	defer func() {
		if !ok {
			c.bootErr = "no ready event (see the first promise's log)"
		}
	}()
	s.waitState(api.StateReady, c.env.bootTimeout)
	ok = true
	c.s = s
	c.procs = sandboxProcs(s, c.name)
	require.NotEmpty(t, c.procs, "the sandbox's processes are found on the host")
	t.Logf("%s: %d host processes: %v", c.name, len(c.procs), c.procs)
	if c.env.onLive != nil {
		c.env.onLive(t, c)
	}
	return s
}

// start starts a sandbox called name with the row's environment and the
// hosted bootstrap; it lives until the row ends.
func (c *confCase) start(t *testing.T, name string) *shim {
	t.Helper()
	spec := c.env.spec
	spec.name = name
	spec.bootstrap = confBootstrap(name, c.env.peer)
	spec.hosts = publicHosts
	s := startShim(c.rowT, spec)
	s.t = t
	return s
}

// nothingLeft asserts that a sandbox called name that ended left nothing
// on the host: none of the processes it had (procs), no process naming it,
// no mount naming it, no state directory, no new network interface, and
// nothing of the provider's own (a container, a cgroup, a layer).
func (c *confCase) nothingLeft(t *testing.T, name string, procs []procID) {
	t.Helper()
	var left []string
	check := func() bool {
		left = nil
		for _, p := range procs {
			if p.alive() {
				left = append(left, fmt.Sprintf("process %d (%s)", p.pid, p.comm))
			}
		}
		for _, pid := range append(hostProcs(name), hostProcs("--marker "+name)...) {
			if pid != os.Getpid() {
				left = append(left, fmt.Sprintf("process %d naming the sandbox: %q", pid, strings.ReplaceAll(readCmdline(pid), "\x00", " ")))
			}
		}
		for _, line := range hostMounts(t, name) {
			left = append(left, "mount "+line)
		}
		if d := c.env.stateDir(name); d != "" {
			if _, err := os.Stat(d); err == nil {
				left = append(left, "state directory "+d)
			}
		}
		for _, i := range hostInterfaces() {
			if !contains(c.ifaces, i) && (c.env.cluster || !clusterInterface(i)) {
				left = append(left, "network interface "+i)
			}
		}
		if c.env.leftovers != nil {
			left = append(left, c.env.leftovers(name)...)
		}
		return len(left) == 0
	}
	deadline := time.Now().Add(10 * time.Second)
	for !check() && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	assert.Empty(t, left, "what sandbox %s left behind", name)
}

func runConfRow(t *testing.T, row confRow, fix *confFixtures, res *confResults) {
	c := &confCase{row: row, fix: fix, rowT: t}
	setupOK := false
	t.Cleanup(func() {
		if !setupOK {
			for _, p := range confPromises {
				res.set(row.name, p.name, rowOutcome(t))
			}
			for _, cell := range crashCells() {
				res.setCrash(row.name, cell.String(), rowOutcome(t))
			}
		}
	})
	if row.name == appArmorRow && !inAppArmorVM() {
		setupOK = runRowInAppArmorVM(t, row, res)
		return
	}
	c.env = row.setup(t, fix)
	// After the setup: the row's own environment (a test cluster's
	// bridge) is not what a sandbox left.
	c.ifaces = hostInterfaces()
	if c.env.bootTimeout == 0 {
		c.env.bootTimeout = bootTimeout
	}
	setupOK = true
	for _, p := range confPromises {
		ok := t.Run(p.name, func(t *testing.T) { p.check(t, c) })
		res.set(row.name, p.name, map[bool]string{true: "pass", false: "FAIL"}[ok])
	}
	runCrashMatrix(t, c, res)
	if c.s != nil {
		if ready := c.s.find(func(e api.Event) bool { return e.Event == api.KindState && e.State == api.StateReady }); len(ready) > 0 {
			res.note(row.name, ready[0].Message)
		}
	}
}

// rowOutcome is the cell of a row that could not run: a failure, or a
// skip outside CI.
func rowOutcome(t *testing.T) string {
	if t.Skipped() && !inCI() {
		return "skipped"
	}
	return "FAIL"
}

// The promises.

func promiseHostedReady(t *testing.T, c *confCase) {
	s := c.live(t)
	ready := s.waitState(api.StateReady, time.Second)
	assert.Equal(t, "http://127.0.0.1:4096", ready.URL)
	assert.Equal(t, "runtime", ready.Username)
	complete := s.waitFor(func(e api.Event) bool {
		return e.Event == api.KindState && strings.Contains(e.Message, "bootstrap complete")
	}, time.Second, "bootstrap complete")
	assert.Equal(t, "guest: bootstrap complete: oac-sandbox-io and the daemon started", complete.Message)
	// oac-sandbox-io, with an empty environment, reached the wss Link by
	// its name through the resolver and the capture.
	assert.Equal(t, "0", s.waitLog("sandbox-io: env=", bootTimeout), "oac-sandbox-io has an empty environment")
	assert.Contains(t, s.waitLog("sandbox-io: link=connected ", 30*time.Second), "status=101")
	assert.NotEmpty(t, s.find(func(e api.Event) bool {
		return e.Event == api.KindEgress && e.Via == c.env.rawVia() && e.Target == "relay.test:443" && e.Decision == "allowed" &&
			e.Rule == "link relay.test:443" && e.Address == publicAddr+":443"
	}), "the Link connection went out through the broker, allowed with no rule of the operator's")
	assert.NotEmpty(t, s.find(func(e api.Event) bool {
		return e.State == api.StateStarting && strings.Contains(e.Message, "the Link is allowed by default (link relay.test:443)")
	}), "the starting event says the Link is allowed")
	_, raw := s.allEvents()
	for _, line := range append(raw, s.stderr.String()) {
		assert.NotContains(t, line, linkCredential, "the credential never leaves the guest")
	}
}

func promiseContract(t *testing.T, c *confCase) {
	s := c.live(t)
	assert.Equal(t, "mode=0600 type=regular uid=1000 gid=1000", s.waitLog("sandbox-io: file=", bootTimeout))
	assert.Equal(t, "mode=0700 uid=1000 gid=1000", s.waitLog("sandbox-io: dir=", bootTimeout))
	const noCaps = "inh=0000000000000000 prm=0000000000000000 eff=0000000000000000 amb=0000000000000000"
	for _, p := range []string{"sandbox-io", "daemon"} {
		assert.Equal(t, "uid=1000 gid=1000 groups=[]", s.waitLog(p+": ids=", bootTimeout), p)
		assert.Equal(t, noCaps, s.waitLog(p+": caps=", bootTimeout), p)
		assert.Equal(t, "1", s.waitLog(p+": nnp=", bootTimeout), p)
	}
	// The daemon shares oac-sandbox-io's uid: only the mask in its own
	// mount namespace keeps it from the private file, on every provider.
	assert.Equal(t, "EACCES", s.waitLog("daemon: read-private-file=", bootTimeout), "the daemon cannot read oac-sandbox-io's private file")
	ready := s.waitState(api.StateReady, time.Second)
	assert.Contains(t, ready.Message, "daemon healthy after", "ready only once the daemon answered its health check")
}

func promiseEgress(t *testing.T, c *confCase) {
	s := c.live(t)
	// Through the proxies (the daemon's environment names them).
	assert.Equal(t, "ok 200 conformance web: /proxy", s.waitLog("daemon: probe proxy-allowed=", 30*time.Second))
	assert.Regexp(t, `^ok 403 `, s.waitLog("daemon: probe proxy-denied=", 30*time.Second))
	// With no proxy: only the resolver and the capture carry these.
	assert.Equal(t, "ok 200 conformance web: /direct", s.waitLog("daemon: probe direct-allowed=", 30*time.Second))
	assert.Regexp(t, `^error .*no such host`, s.waitLog("daemon: probe direct-denied=", 30*time.Second))
	has := func(via, target, decision string) {
		assert.NotEmpty(t, s.find(func(e api.Event) bool {
			return e.Event == api.KindEgress && e.Via == via && e.Target == target && e.Decision == decision
		}), "egress event %s %s %s", via, target, decision)
	}
	has("http", "web.test:80", "allowed")
	has("http", "denied.test:80", "denied")
	has(c.env.rawVia(), "web.test:80", "allowed")
	has("dns", "denied.test", "denied")

	// IPv6, captured like IPv4 on every row.
	assert.NotEmpty(t, s.find(func(e api.Event) bool {
		return e.State == api.StateStarting && strings.Contains(e.Message, "outgoing TCP captured (IPv4 and IPv6)")
	}), "the starting event says IPv6 is captured")
	assert.Equal(t, "ok 200 conformance web: /direct6", s.waitLog("daemon: probe direct6-allowed=", 30*time.Second),
		"an IPv6-only client reaches an allowed name (AAAA answered, IPv6 captured)")
	assert.Regexp(t, `^error .*no such host`, s.waitLog("daemon: probe direct6-denied=", 30*time.Second))
	// Refused: the capture answers a plain HTTP client 403 with the
	// reason; direct mode refuses the connect itself (ECONNREFUSED).
	refused := `^ok 403 Blocked by the sandbox's egress policy`
	if c.env.direct {
		refused = `^error .*connection refused`
	}
	assert.Regexp(t, refused, s.waitLog("daemon: probe nat64-loopback=", 30*time.Second))
	assert.Regexp(t, refused, s.waitLog("daemon: probe link-local=", 30*time.Second))
	has(c.env.rawVia(), "[64:ff9b::7f00:1]:80", "denied")
	has(c.env.rawVia(), "[fe80::1]:80", "denied")
}

func promiseOnlyLoopback(t *testing.T, c *confCase) {
	s := c.live(t)
	assert.Equal(t, "lo", s.waitLog("daemon: interfaces=", bootTimeout))
	assert.Equal(t, "lo", s.waitLog("sandbox-io: interfaces=", bootTimeout))
	if c.env.peer == nil {
		return
	}
	// The guest's own network reaches the peer; the workload does not:
	// its connection is captured, goes to the broker and is refused.
	got, err := c.env.peer.reach()
	require.NoError(t, err, "the peer is reachable from the guest's namespace")
	assert.Equal(t, "echo: control", got)
	assert.Regexp(t, `^error `, s.waitLog("daemon: probe peer=", 30*time.Second))
	assert.NotEmpty(t, s.find(func(e api.Event) bool {
		return e.Event == api.KindEgress && e.Target == c.env.peer.addr && e.Decision == "denied"
	}), "the workload's attempt reached only the broker, which refused it")
}

// promiseNoPlatformDoor: the workload finds no door to the host that the
// platform opens by default (a drive or host share mounted, a host socket
// it can connect to, AF_VSOCK, an environment naming one, a device node
// beyond the minimal /dev, WSL's interop, a host process in sight): the
// daemon stand-in looks at start (selfreport.Doors).
func promiseNoPlatformDoor(t *testing.T, c *confCase) {
	s := c.live(t)
	found := doorFindings(t, s)
	assert.Equal(t, "none", s.waitLog("daemon: doors=", bootTimeout),
		"the workload (uid 1000) found %d door(s) to the host that the %s platform left open:\n  %s",
		len(found), c.row.name, strings.Join(found, "\n  "))
	t.Logf("the door probe: %s", s.waitLog("daemon: doors-scan=", 5*time.Second))
}

// doorFindings is what the daemon stand-in of s reported as doors to the
// host ("daemon: doors=none" is none): a test that opens a door on purpose
// can look for it.
func doorFindings(t *testing.T, s *shim) []string {
	t.Helper()
	raw := s.waitLog("daemon: doors=", bootTimeout)
	return selfreport.ParseReport(raw)
}

func promiseStopLeavesNothing(t *testing.T, c *confCase) {
	s := c.live(t)
	name, procs := c.name, c.procs
	s.signal(syscall.SIGTERM)
	s.waitState(api.StateStopped, 30*time.Second)
	assert.Equal(t, 0, s.exit(30*time.Second))
	for _, p := range []string{"oac-sandbox-io", "daemon"} {
		exited := s.waitFor(isProcess(p, "exited"), time.Second, p+" exited")
		if assert.NotNil(t, exited.ExitCode, p) {
			assert.Equal(t, 0, *exited.ExitCode, "%s exits 0 on SIGTERM", p)
		}
	}
	c.nothingLeft(t, name, procs)
}

func promiseKillLeavesNothing(t *testing.T, c *confCase) {
	name := uniqueName("conf-kill")
	first := c.start(t, name)
	first.waitState(api.StateReady, c.env.bootTimeout)
	procs := sandboxProcs(first, name)
	require.NotEmpty(t, procs, "the sandbox's processes are found on the host")
	require.NoError(t, first.cmd.Process.Signal(syscall.SIGKILL))
	first.exit(10 * time.Second)

	again := c.start(t, name)
	again.waitState(api.StateReady, c.env.bootTimeout)
	procs = append(procs, sandboxProcs(again, name)...)
	again.signal(syscall.SIGTERM)
	again.waitState(api.StateStopped, 30*time.Second)
	assert.Equal(t, 0, again.exit(30*time.Second))
	c.nothingLeft(t, name, procs)
}

// Processes of a sandbox, as the host sees them.

// procID is a process, told from a later one with the same pid by its
// start time.
type procID struct {
	pid   int
	start string
	comm  string
}

func (p procID) alive() bool {
	st, comm := procStat(p.pid)
	return st != "" && st == p.start && comm == p.comm
}

// procStat returns a process's start time and command name ("" when it
// does not exist).
func procStat(pid int) (start, comm string) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", ""
	}
	s := string(b)
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closing < open {
		return "", ""
	}
	f := strings.Fields(s[closing+1:])
	if len(f) < 20 {
		return "", ""
	}
	return f[19], s[open+1 : closing]
}

func ppidOf(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 2 {
		return 0
	}
	n, _ := strconv.Atoi(f[1])
	return n
}

// sandboxProcs returns the host processes of a running sandbox: the
// shim's descendants (the runtime), and every process in the pid
// namespace or under the root directory of its daemon (the guest's), when
// those are not the host's.
func sandboxProcs(s *shim, name string) []procID {
	selfPidNS, _ := os.Readlink("/proc/self/ns/pid")
	pids := map[int]bool{}
	all := allPids()
	parent := map[int]int{}
	for _, p := range all {
		parent[p] = ppidOf(p)
	}
	shimPid := s.cmd.Process.Pid
	for _, p := range all {
		for q := p; q > 1; q = parent[q] {
			if q == shimPid {
				pids[p] = true
				break
			}
		}
	}
	for _, d := range hostProcs("--marker " + name) {
		pids[d] = true
		ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", d))
		root, _ := os.Readlink(fmt.Sprintf("/proc/%d/root", d))
		for _, p := range all {
			if pns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", p)); ns != "" && ns != selfPidNS && pns == ns {
				pids[p] = true
			}
			if r, _ := os.Readlink(fmt.Sprintf("/proc/%d/root", p)); root != "" && root != "/" && r == root {
				pids[p] = true
			}
		}
	}
	delete(pids, shimPid)
	var out []procID
	for p := range pids {
		if st, comm := procStat(p); st != "" {
			out = append(out, procID{p, st, comm})
		}
	}
	return out
}

func allPids() []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		if n, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, n)
		}
	}
	return out
}

// clusterInterface reports whether a host interface is the test
// cluster's: its CNI bridge or a Pod's veth on it.
func clusterInterface(name string) bool {
	if strings.HasPrefix(name, kcluster.BridgePrefix) {
		return true
	}
	master, err := os.Readlink(filepath.Join("/sys/class/net", name, "master"))
	return err == nil && strings.HasPrefix(filepath.Base(master), kcluster.BridgePrefix)
}

func hostInterfaces() []string {
	ents, _ := os.ReadDir("/sys/class/net")
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// The table.

type confResults struct {
	mu    sync.Mutex
	cells map[string]map[string]string
	notes map[string]string
	// crash is the crash matrix: cell -> row -> outcome.
	crash map[string]map[string]string
}

func newConfResults() *confResults {
	return &confResults{cells: map[string]map[string]string{}, notes: map[string]string{}, crash: map[string]map[string]string{}}
}

func (r *confResults) set(row, promise, outcome string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cells[row] == nil {
		r.cells[row] = map[string]string{}
	}
	r.cells[row][promise] = outcome
}

func (r *confResults) note(row, ready string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.notes[row] = ready
}

// table renders provider x promise as a Markdown table, with each row's
// ready message below it.
func (r *confResults) table() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	b.WriteString("| provider |")
	for _, p := range confPromises {
		b.WriteString(" " + p.name + " |")
	}
	b.WriteString("\n|---|")
	for range confPromises {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, row := range confRows {
		b.WriteString("| " + row.name + " |")
		for _, p := range confPromises {
			cell := r.cells[row.name][p.name]
			if cell == "" {
				cell = "not run"
			}
			b.WriteString(" " + cell + " |")
		}
		b.WriteString("\n")
	}
	if len(r.notes) > 0 {
		b.WriteString("\nready (the shim's own measure, one boot each):\n")
		for _, row := range confRows {
			if n, ok := r.notes[row.name]; ok {
				b.WriteString("- " + row.name + ": " + n + "\n")
			}
		}
	}
	return b.String()
}
