//go:build linux

package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

// oac-guest helper runs where no shim does (E2B, microsandbox): the
// platform's agent starts it as root, not as PID 1, and writes Core's
// payload to its stdin. These tests run it so, with no oac-shim anywhere:
// in a bwrap sandbox of the run's image, and in a Docker container built
// from the E2B template oac-image writes. The guest's network is the
// host's; the Link and a web server are on a public address the run
// routes into a namespace of its own (publicLink).

// helperPayload is Core's {runtime, sandbox_io} for a sandbox whose daemon
// probes allowed and denied egress, through the proxies and direct.
func helperPayload(link, marker string) string {
	p := bootstrap.Core{
		Runtime: &bootstrap.CoreRuntime{
			Command: []string{daemonBin, "serve", "--hostname", "127.0.0.1", "--port", strconv.Itoa(daemonPort), "--marker", marker,
				"--probe", "proxy-allowed=proxy:http://" + publicAddr + "/proxy",
				"--probe", "proxy-denied=proxy:http://denied.test:8081/",
				"--probe", "direct-allowed=direct:http://" + publicAddr + "/direct",
				"--probe", "direct-denied=direct:http://" + publicAddr + ":8080/",
			},
			Port: daemonPort, UsernameEnv: "OAC_SERVER_USERNAME", PasswordEnv: "OAC_SERVER_PASSWORD", StopGraceMS: 3000,
		},
		SandboxIO: &bootstrap.SandboxIO{
			Version: 1, LinkURL: link, Credential: linkCredential,
			Resource: bootstrap.Resource{TenantID: tenantID, EnvironmentID: environmentID, Kind: "allocation", ID: allocationID, Generation: 1},
		},
	}
	data, _ := json.Marshal(p)
	return string(data)
}

// helperRun is one helper: its events (read as the shim's are, each
// line validated against the schema) and its stdin.
type helperRun struct {
	*shim
	stdin  io.WriteCloser
	marker string
}

func startHelper(t *testing.T, name string, argv, env []string) *helperRun {
	t.Helper()
	_, link := publicLink(t)
	r, w, err := os.Pipe()
	require.NoError(t, err)
	h := &helperRun{stdin: w, marker: name}
	h.shim = startShim(t, sandboxSpec{name: name, argv: argv, stdin: r, env: env})
	r.Close()
	t.Cleanup(func() { w.Close() })
	_, err = io.WriteString(w, helperPayload(link, name)+"\n")
	require.NoError(t, err)
	return h
}

// helperPromises are the columns of the helper's table: what helper mode
// keeps, each checked on a ready sandbox.
var helperPromises = []struct {
	name  string
	check func(t *testing.T, h *helperRun)
}{
	{"ready, url and username", func(t *testing.T, h *helperRun) {
		ready := h.waitState(api.StateReady, bootTimeout)
		assert.Equal(t, fmt.Sprintf("http://127.0.0.1:%d", daemonPort), ready.URL)
		assert.Equal(t, "runtime", ready.Username)
	}},
	{"events: schema, mode helper", func(t *testing.T, h *helperRun) {
		// Each line was validated against the schema as it arrived.
		all, _ := h.allEvents()
		for _, e := range all {
			assert.Equal(t, api.ModeHelper, e.Mode, "every event says helper: %+v", e)
		}
	}},
	{"private file 0600 1000:1000 in 0700", func(t *testing.T, h *helperRun) {
		assert.Equal(t, "mode=0600 type=regular uid=1000 gid=1000", h.waitLog("sandbox-io: file=", bootTimeout), "the private file")
		assert.Equal(t, "mode=0700 uid=1000 gid=1000", h.waitLog("sandbox-io: dir=", bootTimeout))
		assert.Equal(t, bootstrap.CredentialDigest(linkCredential), h.waitLog("sandbox-io: credential-sha256=", bootTimeout))
	}},
	{"1000:1000, no caps, nnp", func(t *testing.T, h *helperRun) {
		for _, who := range []string{"daemon", "sandbox-io"} {
			assert.Equal(t, "uid=1000 gid=1000 groups=[]", h.waitLog(who+": ids=", bootTimeout), who)
			assert.Equal(t, "1", h.waitLog(who+": nnp=", bootTimeout), who)
			assert.Equal(t, "inh=0000000000000000 prm=0000000000000000 eff=0000000000000000 amb=0000000000000000", h.waitLog(who+": caps=", bootTimeout), who)
		}
	}},
	{"daemon cannot read the file", func(t *testing.T, h *helperRun) {
		assert.NotEqual(t, "ok", h.waitLog("daemon: read-private-file=", bootTimeout))
	}},
	{"workload sees only lo", func(t *testing.T, h *helperRun) {
		assert.Equal(t, "lo", h.waitLog("daemon: interfaces=", bootTimeout))
		assert.Equal(t, "lo", h.waitLog("sandbox-io: interfaces=", bootTimeout))
	}},
	{"egress allowed and denied, with events", func(t *testing.T, h *helperRun) {
		assert.True(t, strings.HasPrefix(h.waitLog("daemon: probe proxy-allowed=", bootTimeout), "ok 200 public web: /proxy"))
		assert.True(t, strings.HasPrefix(h.waitLog("daemon: probe direct-allowed=", bootTimeout), "ok 200 public web: /direct"))
		assert.Contains(t, h.waitLog("daemon: probe proxy-denied=", bootTimeout), "403")
		assert.NotContains(t, h.waitLog("daemon: probe direct-denied=", bootTimeout), "ok 200")
		policy := h.waitFor(func(e api.Event) bool { return e.Event == api.KindEgressPolicy }, bootTimeout, "egress_policy")
		assert.Equal(t, []string{publicAddr + "/32:80", "link " + publicAddr + ":443"}, policy.Rules, "the operator's rule and the Link's")
		assert.Equal(t, publicAddr+"/32:80", h.egressEvent(publicAddr+":80", "allowed").Rule)
		assert.Equal(t, "Denied", h.egressEvent("denied.test:8081", "denied").Code)
		assert.Equal(t, "Denied", h.egressEvent(publicAddr+":8080", "denied").Code)
	}},
	{"the Link with no rule", func(t *testing.T, h *helperRun) {
		assert.NotEmpty(t, h.find(func(e api.Event) bool {
			return e.State == api.StateStarting && strings.Contains(e.Message, "the Link is allowed by default (link "+publicAddr+":443)")
		}), "the starting event says the Link is allowed")
		assert.True(t, strings.HasPrefix(h.waitLog("sandbox-io: link=", bootTimeout), "connected status=101"), "oac-sandbox-io reached its Link")
		assert.Equal(t, "link "+publicAddr+":443", h.egressEvent(publicAddr+":443", "allowed").Rule)
	}},
}

func (h *helperRun) egressEvent(target, decision string) api.Event {
	return h.waitFor(func(e api.Event) bool {
		return e.Event == api.KindEgress && e.Target == target && e.Decision == decision
	}, bootTimeout, "egress "+decision+" "+target)
}

// helperTable is the table of what helper mode keeps: row (where, how it
// stopped) x promise.
type helperTable struct {
	rows  []string
	cells map[string]map[string]string
}

func (tb *helperTable) check(t *testing.T, row string, h *helperRun) {
	tb.rows = append(tb.rows, row)
	if tb.cells == nil {
		tb.cells = map[string]map[string]string{}
	}
	tb.cells[row] = map[string]string{}
	for _, p := range helperPromises {
		ok := t.Run(p.name, func(t *testing.T) { p.check(t, h) })
		tb.cells[row][p.name] = map[bool]string{true: "ok", false: "FAIL"}[ok]
	}
}

func (tb *helperTable) stopped(t *testing.T, row string, h *helperRun, reason string) {
	ok := t.Run("stop in order, nothing left", func(t *testing.T) { h.stopsLeavingNothing(t, reason) })
	tb.cells[row]["stop in order, nothing left"] = map[bool]string{true: "ok", false: "FAIL"}[ok]
}

// print renders the table as the conformance suite does its own.
func (tb *helperTable) print(title string) {
	var b strings.Builder
	cols := []string{}
	for _, p := range helperPromises {
		cols = append(cols, p.name)
	}
	cols = append(cols, "stop in order, nothing left")
	b.WriteString("| helper |")
	for _, c := range cols {
		b.WriteString(" " + c + " |")
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", len(cols)) + "\n")
	for _, r := range tb.rows {
		b.WriteString("| " + r + " |")
		for _, c := range cols {
			cell := tb.cells[r][c]
			if cell == "" {
				cell = "not run"
			}
			b.WriteString(" " + cell + " |")
		}
		b.WriteString("\n")
	}
	fmt.Printf("\nhelper mode, %s (%s):\n%s\n", title, time.Now().UTC().Format("2006-01-02"), b.String())
}

// stopsLeavingNothing waits for the helper's exit after a stop and
// checks the last event and that no process of its sandbox is left.
func (h *helperRun) stopsLeavingNothing(t *testing.T, reason string) {
	t.Helper()
	assert.Equal(t, 0, h.exit(30*time.Second), "the helper exits 0 after an orderly stop")
	last := h.lastEvent()
	assert.Equal(t, api.StateStopped, last.State)
	assert.Equal(t, "stopped: "+reason, last.Message)
	assert.NotEmpty(t, h.find(func(e api.Event) bool {
		return e.Event == api.KindProcess && e.Process == "daemon" && e.Message == "exited"
	}), "the daemon's exit is reported")
	assert.NotEmpty(t, h.find(func(e api.Event) bool {
		return e.Event == api.KindProcess && e.Process == "oac-sandbox-io" && e.Message == "exited"
	}), "oac-sandbox-io's exit is reported")
	assert.Empty(t, hostProcs(h.marker), "no process of the sandbox is left")
}

// helperPIDs returns the helper's processes (the helper and its re-run in
// a mount namespace of its own): oac-guest helper --name NAME, the
// oldest first.
func helperPIDs(name string) []int {
	var out []int
	for _, pid := range hostProcs("helper --name " + name) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		argv := strings.Split(string(b), "\x00")
		if len(argv) > 3 && strings.HasSuffix(argv[0], "oac-guest") && argv[1] == "helper" && argv[3] == name {
			out = append(out, pid)
		}
	}
	return out
}

func bwrapHelperArgv(t *testing.T, name string) []string {
	return []string{"bwrap", "--ro-bind", guestRootfs(t), "/", "--proc", "/proc", "--dev", "/dev",
		"--tmpfs", "/run", "--tmpfs", "/tmp", "--tmpfs", "/home", "--tmpfs", "/environment",
		"--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--cap-add", "ALL",
		"--", "/sbin/oac-guest", "helper", "--name", name, "--allow", publicAddr + ":80"}
}

func TestHelperInBwrapKeepsTheContract(t *testing.T) {
	needBwrap(t)
	needImageBuild(t)
	var tb helperTable
	defer tb.print("bwrap, no shim")
	for _, stop := range []string{"stdin closed", "terminated signal received"} {
		t.Run(strings.ReplaceAll(stop, " ", "-"), func(t *testing.T) {
			name := uniqueName("helper-bwrap")
			h := startHelper(t, name, bwrapHelperArgv(t, name), nil)
			row := "bwrap, stopped by " + map[string]string{"stdin closed": "stdin EOF", "terminated signal received": "SIGTERM"}[stop]
			tb.check(t, row, h)
			if stop == "stdin closed" {
				require.NoError(t, h.stdin.Close())
			} else {
				pids := helperPIDs(name)
				require.NotEmpty(t, pids, "the helper's process")
				require.NoError(t, syscall.Kill(pids[0], syscall.SIGTERM))
			}
			tb.stopped(t, row, h, stop)
		})
	}
}

func TestHelperRefusesABadPayloadWithANamedErrorAndStartsNothing(t *testing.T) {
	needBwrap(t)
	needImageBuild(t)
	name := uniqueName("helper-bad")
	cmd := exec.Command(bwrapHelperArgv(t, name)[0], bwrapHelperArgv(t, name)[1:]...)
	cmd.Stdin = strings.NewReader(`{"Runtime": {"command": ["/bin/true"]}}`)
	out, err := cmd.Output()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	assert.NotEqual(t, 0, ee.ExitCode())
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	require.Len(t, lines, 1, "one event: failed")
	validLine(t, []byte(lines[0]))
	var e api.Event
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &e))
	assert.Equal(t, api.StateFailed, e.State)
	assert.Equal(t, api.ModeHelper, e.Mode)
	assert.Equal(t, api.CodeInvalidBootstrap, e.Code)
	assert.Contains(t, e.Message, bootstrap.ErrUnknownKey.Error())
}

// e2bBase is a minimal base an E2B template needs: /bin/sh (the host's
// dash and the libraries it links) and /etc/os-release.
func e2bBase(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.Chmod(dir, 0o755))
	sh, err := exec.LookPath("dash")
	need(t, err == nil, "dash is not installed: apt-get install dash")
	files := []string{sh}
	out, err := exec.Command("ldd", sh).Output()
	require.NoError(t, err, "ldd %s", sh)
	for _, f := range strings.Fields(string(out)) {
		if strings.HasPrefix(f, "/") {
			files = append(files, f)
		}
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		real, _ := filepath.EvalSymlinks(f)
		for _, dst := range []string{f, real} {
			require.NoError(t, os.MkdirAll(filepath.Join(dir, filepath.Dir(dst)), 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(dir, dst), data, 0o755))
		}
	}
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "bin"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "bin", "sh"), must(os.ReadFile(sh)), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "etc"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "etc", "os-release"), []byte("ID=debian\nVERSION_ID=\"12\"\nPRETTY_NAME=\"oac e2e E2B base\"\n"), 0o644))
	return dir
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestHelperInADockerContainerFromTheE2BTemplate(t *testing.T) {
	e := needDocker(t)
	needImageBuild(t)
	testCA(t)
	out := filepath.Join(t.TempDir(), "image")
	build := exec.Command(bins.image, "build", "--base", e2bBase(t), "--agent", bins.guest, "--sandbox-io", bins.sandboxIO,
		"--ca-bundle", runCA.bundle, "--file", bins.daemon+":"+daemonBin+":0755", "--output", "e2b", "--epoch", "1", "-o", out)
	b, err := build.CombinedOutput()
	require.NoError(t, err, "oac-image build --output e2b: %s", b)
	ref := "oac-e2e/e2b:" + strings.TrimPrefix(uniqueName("t"), "t-")
	ctx := t.Context()
	_, err = e.Docker(ctx, "build", "-q", "-f", filepath.Join(out, "e2b", "e2b.Dockerfile"), "-t", ref, filepath.Join(out, "e2b"))
	require.NoError(t, err, "docker build of the E2B template (offline: FROM scratch)")
	t.Cleanup(func() { _, _ = e.Docker(t.Context(), "rmi", "-f", ref) })

	var tb helperTable
	defer tb.print("a Docker container from the E2B template, as envd runs it")
	for _, stop := range []string{"stdin closed", "terminated signal received"} {
		t.Run(strings.ReplaceAll(stop, " ", "-"), func(t *testing.T) {
			name := uniqueName("helper-e2b")
			// As E2B's VM runs envd: root with the capabilities the
			// helper uses beside Docker's defaults (this machine's
			// bounding set lacks one, so not --privileged), no seccomp
			// or AppArmor profile of the engine's, the sandbox's own
			// network (here the host's), a long-lived init that is not
			// the helper.
			_, err := e.Docker(t.Context(), "run", "-d", "-i", "--name", name, "--network", "host",
				"--cap-add", "SYS_ADMIN", "--cap-add", "NET_ADMIN", "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
				"--tmpfs", "/run", "--tmpfs", "/tmp", "--entrypoint", "/bin/sh", ref, "-c", "read x")
			require.NoError(t, err)
			t.Cleanup(func() { _, _ = e.Docker(t.Context(), "rm", "-f", name) })
			// As envd starts a process: /bin/sh -c '... exec CMD', stdin
			// open for the payload.
			argv := append([]string{e.Client}, "exec", "-i", name, "/bin/sh", "-c",
				"exec /sbin/oac-guest helper --name "+name+" --allow "+publicAddr+":80")
			h := startHelper(t, name, argv, e.Env())
			row := "docker, E2B template, stopped by " + map[string]string{"stdin closed": "stdin EOF", "terminated signal received": "SIGTERM"}[stop]
			tb.check(t, row, h)
			pids := helperPIDs(name)
			require.NotEmpty(t, pids, "the helper's process")
			assert.NotEqual(t, "1", procStatus(t, pids[0], "NSpid")[len(procStatus(t, pids[0], "NSpid"))-1], "the helper is not the container's PID 1")
			if stop == "stdin closed" {
				require.NoError(t, h.stdin.Close())
			} else {
				require.NoError(t, syscall.Kill(pids[0], syscall.SIGTERM))
			}
			tb.stopped(t, row, h, stop)
		})
	}
}

func TestHelperGivesTheWorkloadANamespaceOfItsOwnWhenTheGuestHasOnlyLo(t *testing.T) {
	needBwrap(t)
	needImageBuild(t)
	// A platform may carry sockets out with no interface at all (libkrun's
	// socket impersonation): the workload's namespace is its own anyway.
	name := uniqueName("helper-lo")
	argv := bwrapHelperArgv(t, name)
	sep := slices.Index(argv, "--")
	argv = slices.Insert(argv, sep, "--unshare-net")
	h := startHelper(t, name, argv, nil)
	h.waitState(api.StateReady, bootTimeout)
	assert.NotEmpty(t, h.find(func(e api.Event) bool {
		return e.State == api.StateStarting && strings.Contains(e.Message, "workload network: a namespace of its own with only lo (always, in helper mode)")
	}))
	assert.Equal(t, "lo", h.waitLog("daemon: interfaces=", bootTimeout))
	require.NoError(t, h.stdin.Close())
	assert.Equal(t, 0, h.exit(30*time.Second))
	assert.Equal(t, "stopped: stdin closed", h.lastEvent().Message)
}
