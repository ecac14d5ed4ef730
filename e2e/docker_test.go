//go:build linux

package e2e

import (
	"context"
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

	"github.com/oac/sandbox-agent/api"
)

// The docker provider runs against a real Docker engine (needDocker: the
// one that answers, else a private dockerd with vfs storage) and the
// run's image, imported from oac-image's rootfs tarball. Its client is
// the real one behind internal/dockerrec, which records every argv, so
// the tests assert the exact command lines as well as what the engine did.

type dockerRecorder struct {
	log string
	env []string
}

// newDockerRecorder records the provider's docker commands and runs them
// with the real client against the engine.
func newDockerRecorder(t *testing.T) *dockerRecorder {
	t.Helper()
	e := needDocker(t)
	log := filepath.Join(t.TempDir(), "argv.log")
	return &dockerRecorder{log: log, env: append(e.Env(), "OAC_DOCKER_REC_LOG="+log, "OAC_DOCKER_REC_REAL="+e.Client)}
}

func (d *dockerRecorder) calls(t *testing.T) [][]string {
	t.Helper()
	b, err := os.ReadFile(d.log)
	require.NoError(t, err)
	var out [][]string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var argv []string
		require.NoError(t, json.Unmarshal([]byte(line), &argv))
		out = append(out, argv)
	}
	return out
}

// dockerContainers lists the engine's containers (running or not) named
// like the sandbox's.
func dockerContainers(t *testing.T, name string) []string {
	t.Helper()
	out, err := needDocker(t).Docker(context.Background(), "ps", "--all", "--quiet", "--filter", "name=^oac-"+name+"$")
	require.NoError(t, err)
	return strings.Fields(out)
}

// standinDaemon is a bootstrap whose daemon is the daemon stand-in (the
// run's image has no shell), with a marker to find it on the host.
func standinDaemon(marker string) string {
	argv, _ := json.Marshal([]string{daemonBin, "serve", "--hostname", "127.0.0.1", "--port", "4096", "--marker", marker})
	return `{"version":1,"hostname":"dock","stop_grace":"2s","daemon":{"argv":` + string(argv) + `},` +
		`"credentials":{"username_env":"OAC_SERVER_USERNAME","password_env":"OAC_SERVER_PASSWORD"},"health":{"port":4096}}`
}

func TestDockerRunsTheGuestWithTheExactHardenedArgv(t *testing.T) {
	d := newDockerRecorder(t)
	image := dockerImage(t)
	name := uniqueName("dock")
	s := startShim(t, sandboxSpec{provider: "docker", name: name, env: d.env,
		args:      []string{"--docker", bins.dockerRec, "--docker-image", image, "--install", "oac-daemon-standin=" + bins.daemon},
		bootstrap: standinDaemon(name)})
	ready := s.waitState(api.StateReady, bootTimeout)
	t.Logf("docker: %s", ready.Message)
	assert.Equal(t, "uid=1000 gid=1000 groups=[]", s.waitLog("daemon: ids=", bootTimeout))
	assert.Equal(t, "inh=0000000000000000 prm=0000000000000000 eff=0000000000000000 amb=0000000000000000", s.waitLog("daemon: caps=", bootTimeout))
	assert.Equal(t, "1", s.waitLog("daemon: nnp=", bootTimeout))
	assert.Equal(t, "lo", s.waitLog("daemon: interfaces=", bootTimeout), "--network none: only lo")
	assert.Len(t, dockerContainers(t, name), 1, "a real container runs")
	s.signal(syscall.SIGTERM)
	s.waitLog("daemon: got terminated", 10*time.Second)
	assert.Equal(t, 0, s.exit(15*time.Second))
	assert.Empty(t, dockerContainers(t, name), "the container is removed")

	cname := "oac-" + name
	stateDir := filepath.Join("/run/oac/sandboxes", name)
	calls := d.calls(t)
	var verbs []string
	for _, c := range calls {
		verbs = append(verbs, c[0])
	}
	// Destroy's rm is repeated while the engine's own --rm removal of the
	// stopped container is under way ("removal ... already in progress").
	require.GreaterOrEqual(t, len(verbs), 7)
	assert.Equal(t, []string{"version", "image", "info", "container", "rm", "run", "rm"}, verbs[:7])
	for _, c := range calls[7:] {
		assert.Equal(t, []string{"rm", "--force", cname}, c, "only destroy's rm, repeated")
	}
	assert.Equal(t, []string{"image", "inspect", "--format", "{{.Id}}", image}, calls[1])
	assert.Equal(t, []string{"info", "--format", "{{json .SecurityOptions}}"}, calls[2], "the engine says whether it confines with AppArmor (this one does not: no profile is named below)")
	assert.Equal(t, []string{"container", "inspect"}, calls[3][:2], "a container of the name is looked at first: a kept sandbox's is never removed")
	assert.Equal(t, []string{"rm", "--force", cname}, calls[4], "a stale container of the name is removed first")
	assert.Equal(t, []string{
		"run", "--rm", "--name", cname, "--label", "oac.sandbox=" + name, "--pull", "never", "--user", "0:0",
		"--network", "none", "--sysctl", "net.ipv6.conf.all.disable_ipv6=0", "--sysctl", "net.ipv6.conf.lo.disable_ipv6=0", "--read-only",
		"--cap-drop", "ALL", "--cap-add", "CHOWN", "--cap-add", "DAC_OVERRIDE", "--cap-add", "KILL", "--cap-add", "NET_ADMIN",
		"--cap-add", "NET_BIND_SERVICE", "--cap-add", "SETFCAP", "--cap-add", "SETGID", "--cap-add", "SETUID",
		"--security-opt", "no-new-privileges", "--security-opt", "seccomp=" + stateDir + "/seccomp.json", "--pids-limit", "128",
		"--tmpfs", "/tmp:rw,nosuid,nodev,size=128m,mode=1777", "--tmpfs", "/run:rw,nosuid,nodev,size=16m,mode=755",
		"--mount", "type=bind,src=" + stateDir + "/run,dst=/run/oac",
		"--mount", "type=bind,src=" + bins.guest + ",dst=/run/oac/oac-guest,readonly",
		"--mount", "type=bind,src=" + stateDir + "/resolv.conf,dst=/etc/resolv.conf,readonly",
		"--tmpfs", "/home:rw,nosuid,nodev,mode=755", "--tmpfs", "/environment:rw,nosuid,nodev,mode=755",
		"--mount", "type=bind,src=" + bins.daemon + ",dst=/usr/local/bin/oac-daemon-standin,readonly",
		"--hostname", "dock",
		"--entrypoint", "/run/oac/oac-guest", image, "--transport", "unix:///run/oac/agent.sock",
	}, calls[5])
	assert.Equal(t, []string{"rm", "--force", cname}, calls[6])
	assert.NoDirExists(t, stateDir)
}

func TestDockerClientKilledIsFailedAndTheContainerRemoved(t *testing.T) {
	d := newDockerRecorder(t)
	image := dockerImage(t)
	name := uniqueName("dock")
	s := startShim(t, sandboxSpec{provider: "docker", name: name, env: d.env,
		args: []string{"--docker", bins.dockerRec, "--docker-image", image}, bootstrap: standinDaemon(name)})
	s.waitState(api.StateReady, bootTimeout)
	var clients []int
	require.Eventually(t, func() bool {
		clients = hostProcs("oac.sandbox=" + name)
		return len(clients) == 1
	}, 5*time.Second, 20*time.Millisecond)
	require.NoError(t, syscall.Kill(clients[0], syscall.SIGKILL))

	failed := s.waitState(api.StateFailed, 10*time.Second)
	assert.Contains(t, failed.Message, "sandbox runtime exited: docker run")
	s.exitFailed(api.CodeRuntimeFailed, 15*time.Second)
	calls := d.calls(t)
	assert.Equal(t, []string{"rm", "--force", "oac-" + name}, calls[len(calls)-1], "the container outlives its client: it is removed")
	assert.Empty(t, dockerContainers(t, name))
	assert.Eventually(t, func() bool { return len(hostProcs("--marker "+name)) == 0 }, 5*time.Second, 20*time.Millisecond)
}

func TestDockerWithoutEngineOrImageFailsClearly(t *testing.T) {
	needDocker(t)
	noEngine := []string{"DOCKER_HOST=unix://" + filepath.Join(t.TempDir(), "no-engine.sock")}
	cmd := exec.Command(bins.shim, "check", "--docker-image", "oac-e2e/none:1")
	cmd.Env = append(os.Environ(), noEngine...)
	out, _ := cmd.Output()
	assert.Contains(t, string(out), "docker: unavailable: provider unavailable: docker: no Docker engine reachable: ")
	assert.Contains(t, string(out), "Is the docker daemon running?")

	s := startShim(t, sandboxSpec{provider: "docker", env: noEngine, args: []string{"--docker-image", "oac-e2e/none:1"}})
	failed := s.waitState(api.StateFailed, 10*time.Second)
	assert.Contains(t, failed.Message, "no Docker engine reachable")
	s.exitFailed(api.CodeProviderUnavailable, 10*time.Second)

	d := newDockerRecorder(t)
	name := uniqueName("dock")
	s = startShim(t, sandboxSpec{provider: "docker", name: name, env: d.env, args: []string{"--docker", bins.dockerRec, "--docker-image", "oac-e2e/absent:1"}})
	failed = s.waitState(api.StateFailed, 10*time.Second)
	assert.Contains(t, failed.Message, "invalid sandbox spec: docker: image oac-e2e/absent:1: ")
	assert.Contains(t, failed.Message, "No such image")
	assert.Contains(t, failed.Message, "the provider never pulls")
	s.exitFailed(api.CodeInvalidConfig, 10*time.Second)
	for _, c := range d.calls(t) {
		assert.NotEqual(t, "run", c[0], "nothing was run")
	}
	assert.NoDirExists(t, filepath.Join("/run/oac/sandboxes", name))

	// oac-shim check names what the provider needs and whether it is
	// there: the client, the engine, the image.
	cmd = exec.Command(bins.shim, "check", "--docker-image", dockerImage(t))
	cmd.Env = append(os.Environ(), needDocker(t).Env()...)
	out, _ = cmd.Output()
	assert.Regexp(t, `docker: available \(client \S+docker, engine \S+ at unix://\S+, image oac-e2e/guest:\S+ \(sha256:[0-9a-f]{12}\); the engine runs without userns-remap: guest root is host root with capabilities CHOWN, DAC_OVERRIDE, KILL, NET_ADMIN, NET_BIND_SERVICE, SETFCAP, SETGID, SETUID only(; the Docker engine (does not confine containers with AppArmor|confines containers with AppArmor[^)]*))?\); honours --sandbox-io, --install, --volume`, string(out))
}
