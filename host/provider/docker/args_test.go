package docker

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/oac/sandbox-agent/host/provider"
)

func TestRunArgsAreExact(t *testing.T) {
	got := runArgs(runConfig{Name: "demo", Image: "oac/guest:1", Hostname: "box", RunDir: "/run/oac/sandboxes/demo/run", AgentPath: "/opt/oac/oac-guest",
		ResolvConf: "/run/oac/sandboxes/demo/resolv.conf", Seccomp: "/run/oac/sandboxes/demo/seccomp.json", AppArmor: "oac-guest", Volumes: map[string]string{"/environment": "/srv/env"},
		Installs: [][2]string{{"oac-daemon", "/opt/oac/daemon"}, {"oac-sandbox-io", "/opt/oac/sandbox-io"}}})
	assert.Equal(t, []string{
		"run", "--rm", "--name", "oac-demo", "--label", "oac.sandbox=demo", "--pull", "never", "--user", "0:0",
		"--network", "none", "--sysctl", "net.ipv6.conf.all.disable_ipv6=0", "--sysctl", "net.ipv6.conf.lo.disable_ipv6=0", "--read-only",
		"--cap-drop", "ALL", "--cap-add", "CHOWN", "--cap-add", "DAC_OVERRIDE", "--cap-add", "KILL", "--cap-add", "NET_ADMIN",
		"--cap-add", "NET_BIND_SERVICE", "--cap-add", "SETFCAP", "--cap-add", "SETGID", "--cap-add", "SETUID",
		"--security-opt", "no-new-privileges", "--security-opt", "seccomp=/run/oac/sandboxes/demo/seccomp.json",
		"--security-opt", "apparmor=oac-guest", "--pids-limit", "128",
		"--tmpfs", "/tmp:rw,nosuid,nodev,size=128m,mode=1777",
		"--tmpfs", "/run:rw,nosuid,nodev,size=16m,mode=755",
		"--mount", "type=bind,src=/run/oac/sandboxes/demo/run,dst=/run/oac",
		"--mount", "type=bind,src=/opt/oac/oac-guest,dst=/run/oac/oac-guest,readonly",
		"--mount", "type=bind,src=/run/oac/sandboxes/demo/resolv.conf,dst=/etc/resolv.conf,readonly",
		"--tmpfs", "/home:rw,nosuid,nodev,mode=755",
		"--mount", "type=bind,src=/srv/env,dst=/environment",
		"--mount", "type=bind,src=/opt/oac/daemon,dst=/usr/local/bin/oac-daemon,readonly",
		"--mount", "type=bind,src=/opt/oac/sandbox-io,dst=/usr/local/bin/oac-sandbox-io,readonly",
		"--hostname", "box",
		"--entrypoint", "/run/oac/oac-guest", "oac/guest:1", "--transport", "unix:///run/oac/agent.sock",
	}, got)
}

func TestMountArgQuotesWhatTheClientWouldSplit(t *testing.T) {
	assert.Equal(t, `type=bind,"src=/srv/a,b",dst=/home`, mountArg("type=bind", "src=/srv/a,b", "dst=/home"))
	assert.Equal(t, `type=bind,"src=/srv/""q""",dst=/home`, mountArg("type=bind", `src=/srv/"q"`, "dst=/home"))
}

func TestRunArgsWithoutHostnameWithDebug(t *testing.T) {
	got := runArgs(runConfig{Name: "a", Image: "img", RunDir: "/r", AgentPath: "/g", Debug: true})
	assert.NotContains(t, got, "--hostname")
	assert.Equal(t, []string{"img", "--transport", "unix:///run/oac/agent.sock", "--debug"}, got[len(got)-4:])
}

func TestOtherCommands(t *testing.T) {
	assert.Equal(t, []string{"kill", "oac-a"}, killArgs("a"))
	assert.Equal(t, []string{"rm", "--force", "oac-a"}, removeArgs("a"))
	assert.Equal(t, []string{"image", "inspect", "--format", "{{.Id}}", "img"}, imageArgs("img"))
	assert.Equal(t, []string{"version", "--format", "{{.Server.Version}}"}, versionArgs())
	assert.Equal(t, []string{"info", "--format", "{{json .SecurityOptions}}"}, securityArgs())
}

func TestClassify(t *testing.T) {
	exit := errors.New("exit status 1")
	tests := []struct {
		out  string
		want error
	}{
		{"Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?", provider.ErrUnavailable},
		{"permission denied while trying to connect to the Docker daemon socket at unix:///var/run/docker.sock", provider.ErrUnavailable},
		{"error during connect: this error may indicate that the docker daemon is not running", provider.ErrUnavailable},
		{"Error: No such image: oac/guest:1", provider.ErrInvalidSpec},
		{"Unable to find image 'oac/guest:1' locally", provider.ErrInvalidSpec},
		{"Error response from daemon: No such container: oac-a", ErrNoContainer},
		{"Error response from daemon: Cannot kill container: oac-a: Container 0123 is not running", ErrNoContainer},
		{`docker: Error response from daemon: Conflict. The container name "/oac-a" is already in use by container "0123".`, provider.ErrExists},
		{"Error response from daemon: removal of container oac-a is already in progress", errRemoving},
	}
	for _, tt := range tests {
		assert.ErrorIs(t, classify("x", tt.out, exit), tt.want, tt.out)
	}
	assert.EqualError(t, classify("run", "", exit), "docker: run: exit status 1")
}

func TestUsernsRemapped(t *testing.T) {
	assert.True(t, usernsRemapped(`["name=seccomp,profile=builtin","name=userns"]`))
	assert.False(t, usernsRemapped(`["name=seccomp,profile=builtin","name=cgroupns"]`))
}

func TestKeptContainerArgs(t *testing.T) {
	c := runConfig{Name: "demo", Image: "oac/guest:1", RunDir: "/run/oac/sandboxes/demo/run", AgentPath: "/opt/oac/oac-guest",
		Volumes: map[string]string{"/environment": "/srv/env"}}
	got := createArgs(c)
	digest := configDigest(c)
	assert.Equal(t, []string{"create", "--label", "oac.config=" + digest, "--name", "oac-demo", "--label", "oac.sandbox=demo", "--label", "oac.kept=1",
		"--pull", "never", "--user", "0:0", "--network", "none",
		"--sysctl", "net.ipv6.conf.all.disable_ipv6=0", "--sysctl", "net.ipv6.conf.lo.disable_ipv6=0", "--cap-drop", "ALL"}, got[:21],
		"made once, never removed by a run, its root writable")
	s := strings.Join(got, " ")
	assert.NotContains(t, s, "--rm")
	assert.NotContains(t, s, "--read-only")
	assert.NotContains(t, s, "--tmpfs /home", "/home is the container's own, kept with it")
	assert.Contains(t, s, "--mount type=bind,src=/srv/env,dst=/environment", "a volume still replaces its directory")
	assert.Contains(t, s, "--tmpfs /tmp", "/tmp and /run stay fresh each start")
	assert.Equal(t, "--kept", got[len(got)-1], "the agent gives /usr/local to uid 1000")

	other := c
	other.Image = "oac/guest:2"
	assert.Equal(t, digest, configDigest(other), "the image is not a setting: a changed image is said, not refused")
	other = c
	other.Installs = [][2]string{{"x", "/opt/x"}}
	assert.NotEqual(t, digest, configDigest(other))
	other = c
	other.Hostname = "box"
	assert.NotEqual(t, digest, configDigest(other))

	assert.Equal(t, []string{"start", "--attach", "oac-demo"}, startArgs("demo"))
	assert.Equal(t, []string{"stop", "--time", "0", "oac-demo"}, stopArgs("demo"))
	assert.Equal(t, []string{"rm", "--force", "--volumes", "oac-demo"}, discardArgs("demo"))
	assert.Equal(t, "container", inspectArgs("demo")[0])
}

func TestParseInspect(t *testing.T) {
	c, err := parseInspect("demo\n1\nabc\nsha256:1\ntrue\n")
	assert.NoError(t, err)
	assert.Equal(t, container{sandbox: "demo", kept: true, config: "abc", image: "sha256:1", running: true}, c)
	c, err = parseInspect("demo\n\n\nsha256:1\nfalse\n")
	assert.NoError(t, err)
	assert.Equal(t, container{sandbox: "demo", image: "sha256:1"}, c, "a throwaway sandbox's container")
	_, err = parseInspect("garbage")
	assert.Error(t, err)
}
