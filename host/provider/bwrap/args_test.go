package bwrap

import (
	"strings"
	"testing"

	"github.com/oac/sandbox-agent/host/provider/kit"
	"github.com/stretchr/testify/assert"
)

func TestArgsIsolateEveryNamespaceAndRunTheAgentAsPID1(t *testing.T) {
	a := strings.Join(buildArgs(argsConfig{RootFD: -1, AgentFD: 3, SocketFD: 4}), " ")
	for _, want := range []string{"--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup", "--die-with-parent", "--as-pid-1", "--new-session", "--clearenv"} {
		assert.Contains(t, a, want)
	}
	assert.NotContains(t, a, "--share-net")
	assert.NotContains(t, a, "--unshare-user", "the user namespace with an id range is made by the shim, not bwrap")
	assert.True(t, strings.HasSuffix(a, "--ro-bind-fd 3 /run/oac/oac-guest --bind-fd 4 /run/oac/agent.sock --chdir / --setenv PATH /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin /run/oac/oac-guest --transport unix:///run/oac/agent.sock"), a)
}

func TestArgsDefaultRootIsAReadOnlyViewOfTheHost(t *testing.T) {
	a := buildArgs(argsConfig{
		RootFD:      -1,
		HostEntries: []kit.HostEntry{{Path: "/usr"}, {Path: "/bin", Symlink: "usr/bin"}},
		EtcDir:      "/run/oac/etc/etc-0123",
		EtcFiles:    [][2]string{{"/etc/hosts", "/run/oac/sandboxes/x/hosts"}},
		AgentFD:     3, SocketFD: 4,
	})
	s := strings.Join(a, " ")
	assert.Contains(t, s, "--ro-bind /usr /usr --symlink usr/bin /bin --ro-bind /run/oac/etc/etc-0123 /etc --ro-bind /run/oac/sandboxes/x/hosts /etc/hosts",
		"one prepared /etc, the sandbox's hosts over it")
	assert.NotContains(t, s, "--ro-bind-fd 5 /")
}

func TestArgsRootfsIsBoundReadOnlyFromItsDescriptorFirst(t *testing.T) {
	a := buildArgs(argsConfig{RootFD: 5, HostEntries: []kit.HostEntry{{Path: "/usr"}}, AgentFD: 3, SocketFD: 4})
	s := strings.Join(a, " ")
	assert.Contains(t, s, "--ro-bind-fd 5 / --proc /proc")
	assert.NotContains(t, s, "--ro-bind /usr", "host entries are ignored with a rootfs")
}

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

func TestBinariesTheGuestCannotReachAreCopiedIn(t *testing.T) {
	a := strings.Join(buildArgs(argsConfig{
		RootFD: -1, AgentFD: 3, AgentCopy: true, SocketFD: 4,
		Installs: []installFD{{Name: "reachable", FD: 5}, {Name: "private", FD: 6, Copy: true}},
	}), " ")
	assert.Contains(t, a, "--dir /run/oac --perms 0755 --ro-bind-data 3 /run/oac/oac-guest --bind-fd 4 /run/oac/agent.sock")
	assert.Contains(t, a, "--ro-bind-fd 5 /usr/local/bin/reachable --perms 0755 --ro-bind-data 6 /usr/local/bin/private")
}
