//go:build linux

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/provider/qemu"
	"github.com/oac/sandbox-agent/internal/yamux"
	"github.com/oac/sandbox-agent/protocol"
)

// VM tests boot real kernels under qemu. Under software emulation a boot
// takes 2-3 s here (budget about 5 s); the timeout leaves room for a
// loaded CI machine. At most two VMs run at once.
const (
	vmBootTimeout = 40 * time.Second
	vmHostGrace   = 2 * time.Second
	vmDaemon      = "/usr/bin/vmdaemon"
)

var vmSlots = make(chan struct{}, 2)

var vmImage struct {
	once              sync.Once
	kernel, initramfs string
	err               error
	out               []byte
}

// kernelCache is where make kernel put Debian's cloud kernel.
func kernelCache() string {
	if v := os.Getenv("OAC_KERNEL_CACHE"); v != "" {
		return v
	}
	abs, _ := filepath.Abs("../.cache/kernel")
	return abs
}

// needVM checks what VM tests need, builds the test initramfs once (the
// real oac-guest as /init, the virtio modules, vmdaemon, oac-sandbox-io's
// stand-in and the probe) with the real
// oac-image, and holds one of the two VM slots until the test ends. Call it
// after t.Parallel.
func needVM(t *testing.T) (kernel, initramfs string) {
	t.Helper()
	_, err := exec.LookPath("qemu-system-x86_64")
	need(t, err == nil, "qemu-system-x86_64 is not installed: apt-get install qemu-system-x86 (or run make deps)")
	cache := kernelCache()
	_, err = os.Stat(filepath.Join(cache, "modules", "modules.dep"))
	need(t, err == nil, "no kernel cache at "+cache+": run make kernel")
	need(t, os.Geteuid() == 0, "the qemu provider keeps sandbox state under /run/oac: run the e2e tests as root (sudo make test)")
	vmImage.once.Do(func() {
		vmImage.kernel = filepath.Join(cache, "vmlinuz")
		vmImage.initramfs = filepath.Join(bins.dir, "initramfs.img")
		cmd := exec.Command(bins.image, "initramfs", "--agent", bins.guest,
			"--kernel-modules", filepath.Join(cache, "modules"),
			"--file", bins.vmdaemon+":"+vmDaemon, "--file", bins.sandboxIO+":/usr/local/bin/oac-sandbox-io",
			"--file", bins.probe+":"+probeBin, "-o", vmImage.initramfs)
		vmImage.out, vmImage.err = cmd.CombinedOutput()
	})
	require.NoError(t, vmImage.err, "oac-image: %s", vmImage.out)
	vmSlots <- struct{}{}
	t.Cleanup(func() { <-vmSlots })
	return vmImage.kernel, vmImage.initramfs
}

func vmBootstrap(hostname string) string {
	return `{"version":1,"hostname":"` + hostname + `","stop_grace":"3s","daemon":{"argv":["` + vmDaemon + `"]}}`
}

func startVM(t *testing.T, name string, extra ...string) *shim {
	t.Helper()
	kernel, initramfs := needVM(t)
	return startShim(t, sandboxSpec{
		provider: "qemu", name: name, bootstrap: vmBootstrap(name),
		args: append([]string{"--kernel", kernel, "--initramfs", initramfs, "--boot-timeout", vmBootTimeout.String(),
			"--host-grace", vmHostGrace.String()}, extra...),
	})
}

// bootTime extracts the duration from "guest ready in 2.3s".
func bootTime(t *testing.T, ready api.Event) time.Duration {
	took, _, _ := strings.Cut(strings.TrimPrefix(ready.Message, "guest ready in "), ":")
	d, err := time.ParseDuration(took)
	require.NoError(t, err, ready.Message)
	return d
}

func TestVMBootsToReadyRunsTheDaemonAs1000AndPowersOffOnStop(t *testing.T) {
	t.Parallel()
	name := uniqueName("vm")
	sock := filepath.Join(t.TempDir(), "ctl.sock")
	s := startVM(t, name, "--control-socket", sock)
	agent := s.waitFor(func(e api.Event) bool { return e.Event == api.KindAgent }, vmBootTimeout, "agent event")
	assert.Equal(t, 1, agent.PID, "oac-guest is PID 1 of the VM")
	ready := s.waitState(api.StateReady, vmBootTimeout)
	t.Logf("boot to ready under qemu: %s", bootTime(t, ready))
	require.Len(t, hostProcs("oac-"+name), 1, "one qemu process")

	assert.Equal(t, "uid=1000 gid=1000 groups=", s.waitLog("ids=", 10*time.Second), "1000:1000, no supplementary groups")
	assert.Equal(t, "1", s.waitLog("nonewprivs=", 5*time.Second))
	assert.Equal(t, "0000000000000000", s.waitLog("capeff=", 5*time.Second))
	assert.Equal(t, "init", s.waitLog("pid1=", 5*time.Second), "PID 1 is /init, which is oac-guest")
	assert.Equal(t, "lo", s.waitLog("ifaces=", 5*time.Second), "no network interface but lo")
	assert.Equal(t, name, s.waitLog("hostname=", 5*time.Second))
	assert.Equal(t, "true", s.waitLog("cgroup2=", 5*time.Second))
	assert.Equal(t, "/environment/workspace", s.waitLog("cwd=", 5*time.Second), "the contract's working directory, created by the agent")
	e := s.waitFor(func(e api.Event) bool { return e.Event == api.KindLog && strings.HasPrefix(e.Line, "unix_ms=") }, 5*time.Second, "guest clock")
	guestMS, err := strconv.ParseInt(strings.TrimPrefix(e.Line, "unix_ms="), 10, 64)
	require.NoError(t, err)
	assert.InDelta(t, e.Time.UnixMilli(), guestMS, 1500, "the guest clock was set from the host's")
	// A VM guest takes time pushes (after the host slept, say).
	a := ctl(t, sock, map[string]any{"cmd": "push_time"})
	require.Equal(t, true, a["ok"], a)
	assert.Positive(t, a["result"].(map[string]any)["time_unix_nano"])

	begin := time.Now()
	s.signal(syscall.SIGTERM)
	stopped := s.waitState(api.StateStopped, 20*time.Second)
	assert.Contains(t, stopped.Message, "received terminated")
	assert.Equal(t, 0, s.exit(15*time.Second))
	t.Logf("SIGTERM to shim exit: %s", time.Since(begin))
	assert.Contains(t, s.stderr.String(), `msg="powering off" component=oac-guest reason="the host asked the guest to stop"`)
	assert.Contains(t, s.stderr.String(), "reboot: Power down", "the guest powered the VM off (qemu was not killed)")
	assert.NotContains(t, s.stderr.String(), "did not stop in time")
	assert.Empty(t, hostProcs("oac-"+name), "qemu exited")
	_, err = os.Stat(filepath.Join("/run/oac/sandboxes", name))
	assert.True(t, os.IsNotExist(err), "the state directory is removed")
}

func TestVMKillingTheShimLeavesNoQemuBehind(t *testing.T) {
	t.Parallel()
	name := uniqueName("vmkill")
	s := startVM(t, name)
	s.waitState(api.StateReady, vmBootTimeout)
	require.Len(t, hostProcs("oac-"+name), 1)
	s.signal(syscall.SIGKILL)
	s.exit(10 * time.Second)
	assert.Eventually(t, func() bool { return len(hostProcs("oac-"+name)) == 0 }, 5*time.Second, 20*time.Millisecond,
		"qemu dies with the shim (parent-death signal)")
}

// fakeHostVM boots a VM with the qemu provider in this process, so the test
// plays the host and can go silent.
func fakeHostVM(t *testing.T, name string) (provider.Instance, *lockedBuffer) {
	t.Helper()
	kernel, initramfs := needVM(t)
	root, err := os.MkdirTemp("", "oacvm") // short: unix socket paths are limited
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(root) })
	p := &qemu.Provider{Kernel: kernel, Initramfs: initramfs, HostGrace: vmHostGrace, StateRoot: root}
	var diag lockedBuffer
	in, err := p.Create(context.Background(), provider.Spec{Name: name, AgentPath: bins.guest, Stderr: &diag})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = in.Destroy()
		if t.Failed() {
			t.Logf("console:\n%s", diag.String())
		}
	})
	require.NoError(t, in.Start(context.Background()))
	return in, &diag
}

func waitPowerOff(t *testing.T, in provider.Instance, timeout time.Duration) {
	t.Helper()
	select {
	case <-in.Done():
	case <-time.After(timeout):
		t.Fatalf("the VM did not power off within %s", timeout)
	}
	assert.EqualError(t, in.Err(), "virtual machine powered off", "qemu ended because the guest powered off")
}

func TestVMPowersOffWhenTheHostGoesAwayWithoutShutdown(t *testing.T) {
	t.Parallel()
	in, diag := fakeHostVM(t, uniqueName("vmgone"))
	ctx, cancel := context.WithTimeout(context.Background(), vmBootTimeout)
	defer cancel()
	conn, err := in.Accept(ctx)
	require.NoError(t, err)
	sess, err := yamux.Server(conn, protocol.MuxConfig(nil))
	require.NoError(t, err)
	ctl, hello, _, err := protocol.HostHandshake(sess, protocol.MinVersion, protocol.MaxVersion, protocol.Welcome{HostVersion: "e2e-fake-host"}, vmBootTimeout)
	require.NoError(t, err)
	assert.Equal(t, 1, hello.PID)
	require.NoError(t, ctl.Send(protocol.TypeBootstrap, json.RawMessage(vmBootstrap("gone"))))
	// starting (one or more: applying, bootstrap complete), then ready.
	for {
		var st protocol.State
		require.NoError(t, ctl.RecvMessage(protocol.TypeState, &st))
		if st.State == protocol.StateReady {
			break
		}
		require.Equal(t, protocol.StateStarting, st.State, st.Message)
	}

	// The host vanishes without a Shutdown: the guest stops its daemon,
	// waits the grace for the host to come back, then powers off.
	gone := time.Now()
	require.NoError(t, sess.Close())
	waitPowerOff(t, in, vmHostGrace+20*time.Second)
	took := time.Since(gone)
	t.Logf("host gone to power off: %s (grace %s)", took, vmHostGrace)
	assert.GreaterOrEqual(t, took, vmHostGrace, "the guest waits the grace for the host to come back")
	assert.Contains(t, diag.String(), "host connection gone; waiting for it to come back")
	assert.Contains(t, diag.String(), `reason="no host connection for 2s"`)
}

func TestVMPowersOffWhenNoHostEverAnswers(t *testing.T) {
	t.Parallel()
	in, diag := fakeHostVM(t, uniqueName("vmsilent"))
	// Nobody accepts: qemu's connection sits in the socket's backlog and
	// the guest's Hello is never answered.
	waitPowerOff(t, in, vmBootTimeout+vmHostGrace)
	assert.Contains(t, diag.String(), `reason="no host connection for 2s"`)
}

// An unprivileged user runs VMs under software emulation with its state
// in its own directory; check says so, and says what needs root.
func TestVMCheckAndRunAsAnUnprivilegedUser(t *testing.T) {
	t.Parallel()
	needRootless(t)
	kernel, initramfs := needVM(t)
	uid := lookupUID(t, singleUser)
	check := func(extra ...string) ProviderReport {
		t.Helper()
		args := append([]string{"--reuid", singleUser, "--regid", singleUser, "--init-groups", "--reset-env",
			bins.shim, "check", "--json", "--kernel", kernel, "--initramfs", initramfs}, extra...)
		out, _ := exec.Command("setpriv", args...).Output()
		var r struct{ Providers []ProviderReport }
		require.NoError(t, json.Unmarshal(out, &r), "%s", out)
		for _, p := range r.Providers {
			if p.Name == "qemu" {
				return p
			}
		}
		t.Fatalf("no qemu in %s", out)
		return ProviderReport{}
	}
	q := check()
	require.True(t, q.Available, q.Reason)
	assert.Contains(t, q.Detail, "amd64 q35 under TCG software emulation")
	assert.Contains(t, q.Detail, "virtio-serial transport")
	assert.Contains(t, q.Detail, fmt.Sprintf("state in /tmp/oac-%d", uid), "not /run/oac, which the user cannot write")
	assert.Contains(t, q.Detail, "no shares or volumes: shares and volumes need root")
	q = check("--share", t.TempDir())
	assert.False(t, q.Available)
	assert.Contains(t, q.Reason, "shares and volumes need root")

	name := uniqueName("vmuser")
	s := startShim(t, sandboxSpec{provider: "qemu", name: name, user: singleUser, bootstrap: vmBootstrap(name),
		args: []string{"--kernel", kernel, "--initramfs", initramfs, "--boot-timeout", vmBootTimeout.String(), "--host-grace", vmHostGrace.String()}})
	s.waitState(api.StateReady, vmBootTimeout)
	assert.Equal(t, "uid=1000 gid=1000 groups=", s.waitLog("ids=", 10*time.Second))
	s.signal(syscall.SIGTERM)
	s.waitState(api.StateStopped, 20*time.Second)
	assert.Equal(t, 0, s.exit(15*time.Second))
}

// ProviderReport is one provider of oac-shim check --json.
type ProviderReport struct {
	Name      string
	Available bool
	Reason    string
	Detail    string
}
