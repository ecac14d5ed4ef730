//go:build linux

package e2e

// The workload's confinement on every provider that runs here: the daemon
// (the probe fixture, playing a hostile daemon) tries to read
// oac-sandbox-io's private file, trace it and read its memory, leave
// through a new user namespace, use the kernel interfaces the seccomp
// filter refuses, and fork past the pids limit; oac-sandbox-io still reads
// its file and runs.

import (
	"encoding/json"
	"os"
	"path/filepath"
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

const probeBin = "/usr/local/bin/oac-probe"

// probeBootstrap runs the probe as the daemon, with oac-sandbox-io's stand-in
// and its private file when withSandboxIO.
func probeBootstrap(t *testing.T, withSandboxIO bool) string {
	t.Helper()
	b := &bootstrap.Bootstrap{Version: 1, Hostname: "probe", Daemon: &bootstrap.Process{Argv: []string{probeBin, "--bomb"}}}
	if withSandboxIO {
		b.SandboxIO = contract("link.example.com").SandboxIO
	}
	data, err := json.Marshal(b)
	require.NoError(t, err)
	return string(data)
}

// probeArgs install the probe and oac-sandbox-io's stand-in (bwrap) and
// name the sandbox.
func probeArgs() []string {
	return append(identityArgs(), "--install", "oac-probe="+bins.probe)
}

// probeResults waits for the probe to finish and returns its findings.
func probeResults(t *testing.T, s *shim, timeout time.Duration) map[string]string {
	t.Helper()
	s.waitLog("probe: done=", timeout)
	res := map[string]string{}
	for _, e := range s.find(func(e api.Event) bool { return e.Event == api.KindLog && strings.HasPrefix(e.Line, "probe: ") }) {
		k, v, _ := strings.Cut(strings.TrimPrefix(e.Line, "probe: "), "=")
		res[k] = v
	}
	t.Logf("probe: %v", res)
	return res
}

// limits is what a provider enforces on the workload.
type limits int

const (
	rlimits limits = iota // RLIMIT_NPROC and RLIMIT_DATA
	cgroup                // the workload's cgroup v2
)

// assertFiltered checks what the seccomp filter and the capability drop
// promise on every provider.
func assertFiltered(t *testing.T, r map[string]string, l limits, hasUnshare bool) {
	t.Helper()
	assert.Regexp(t, `^uid=1000 gid=1000 groups=\[(1000)?\]$`, r["ids"], "no supplementary groups (a single-uid guest cannot drop its one group)")
	assert.Equal(t, "1", r["NoNewPrivs"])
	assert.Equal(t, "2", r["Seccomp"], "a seccomp filter is in force")
	for _, c := range []string{"CapEff", "CapPrm", "CapAmb"} {
		assert.Equal(t, "0000000000000000", r[c], c)
	}
	for _, k := range []string{"unshare-newuser", "clone-newuser", "keyctl", "add_key", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "i386-unshare-newuser"} {
		if skipI386(t, r, k) {
			continue
		}
		assert.Equal(t, "EPERM", r[k], k)
	}
	assert.Equal(t, "ENOSYS", r["clone3"], "clone3's flags cannot be filtered: C libraries fall back to clone")
	assert.Equal(t, "EPERM", r["ioctl-ifflags"], "no interface ioctl: on a socket of the host's it would show the host's")
	assert.Equal(t, "EPERM", r["bindtodevice"])
	if hasUnshare {
		assert.Regexp(t, `^exit status 1: unshare: unshare failed: Operation not permitted`, r["unshare-Ur"])
	}
	// The pids limit holds: forking stops with EAGAIN before uid 1000 has
	// more than 128 tasks.
	assert.Equal(t, "EAGAIN", r["fork-stopped"])
	forked, err := strconv.Atoi(r["forked"])
	require.NoError(t, err)
	assert.Greater(t, forked, 32, "the limit is not hit early")
	assert.Less(t, forked, 128)
	switch l {
	case rlimits:
		assert.Equal(t, "128", r["rlimit-nproc"])
		data, err := strconv.ParseUint(r["rlimit-data"], 10, 64)
		require.NoError(t, err)
		assert.Less(t, data, uint64(1<<62), "a data limit is set")
		tasks, err := strconv.Atoi(r["uid-tasks"])
		require.NoError(t, err)
		assert.LessOrEqual(t, tasks, 128)
	case cgroup:
		assert.Equal(t, "/oac-workload", r["cgroup"])
		assert.Equal(t, "128", r["cgroup-pids.max"])
		assert.NotEqual(t, "max", r["cgroup-memory.max"])
	}
}

// skipI386 reports whether k is an i386 call the probe could not make:
// the guest's kernel does not take int 0x80 (the probe says i386=unavailable).
func skipI386(t *testing.T, r map[string]string, k string) bool {
	t.Helper()
	if strings.HasPrefix(k, "i386-") && r["i386"] == "unavailable" {
		t.Logf("%s not checked: this kernel does not take i386 calls (int 0x80)", k)
		return true
	}
	return false
}

// assertIsolated checks that the daemon cannot reach oac-sandbox-io's
// private file or memory.
func assertIsolated(t *testing.T, r map[string]string) {
	t.Helper()
	assert.Equal(t, "EACCES", r["read-private"], "the private file is masked in the daemon's mount namespace")
	assert.Equal(t, "mode=0000 size=0", r["private-stat"])
	assert.Equal(t, "EBUSY", r["unlink-private"], "a mount point cannot be removed")
	assert.Equal(t, "EBUSY", r["rename-private"])
	require.Equal(t, "true", r["sandbox-io-found"])
	assert.Equal(t, "oac-sandbox-io", r["sandbox-io-comm"], "its name is its own, although it runs from a copy")
	for _, k := range []string{"read-private-via-proc-root", "read-private-via-proc-cwd", "open-mem", "read-environ", "read-maps", "list-fd", "readlink-exe"} {
		assert.Equal(t, "EACCES", r[k], "%s: oac-sandbox-io is not dumpable", k)
	}
	for _, k := range []string{"ptrace-attach", "ptrace-seize", "process-vm-readv", "pidfd-getfd", "i386-ptrace-attach"} {
		if skipI386(t, r, k) {
			continue
		}
		assert.Equal(t, "EPERM", r[k], k)
	}
	assert.Equal(t, "ok", r["read-cmdline"], "what ps shows stays public")
	assert.Equal(t, "ok", r["signal-0"], "same uid: the daemon may signal oac-sandbox-io (it is restarted)")
}

// assertSandboxIOWorks checks oac-sandbox-io read its file and runs.
func assertSandboxIOWorks(t *testing.T, s *shim) {
	t.Helper()
	assert.Equal(t, bootstrap.CredentialDigest(linkCredential), s.waitLog("sandbox-io: credential-sha256=", bootTimeout))
	assert.Regexp(t, `^uid=1000 gid=1000 groups=\[(1000)?\]$`, s.waitLog("sandbox-io: ids=", bootTimeout))
	assert.Equal(t, "1", s.waitLog("sandbox-io: nnp=", bootTimeout))
}

func confinementMessage(t *testing.T, s *shim) string {
	t.Helper()
	return s.waitFor(func(e api.Event) bool {
		return e.Event == api.KindState && strings.HasPrefix(e.Message, "guest: workload: ")
	}, bootTimeout, "the workload's confinement").Message
}

func TestWorkloadConfinementInBwrap(t *testing.T) {
	for _, mode := range []struct {
		name string
		spec sandboxSpec
	}{
		{"root", sandboxSpec{}},
		{"rootless", sandboxSpec{user: subIDUser}},
		{"single-uid", sandboxSpec{user: singleUser, args: []string{"--single-uid"}}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			if mode.spec.user != "" {
				needRootless(t)
			} else {
				needBwrap(t)
			}
			spec := mode.spec
			spec.bootstrap = probeBootstrap(t, true)
			spec.args = append(append([]string{}, spec.args...), probeArgs()...)
			s := startShim(t, spec)
			s.waitState(api.StateReady, bootTimeout)
			msg := confinementMessage(t, s)
			assert.Contains(t, msg, "the daemon in a mount namespace of its own without oac-sandbox-io's private file")
			assert.Contains(t, msg, "oac-sandbox-io not dumpable")
			assert.NotContains(t, msg, "not applied")
			r := probeResults(t, s, bootTimeout)
			assertFiltered(t, r, rlimits, true)
			assert.Equal(t, "ok", r["landlock-tcp"], "this machine's kernel has Landlock's TCP rules")
			assert.Equal(t, "0000000000000000", r["CapBnd"], "an empty bounding set")
			assertIsolated(t, r)
			assertSandboxIOWorks(t, s)
			if mode.name == "single-uid" {
				bw := findBelow(t, s.cmd.Process.Pid, "bwrap")
				assert.Contains(t, readCmdline(bw), "--disable-userns", "bwrap 0.8 disables user namespaces in a single-uid guest")
			}
			s.signal(syscall.SIGTERM)
			s.waitState(api.StateStopped, 15*time.Second)
			assert.Equal(t, 0, s.exit(10*time.Second))
		})
	}
}

// probeRootfs is a minimal read-only root for an OCI guest with the probe
// installed (the OCI provider installs nothing itself).
func probeRootfs(t *testing.T) string {
	t.Helper()
	parent, err := os.MkdirTemp("", "oac-e2e-probe-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(parent) })
	require.NoError(t, os.Chmod(parent, 0o755))
	root := filepath.Join(parent, "rootfs")
	for _, d := range []string{"proc", "dev", "sys", "tmp", "run", "etc", "home", "environment", "usr/local/bin"} {
		require.NoError(t, os.MkdirAll(filepath.Join(root, d), 0o755))
	}
	b, err := os.ReadFile(bins.probe)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(root, probeBin), b, 0o755))
	return root
}

func TestWorkloadConfinementInOCI(t *testing.T) {
	for _, rt := range ociRuntimes {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			needOCI(t, rt)
			s := startShim(t, sandboxSpec{provider: "oci", bootstrap: probeBootstrap(t, false),
				args: []string{"--runtime", rt, "--rootfs", probeRootfs(t)}})
			s.waitState(api.StateReady, bootTimeout)
			assert.Contains(t, confinementMessage(t, s), "limits: 128 tasks of uid 1000")
			r := probeResults(t, s, bootTimeout)
			assertFiltered(t, r, rlimits, false)
			assert.Equal(t, "0 0 65536", r["uid-map"], "the daemon runs in a nested user namespace that maps the guest's ids to themselves")
			assert.Equal(t, "0000000000000000", r["CapBnd"], "an empty bounding set (the nested namespace's, emptied)")
			s.signal(syscall.SIGTERM)
			assert.Equal(t, 0, s.exit(15*time.Second))
		})
	}
}

func TestWorkloadConfinementInAVM(t *testing.T) {
	t.Parallel()
	name := uniqueName("vmprobe")
	kernel, initramfs := needVM(t)
	s := startShim(t, sandboxSpec{
		provider: "qemu", name: name, bootstrap: probeBootstrap(t, true),
		args: append([]string{"--kernel", kernel, "--initramfs", initramfs, "--boot-timeout", vmBootTimeout.String(),
			"--host-grace", vmHostGrace.String()}, identityArgs()[:6]...),
	})
	s.waitState(api.StateReady, vmBootTimeout)
	msg := confinementMessage(t, s)
	t.Logf("%s", msg)
	assert.Contains(t, msg, "the daemon in a mount namespace of its own")
	assert.Contains(t, msg, "(cgroup v2 /oac-workload)")
	assert.NotContains(t, msg, "not applied")
	r := probeResults(t, s, 30*time.Second)
	assertFiltered(t, r, cgroup, false)
	// Debian 12's kernel (6.1) has Landlock without TCP rules: where it
	// runs a guest sharing the host's kernel, direct mode is off and says
	// this.
	assert.Regexp(t, `^the kernel cannot refuse the workload's own TCP connects: this kernel's Landlock \(ABI \d\) has no TCP rules; Linux 6.7 and later have them$`, r["landlock-tcp"])
	assert.Equal(t, "0000000000000000", r["CapBnd"])
	assertIsolated(t, r)
	assertSandboxIOWorks(t, s)
	s.signal(syscall.SIGTERM)
	s.waitState(api.StateStopped, 20*time.Second)
	assert.Equal(t, 0, s.exit(20*time.Second))
}

func TestWorkloadConfinementInDocker(t *testing.T) {
	t.Parallel()
	image := dockerImage(t)
	s := startShim(t, sandboxSpec{provider: "docker", env: needDocker(t).Env(), bootstrap: probeBootstrap(t, true),
		args: append(probeArgs(), "--docker-image", image)})
	s.waitState(api.StateReady, bootTimeout)
	msg := confinementMessage(t, s)
	t.Logf("%s", msg)
	assert.Contains(t, msg, "the daemon in a mount namespace of its own without oac-sandbox-io's private file")
	assert.Contains(t, msg, "oac-sandbox-io not dumpable")
	assert.NotContains(t, msg, "not applied")
	r := probeResults(t, s, bootTimeout)
	assertFiltered(t, r, rlimits, false)
	assertIsolated(t, r)
	assertSandboxIOWorks(t, s)
	s.signal(syscall.SIGTERM)
	s.waitState(api.StateStopped, 15*time.Second)
	assert.Equal(t, 0, s.exit(15*time.Second))
}
