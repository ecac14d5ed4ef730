package bwrap

import (
	"strings"
	"testing"

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
		HostEntries: []hostEntry{{Path: "/usr"}, {Path: "/bin", Symlink: "usr/bin"}},
		EtcFiles:    [][2]string{{"/etc/passwd", "/run/oac/sandboxes/x/etc/passwd"}},
		AgentFD:     3, SocketFD: 4,
	})
	s := strings.Join(a, " ")
	assert.Contains(t, s, "--ro-bind /usr /usr --symlink usr/bin /bin --dir /etc --ro-bind /run/oac/sandboxes/x/etc/passwd /etc/passwd")
	assert.NotContains(t, s, "--ro-bind-fd 5 /")
}

func TestArgsRootfsIsBoundReadOnlyFromItsDescriptorFirst(t *testing.T) {
	a := buildArgs(argsConfig{RootFD: 5, HostEntries: []hostEntry{{Path: "/usr"}}, AgentFD: 3, SocketFD: 4})
	s := strings.Join(a, " ")
	assert.Contains(t, s, "--ro-bind-fd 5 / --proc /proc")
	assert.NotContains(t, s, "--ro-bind /usr", "host entries are ignored with a rootfs")
}

func TestIdentityFilesNameTheRuntimeUser(t *testing.T) {
	assert.Contains(t, passwd(), "runtime:x:1000:1000:runtime:/home/runtime:/bin/sh\n")
	assert.Contains(t, group(), "runtime:x:1000:\n")
	assert.Contains(t, hosts("demo"), "127.0.1.1\tdemo\n")
	assert.NotContains(t, hosts(""), "127.0.1.1")
}
