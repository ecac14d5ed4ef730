//go:build linux

package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/host/api"
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

// keepsTheContract checks what a ready helper sandbox promises.
func (h *helperRun) keepsTheContract(t *testing.T) {
	t.Helper()
	ready := h.waitState(api.StateReady, bootTimeout)
	assert.Equal(t, fmt.Sprintf("http://127.0.0.1:%d", daemonPort), ready.URL)
	assert.Equal(t, "runtime", ready.Username)
	all, _ := h.allEvents()
	for _, e := range all {
		assert.Equal(t, api.ModeHelper, e.Mode, "every event says helper: %+v", e)
	}
	assert.NotEmpty(t, h.find(func(e api.Event) bool {
		return e.State == api.StateStarting && strings.Contains(e.Message, "the Link is allowed by default (link "+publicAddr+":443)")
	}), "the starting event says the Link is allowed")
	policy := h.waitFor(func(e api.Event) bool { return e.Event == api.KindEgressPolicy }, bootTimeout, "egress_policy")
	assert.Equal(t, []string{publicAddr + "/32:80", "link " + publicAddr + ":443"}, policy.Rules, "the operator's rule and the Link's")

	// The contract, as the stand-ins see it.
	for prefix, want := range map[string]string{
		"daemon: ids=":                   "uid=1000 gid=1000 groups=[]",
		"daemon: nnp=":                   "1",
		"daemon: caps=":                  "inh=0000000000000000 prm=0000000000000000 eff=0000000000000000 amb=0000000000000000",
		"daemon: interfaces=":            "lo",
		"sandbox-io: credential-sha256=": bootstrap.CredentialDigest(linkCredential),
	} {
		assert.Equal(t, want, h.waitLog(prefix, bootTimeout), prefix)
	}
	assert.NotEqual(t, "ok", h.waitLog("daemon: read-private-file=", bootTimeout), "the daemon cannot read oac-sandbox-io's private file")
	assert.Equal(t, "mode=0600 type=regular uid=1000 gid=1000", h.waitLog("sandbox-io: file=", bootTimeout), "the private file")
	assert.Equal(t, "mode=0700 uid=1000 gid=1000", h.waitLog("sandbox-io: dir=", bootTimeout))
	assert.True(t, strings.HasPrefix(h.waitLog("sandbox-io: link=", bootTimeout), "connected status=101"), "oac-sandbox-io reached its Link")

	// Egress: allowed and denied, each with its event, through the
	// proxies and direct (the capture); the Link with no rule.
	assert.True(t, strings.HasPrefix(h.waitLog("daemon: probe proxy-allowed=", bootTimeout), "ok 200 public web: /proxy"))
	assert.True(t, strings.HasPrefix(h.waitLog("daemon: probe direct-allowed=", bootTimeout), "ok 200 public web: /direct"))
	assert.Contains(t, h.waitLog("daemon: probe proxy-denied=", bootTimeout), "403")
	assert.NotContains(t, h.waitLog("daemon: probe direct-denied=", bootTimeout), "ok 200")
	egressEvent := func(target, decision string) api.Event {
		return h.waitFor(func(e api.Event) bool {
			return e.Event == api.KindEgress && e.Target == target && e.Decision == decision
		}, bootTimeout, "egress "+decision+" "+target)
	}
	assert.Equal(t, publicAddr+"/32:80", egressEvent(publicAddr+":80", "allowed").Rule)
	assert.Equal(t, "Denied", egressEvent("denied.test:8081", "denied").Code)
	assert.Equal(t, "Denied", egressEvent(publicAddr+":8080", "denied").Code)
	assert.Equal(t, "link "+publicAddr+":443", egressEvent(publicAddr+":443", "allowed").Rule, "the Link, reached with no rule")
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
	for _, stop := range []string{"stdin closed", "terminated signal received"} {
		t.Run(strings.ReplaceAll(stop, " ", "-"), func(t *testing.T) {
			name := uniqueName("helper-bwrap")
			h := startHelper(t, name, bwrapHelperArgv(t, name), nil)
			h.keepsTheContract(t)
			if stop == "stdin closed" {
				require.NoError(t, h.stdin.Close())
			} else {
				pids := helperPIDs(name)
				require.NotEmpty(t, pids, "the helper's process")
				require.NoError(t, syscall.Kill(pids[0], syscall.SIGTERM))
			}
			h.stopsLeavingNothing(t, stop)
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
			h.keepsTheContract(t)
			pids := helperPIDs(name)
			require.NotEmpty(t, pids, "the helper's process")
			assert.NotEqual(t, "1", procStatus(t, pids[0], "NSpid")[len(procStatus(t, pids[0], "NSpid"))-1], "the helper is not the container's PID 1")
			if stop == "stdin closed" {
				require.NoError(t, h.stdin.Close())
			} else {
				require.NoError(t, syscall.Kill(pids[0], syscall.SIGTERM))
			}
			h.stopsLeavingNothing(t, stop)
		})
	}
}
