//go:build linux

package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/host/api"
)

// No Docker engine runs on the build machines: the docker provider runs
// here against a fake docker client (internal/fakedocker) that records its
// argv and runs the real oac-guest from the agent bind mount, dialing the
// bound socket. The argv, the provider's error handling and the session are
// real; the container isolation is not (see the unit tests of the argv).

type fakeDocker struct {
	state string
	env   []string
}

func newFakeDocker(t *testing.T, mode string) *fakeDocker {
	state := t.TempDir()
	return &fakeDocker{state: state, env: []string{"OAC_FAKE_DOCKER_STATE=" + state, "OAC_FAKE_DOCKER_MODE=" + mode}}
}

func (d *fakeDocker) args() []string {
	return []string{"--docker", bins.fakeDocker, "--docker-image", "registry.example/oac/guest:1"}
}

func (d *fakeDocker) calls(t *testing.T) [][]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(d.state, "argv.log"))
	require.NoError(t, err)
	var out [][]string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var argv []string
		require.NoError(t, json.Unmarshal([]byte(line), &argv))
		out = append(out, argv)
	}
	return out
}

func needRootForState(t *testing.T) {
	t.Helper()
	need(t, os.Geteuid() == 0, "the docker and wsl e2e tests keep state in /run/oac: run them as root (sudo make test)")
}

func TestDockerRunsTheGuestWithTheExactHardenedArgv(t *testing.T) {
	needRootForState(t)
	d := newFakeDocker(t, "")
	s := startShim(t, sandboxSpec{provider: "docker", env: d.env, args: d.args(),
		bootstrap: daemon(`trap 'echo daemon got TERM; exit 0' TERM; echo "uid=$(id -u)"; sleep 1000 & wait`, `"hostname":"dock"`)})
	s.waitState(api.StateReady, bootTimeout)
	assert.Equal(t, "1000", s.waitLog("uid=", bootTimeout))
	s.signal(syscall.SIGTERM)
	s.waitLog("daemon got TERM", 10*time.Second)
	assert.Equal(t, 0, s.exit(15*time.Second))

	name := "oac-" + s.name
	runDir := filepath.Join("/run/oac/sandboxes", s.name, "run")
	calls := d.calls(t)
	var verbs []string
	for _, c := range calls {
		verbs = append(verbs, c[0])
	}
	assert.Equal(t, []string{"version", "image", "rm", "run", "rm"}, verbs)
	assert.Equal(t, []string{"image", "inspect", "--format", "{{.Id}}", "registry.example/oac/guest:1"}, calls[1])
	assert.Equal(t, []string{"rm", "--force", name}, calls[2], "a stale container of the name is removed first")
	assert.Equal(t, []string{
		"run", "--rm", "--name", name, "--label", "oac.sandbox=" + s.name, "--pull", "never", "--user", "0:0",
		"--network", "none", "--read-only", "--cap-drop", "ALL", "--cap-add", "KILL", "--cap-add", "SETGID", "--cap-add", "SETUID",
		"--security-opt", "no-new-privileges", "--pids-limit", "128",
		"--tmpfs", "/tmp:rw,nosuid,nodev,size=128m,mode=1777", "--tmpfs", "/run:rw,nosuid,nodev,size=16m,mode=755",
		"--mount", "type=bind,src=" + runDir + ",dst=/run/oac",
		"--mount", "type=bind,src=" + bins.guest + ",dst=/run/oac/oac-guest,readonly",
		"--hostname", "dock",
		"--entrypoint", "/run/oac/oac-guest", "registry.example/oac/guest:1", "--transport", "unix:///run/oac/agent.sock",
	}, calls[3])
	assert.Equal(t, []string{"rm", "--force", name}, calls[4])
	assert.NoDirExists(t, filepath.Join("/run/oac/sandboxes", s.name))
}

func TestDockerClientKilledIsFailedAndTheContainerRemoved(t *testing.T) {
	needRootForState(t)
	d := newFakeDocker(t, "")
	marker := sleepMarker()
	s := startShim(t, sandboxSpec{provider: "docker", env: d.env, args: d.args(), bootstrap: daemon("exec " + marker)})
	s.waitState(api.StateReady, bootTimeout)
	var clients []int
	require.Eventually(t, func() bool {
		clients = filterCmdline(hostProcs("oac.sandbox="+s.name), bins.fakeDocker+" run")
		return len(clients) == 1
	}, 5*time.Second, 20*time.Millisecond)
	require.NoError(t, syscall.Kill(clients[0], syscall.SIGKILL))

	failed := s.waitState(api.StateFailed, 10*time.Second)
	assert.Contains(t, failed.Message, "sandbox runtime exited: docker run")
	s.exitFailed(api.CodeRuntimeFailed, 15*time.Second)
	calls := d.calls(t)
	assert.Equal(t, []string{"rm", "--force", "oac-" + s.name}, calls[len(calls)-1], "the container outlives its client: it is removed")
	assert.Eventually(t, func() bool { return len(hostProcs(marker)) == 0 }, 5*time.Second, 20*time.Millisecond)
}

func TestDockerWithoutEngineOrImageFailsClearly(t *testing.T) {
	needRootForState(t)
	d := newFakeDocker(t, "noengine")
	cmd := exec.Command(bins.shim, append([]string{"check"}, d.args()...)...)
	cmd.Env = append(os.Environ(), d.env...)
	out, _ := cmd.Output()
	assert.Contains(t, string(out), "docker: unavailable: provider unavailable: docker: no Docker engine reachable: ")
	assert.Contains(t, string(out), "Is the docker daemon running?")

	s := startShim(t, sandboxSpec{provider: "docker", env: d.env, args: d.args()})
	failed := s.waitState(api.StateFailed, 10*time.Second)
	assert.Contains(t, failed.Message, "no Docker engine reachable")
	s.exitFailed(api.CodeProviderUnavailable, 10*time.Second)

	d = newFakeDocker(t, "noimage")
	s = startShim(t, sandboxSpec{provider: "docker", env: d.env, args: d.args()})
	failed = s.waitState(api.StateFailed, 10*time.Second)
	assert.Contains(t, failed.Message, "invalid sandbox spec: docker: image registry.example/oac/guest:1: Error: No such image")
	assert.Contains(t, failed.Message, "the provider never pulls")
	s.exitFailed(api.CodeInvalidConfig, 10*time.Second)
	for _, c := range d.calls(t) {
		assert.NotEqual(t, "run", c[0], "nothing was run")
	}
	assert.NoDirExists(t, filepath.Join("/run/oac/sandboxes", s.name))
}
