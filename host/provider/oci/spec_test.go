package oci

import (
	"encoding/json"
	"errors"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/provider/kit"
)

func testConfig() bundleConfig {
	return bundleConfig{
		RootPath:    "/run/oac/sandboxes/a/rootfs",
		HostEntries: []kit.HostEntry{{Path: "/usr"}, {Path: "/bin", Symlink: "usr/bin"}},
		EtcFiles:    [][2]string{{"/etc/passwd", "/run/oac/sandboxes/a/etc/passwd"}},
		RunDir:      "/run/oac/sandboxes/a/run",
		AgentPath:   "/opt/oac/oac-guest",
		Hostname:    "box",
		IDBase:      1_000_065_536, IDSize: 65536,
		CgroupsPath:     "/oac/a",
		NoNewPrivileges: true,
	}
}

func mountByDest(s *specs.Spec, dest string) *specs.Mount {
	for i := range s.Mounts {
		if s.Mounts[i].Destination == dest {
			return &s.Mounts[i]
		}
	}
	return nil
}

func TestSpecIsHardened(t *testing.T) {
	s := buildSpec(testConfig())

	assert.Equal(t, "1.0.2", s.Version)
	assert.True(t, s.Root.Readonly, "read-only root")
	assert.Equal(t, "/run/oac/sandboxes/a/rootfs", s.Root.Path)
	assert.Equal(t, "box", s.Hostname)
	assert.Equal(t, []string{"/run/oac/oac-guest", "--transport", "unix:///run/oac/agent.sock"}, s.Process.Args)
	assert.Equal(t, specs.User{UID: 0, GID: 0}, s.Process.User, "the agent is guest root; it switches the daemon to 1000")
	assert.True(t, s.Process.NoNewPrivileges)
	assert.False(t, s.Process.Terminal)
	want := []string{"CAP_KILL", "CAP_NET_ADMIN", "CAP_NET_BIND_SERVICE", "CAP_SETFCAP", "CAP_SETGID", "CAP_SETUID"}
	assert.Equal(t, want, s.Process.Capabilities.Bounding)
	assert.Equal(t, want, s.Process.Capabilities.Effective)
	assert.Equal(t, want, s.Process.Capabilities.Permitted)
	assert.Empty(t, s.Process.Capabilities.Inheritable, "nothing is inherited by the daemon")
	assert.Empty(t, s.Process.Capabilities.Ambient)

	var ns []specs.LinuxNamespaceType
	for _, n := range s.Linux.Namespaces {
		assert.Empty(t, n.Path, "every namespace is new")
		ns = append(ns, n.Type)
	}
	assert.ElementsMatch(t, []specs.LinuxNamespaceType{"user", "pid", "network", "ipc", "uts", "mount", "cgroup"}, ns)
	idmap := []specs.LinuxIDMapping{{ContainerID: 0, HostID: 1_000_065_536, Size: 65536}}
	assert.Equal(t, idmap, s.Linux.UIDMappings)
	assert.Equal(t, idmap, s.Linux.GIDMappings)
	require.NotNil(t, s.Linux.Resources.Pids.Limit)
	assert.Equal(t, int64(128), *s.Linux.Resources.Pids.Limit)
	assert.Equal(t, "/oac/a", s.Linux.CgroupsPath)
	assert.Equal(t, []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}}, s.Linux.Resources.Devices)
	require.NotNil(t, s.Linux.Seccomp)
	assert.Equal(t, specs.ActAllow, s.Linux.Seccomp.DefaultAction)
	assert.Contains(t, s.Linux.Seccomp.Syscalls[0].Names, "bpf")
	assert.Equal(t, specs.ActErrno, s.Linux.Seccomp.Syscalls[0].Action)
	assert.Contains(t, s.Linux.MaskedPaths, "/proc/kcore")
}

func TestSpecMountsTmpfsAndTheTransport(t *testing.T) {
	s := buildSpec(testConfig())

	tmp := mountByDest(s, "/tmp")
	require.NotNil(t, tmp)
	assert.Equal(t, "tmpfs", tmp.Type)
	assert.Contains(t, tmp.Options, "size=128m")
	assert.Contains(t, tmp.Options, "mode=1777")
	assert.Contains(t, tmp.Options, "nosuid")
	run := mountByDest(s, "/run")
	require.NotNil(t, run)
	assert.Equal(t, "tmpfs", run.Type)

	sock := mountByDest(s, "/run/oac")
	require.NotNil(t, sock)
	assert.Equal(t, "/run/oac/sandboxes/a/run", sock.Source)
	agent := mountByDest(s, "/run/oac/oac-guest")
	require.NotNil(t, agent)
	assert.Equal(t, "/opt/oac/oac-guest", agent.Source)
	assert.Contains(t, agent.Options, "ro")

	usr := mountByDest(s, "/usr")
	require.NotNil(t, usr)
	assert.Contains(t, usr.Options, "ro")
	assert.Nil(t, mountByDest(s, "/bin"), "a symlink of the default root is made in the skeleton, not mounted")
	assert.NotNil(t, mountByDest(s, "/etc/passwd"))

	// Order: /run before what is bound under it, /run/oac before the agent.
	idx := map[string]int{}
	for i, m := range s.Mounts {
		idx[m.Destination] = i
	}
	assert.Less(t, idx["/run"], idx["/run/oac"])
	assert.Less(t, idx["/run/oac"], idx["/run/oac/oac-guest"])
	assert.Less(t, idx["/dev"], idx["/dev/pts"])
}

func TestSpecWithARootfsDirectoryBindsNoHostDirectories(t *testing.T) {
	c := testConfig()
	c.RootPath, c.HostEntries, c.EtcFiles = "/images/guest", nil, nil
	s := buildSpec(c)
	assert.Equal(t, "/images/guest", s.Root.Path)
	assert.Nil(t, mountByDest(s, "/usr"))
	assert.Nil(t, mountByDest(s, "/etc/passwd"))
}

func TestSpecMarshalsToConfigJSON(t *testing.T) {
	b, err := json.Marshal(buildSpec(testConfig()))
	require.NoError(t, err)
	var back map[string]any
	require.NoError(t, json.Unmarshal(b, &back))
	assert.Equal(t, "1.0.2", back["ociVersion"])
	assert.Contains(t, string(b), `"noNewPrivileges":true`)
	assert.Contains(t, string(b), `"readonly":true`)
}

func TestDebugAddsTheAgentFlag(t *testing.T) {
	c := testConfig()
	c.Debug = true
	assert.Equal(t, "--debug", buildSpec(c).Process.Args[3])
}

func TestContainerIDAndCgroup(t *testing.T) {
	assert.Equal(t, "oac-demo", ContainerID("demo"))
	assert.Equal(t, "/oac/demo", cgroupsPath("demo"))
}

func TestRuntimeArgv(t *testing.T) {
	runc := runtimeCmd{Kind: RuntimeRunc, Path: "/usr/sbin/runc"}
	assert.Equal(t, []string{"/usr/sbin/runc", "run", "--bundle", "/b", "--no-new-keyring", "oac-a"}, runc.argv(runArgs("/b", "oac-a")...))
	assert.Equal(t, []string{"/usr/sbin/runc", "kill", "oac-a", "KILL"}, runc.argv(killArgs("oac-a")...))
	assert.Equal(t, []string{"/usr/sbin/runc", "delete", "--force", "oac-a"}, runc.argv(deleteArgs("oac-a")...))

	crun := runtimeCmd{Kind: RuntimeCrun, Path: "/usr/bin/crun", HideCgroup2: "/sys/fs/cgroup/unified", Sh: "/bin/sh", Umount: "/bin/umount"}
	assert.Equal(t, []string{"/bin/sh", "-c", `"$0" -l -- "$1" && shift && exec "$@"`, "/bin/umount", "/sys/fs/cgroup/unified",
		"/usr/bin/crun", "kill", "oac-a", "KILL"}, crun.argv(killArgs("oac-a")...))
	assert.Contains(t, crun.Detail(), "hidden from crun")
}

func TestKind(t *testing.T) {
	assert.Equal(t, RuntimeRunc, Kind("/usr/sbin/runc"))
	assert.Equal(t, RuntimeCrun, Kind("crun"))
	assert.Equal(t, "", Kind("/usr/bin/youki"))
}

func TestDiagnose(t *testing.T) {
	ok := Facts{Root: true, RuntimePath: "/usr/sbin/runc", Layout: CgroupHybrid, Unified: "/sys/fs/cgroup/unified", Sh: "/bin/sh", Umount: "/bin/umount"}
	tests := []struct {
		name     string
		edit     func(*Facts)
		problems []string
		hide     string
	}{
		{"runc on hybrid needs nothing", func(*Facts) {}, nil, ""},
		{"crun on hybrid hides the cgroup2 mount", func(f *Facts) { f.Runtime, f.RuntimePath = "crun", "/usr/bin/crun" }, nil, "/sys/fs/cgroup/unified"},
		{"crun on v2 needs nothing", func(f *Facts) { f.RuntimePath, f.Layout, f.Unified = "/usr/bin/crun", CgroupV2, "" }, nil, ""},
		{"crun on hybrid without umount", func(f *Facts) { f.RuntimePath, f.Umount = "/usr/bin/crun", "" }, []string{"needs sh and umount"}, "/sys/fs/cgroup/unified"},
		{"nothing installed", func(f *Facts) { f.RuntimePath = "" }, []string{"no OCI runtime is installed: apt-get install runc"}, ""},
		{"asked for crun, missing", func(f *Facts) { f.Runtime, f.RuntimePath = "crun", "" }, []string{`OCI runtime "crun" is not installed: apt-get install crun`}, ""},
		{"unknown runtime", func(f *Facts) { f.Runtime, f.RuntimePath = "youki", "/usr/bin/youki" }, []string{"neither runc nor crun"}, ""},
		{"not root", func(f *Facts) { f.Root = false }, []string{"runs the runtime as root"}, ""},
		{"no cgroups", func(f *Facts) { f.Layout = CgroupUnknown }, []string{"no cgroup filesystem"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := ok
			tt.edit(&f)
			rt, ps := Diagnose(f)
			require.Len(t, ps, len(tt.problems))
			for i, p := range tt.problems {
				assert.Contains(t, ps[i].String(), p)
			}
			assert.Equal(t, tt.hide, rt.HideCgroup2)
			if len(ps) > 0 {
				assert.True(t, errors.Is(problemsError(ps), provider.ErrUnavailable))
			}
		})
	}
}
