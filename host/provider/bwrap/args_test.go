package bwrap

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestDefaultRootGetsRuntimeTmpfsAndAReadOnlyInstallDir(t *testing.T) {
	a := strings.Join(buildArgs(argsConfig{
		RootFD: -1, AgentFD: 3, SocketFD: 4, Tmpfs: RuntimeDirs,
		Installs: []installFD{{Name: "oac-sandbox-io", FD: 5}},
	}), " ")
	assert.Contains(t, a, "--perms 0755 --tmpfs /home --perms 0755 --tmpfs /environment")
	assert.Contains(t, a, "--perms 0755 --tmpfs /usr/local --perms 0755 --dir /usr/local/bin --ro-bind-fd 5 /usr/local/bin/oac-sandbox-io --remount-ro /usr/local")
	assert.True(t, strings.HasSuffix(a, "/run/oac/oac-guest --transport unix:///run/oac/agent.sock"), "the agent command comes last")
}

func TestVolumesReplaceTheTmpfsAndARootfsKeepsItsUsrLocal(t *testing.T) {
	a := strings.Join(buildArgs(argsConfig{
		RootFD: 6, AgentFD: 3, SocketFD: 4, Tmpfs: []string{"/environment"},
		Volumes:  []volumeFD{{Dir: "/home", FD: 8}},
		Installs: []installFD{{Name: "tool", FD: 7}},
	}), " ")
	assert.Contains(t, a, "--ro-bind-fd 6 /")
	assert.Contains(t, a, "--bind-fd 8 /home")
	assert.NotContains(t, a, "--tmpfs /home")
	assert.Contains(t, a, "--ro-bind-fd 7 /usr/local/bin/tool")
	assert.NotContains(t, a, "--tmpfs /usr/local", "a rootfs's own /usr/local is not hidden")
}

func TestNoInstallsLeaveUsrLocalAlone(t *testing.T) {
	a := strings.Join(buildArgs(argsConfig{RootFD: -1, AgentFD: 3, SocketFD: 4}), " ")
	assert.NotContains(t, a, "--tmpfs /usr/local")
	assert.NotContains(t, a, "/usr/local/bin/")
}
