//go:build linux

package e2e

import (
	"archive/tar"
	"compress/gzip"
	"encoding/json"
	"fmt"
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

	"github.com/oac/sandbox-agent/api"
)

// The WSL provider runs here against a fake wsl.exe (internal/fakewsl)
// that honours the provider's argv and runs the real oac-guest, unpacked
// from a real rootfs tarball, over its stdio: the stdio transport and the
// provider's command handling are real; Windows and WSL are not.

func needRootForState(t *testing.T) {
	t.Helper()
	need(t, os.Geteuid() == 0, "the wsl e2e tests keep state in /run/oac: run them as root (sudo make test)")
}

// wslRootfs writes a gzip'd tarball holding the real oac-guest at
// sbin/oac-guest, as the image build lays it out.
func wslRootfs(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rootfs.tar.gz")
	f, err := os.Create(path)
	require.NoError(t, err)
	defer f.Close()
	zw := gzip.NewWriter(f)
	tw := tar.NewWriter(zw)
	agent, err := os.ReadFile(bins.guest)
	require.NoError(t, err)
	require.NoError(t, tw.WriteHeader(&tar.Header{Name: "sbin/", Typeflag: tar.TypeDir, Mode: 0o755}))
	require.NoError(t, tw.WriteHeader(&tar.Header{Name: "sbin/oac-guest", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(agent))}))
	_, err = tw.Write(agent)
	require.NoError(t, err)
	require.NoError(t, tw.Close())
	require.NoError(t, zw.Close())
	return path
}

type fakeWSL struct {
	state, rootfs string
	env           []string
}

// newFakeWSL is a fake wsl.exe whose distributions are imported from a
// tarball holding only the agent (enough for tests that never run it).
func newFakeWSL(t *testing.T, mode string) *fakeWSL {
	state := t.TempDir()
	return &fakeWSL{state: state, rootfs: wslRootfs(t), env: []string{"OAC_FAKE_WSL_STATE=" + state, "OAC_FAKE_WSL_MODE=" + mode}}
}

// newWSLDistro is a fake wsl.exe whose distributions are the run's guest
// image (oac-image's rootfs tarball: the agent, the stand-ins, the CA),
// with every door WSL opens by default: the fake ignores the image's
// /etc/wsl.conf, as a WSL older than its keys does.
func newWSLDistro(t *testing.T) *fakeWSL {
	w := newFakeWSL(t, "ignore-wslconf")
	w.rootfs = guestImage(t)
	return w
}

func (w *fakeWSL) args() []string { return []string{"--wsl", bins.fakeWSL, "--rootfs", w.rootfs} }

// calls returns the argv of every wsl.exe run, space-joined.
func (w *fakeWSL) calls(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(w.state, "argv.log"))
	require.NoError(t, err)
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var argv []string
		require.NoError(t, json.Unmarshal([]byte(line), &argv))
		out = append(out, strings.Join(argv, " "))
	}
	return out
}

// hostPid is the host's pid of the process of the distribution whose pid
// in the distribution's pid namespace is pid.
func (w *fakeWSL) hostPid(t *testing.T, distro string, pid int) int {
	t.Helper()
	root := filepath.Join(w.state, "distros", distro, "rootfs")
	for _, p := range allPids() {
		if r, _ := os.Readlink(fmt.Sprintf("/proc/%d/root", p)); r != root {
			continue
		}
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", p))
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 1 && f[0] == "NSpid:" && f[len(f)-1] == strconv.Itoa(pid) {
				return p
			}
		}
	}
	t.Fatalf("no process of %s is pid %d there", distro, pid)
	return 0
}

func (w *fakeWSL) distros() []string {
	ents, _ := os.ReadDir(filepath.Join(w.state, "distros"))
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func TestWSLBootsADistroOverStdioAndUnregistersIt(t *testing.T) {
	needRootForState(t)
	w := newWSLDistro(t)
	name := uniqueName("e2e")
	s := startShim(t, sandboxSpec{provider: "wsl", name: name, env: w.env, args: w.args(), bootstrap: standinDaemon(name)})
	agent := s.waitFor(func(e api.Event) bool { return e.Event == api.KindAgent }, bootTimeout, "agent event")
	assert.Equal(t, 1, agent.Protocol)
	ready := s.waitState(api.StateReady, bootTimeout)
	t.Logf("wsl (fake): %s", ready.Message)
	assert.Equal(t, "uid=1000 gid=1000 groups=[]", s.waitLog("daemon: ids=", bootTimeout), "the agent runs as root in the distro and starts the daemon as 1000")
	assert.Equal(t, []string{"oac-" + s.name}, w.distros())

	s.signal(syscall.SIGTERM)
	s.waitLog("daemon: got terminated", 10*time.Second)
	assert.Equal(t, 0, s.exit(15*time.Second))
	assert.Equal(t, api.StateStopped, s.lastEvent().State)
	distro := "oac-" + s.name
	dir := filepath.Join("/run/oac/sandboxes", s.name, "distro")
	assert.Equal(t, []string{
		"--version",
		"--list --quiet",
		"--import " + distro + " " + dir + " " + w.rootfs + " --version 2",
		"-d " + distro + " -u root --exec /sbin/oac-guest --transport stdio://",
		"--terminate " + distro,
		"--unregister " + distro,
	}, w.calls(t))
	assert.Empty(t, w.distros(), "the distribution is unregistered")
	assert.NoDirExists(t, filepath.Join("/run/oac/sandboxes", s.name))
}

func TestWSLAgentKilledIsFailedAndTheDistroIsRemoved(t *testing.T) {
	needRootForState(t)
	w := newWSLDistro(t)
	name := uniqueName("e2e")
	s := startShim(t, sandboxSpec{provider: "wsl", name: name, env: w.env, args: w.args(), bootstrap: standinDaemon(name)})
	agent := s.waitFor(func(e api.Event) bool { return e.Event == api.KindAgent }, bootTimeout, "agent event")
	s.waitState(api.StateReady, bootTimeout)
	// The agent runs in the distribution's pid namespace: Hello's pid is
	// its pid there.
	pid := w.hostPid(t, "oac-"+s.name, agent.PID)
	require.Contains(t, readCmdline(pid), "--transport")
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))

	failed := s.waitState(api.StateFailed, 10*time.Second)
	assert.Regexp(t, `guest connection lost|sandbox runtime exited`, failed.Message)
	s.exitFailed(api.CodeRuntimeFailed, 15*time.Second)
	assert.Contains(t, w.calls(t), "--unregister oac-"+s.name)
	assert.Empty(t, w.distros())
	assert.Empty(t, hostProcs("--marker "+name), "terminating the distribution ended its processes")
}

func TestWSLRefusesWhatItCannotCarryBeforeImporting(t *testing.T) {
	needRootForState(t)
	w := newFakeWSL(t, "")
	for _, args := range [][]string{
		{"--sandbox-io", bins.sandboxIO},
		{"--install", "tool=" + bins.daemon},
		{"--volume", "/home=" + t.TempDir()},
	} {
		s := startShim(t, sandboxSpec{provider: "wsl", env: w.env, args: append(w.args(), args...)})
		failed := s.waitState(api.StateFailed, 10*time.Second)
		assert.Contains(t, failed.Message, "nothing created: invalid sandbox spec: "+args[0]+": not supported by this provider: the wsl provider does not honour "+args[0]+"; ")
		s.exitFailed(api.CodeInvalidConfig, 10*time.Second)
		assert.NoDirExists(t, filepath.Join("/run/oac/sandboxes", s.name))
	}
	_, err := os.Stat(filepath.Join(w.state, "argv.log"))
	assert.ErrorIs(t, err, os.ErrNotExist, "wsl.exe never ran")
}

func TestWSLMissingPointsAtTheMirroredInstaller(t *testing.T) {
	needRootForState(t)
	w := newFakeWSL(t, "missing")
	// The release tooling pins the mirrored installer in the manifest; the
	// provider names it from there.
	dir := t.TempDir()
	msi := filepath.Join(dir, "wsl.2.1.5.0.x64.msi")
	require.NoError(t, os.WriteFile(msi, []byte("a mirrored MSI"), 0o644))
	out := filepath.Join(dir, "release")
	build, err := exec.Command(bins.image, "build", "--agent", bins.guest, "--sandbox-io", bins.sandboxIO, "--output", "tar",
		"--wsl-installer", msi, "--base-url", "https://downloads.example.com/oac", "--release", "e2e-1", "-o", out).CombinedOutput()
	require.NoError(t, err, "%s", build)
	mf := filepath.Join(out, "manifest.json")
	const url = "https://downloads.example.com/oac/wsl.2.1.5.0.x64.msi"
	cmd := exec.Command(bins.shim, "check", "--json", "--manifest", mf, "--wsl", bins.fakeWSL)
	cmd.Env = append(os.Environ(), w.env...)
	checkOut, _ := cmd.Output()
	var report struct {
		Providers []struct {
			Name      string
			Available bool
			Reason    string
		}
	}
	require.NoError(t, json.Unmarshal(checkOut, &report), string(checkOut))
	found := false
	for _, p := range report.Providers {
		if p.Name == "wsl" {
			found = true
			assert.False(t, p.Available)
			assert.Contains(t, p.Reason, "WSL is not installed, or is the Windows component without --version")
			assert.Contains(t, p.Reason, "install WSL with the pinned installer wsl.2.1.5.0.x64.msi (14 bytes, sha256 ")
			assert.Contains(t, p.Reason, url)
		}
	}
	assert.True(t, found, "check lists the wsl provider")

	s := startShim(t, sandboxSpec{provider: "wsl", env: w.env, args: append(w.args(), "--manifest", mf)})
	failed := s.waitState(api.StateFailed, 10*time.Second)
	assert.Contains(t, failed.Message, url)
	s.exitFailed(api.CodeProviderUnavailable, 10*time.Second)
	assert.Contains(t, s.stderr.String(), "run 'oac-shim check'")
	assert.Equal(t, []string{"--version", "--version"}, w.calls(t), "nothing imported")
}

func TestWSLImportFailureCreatesNothing(t *testing.T) {
	needRootForState(t)
	w := newFakeWSL(t, "nohyperv")
	s := startShim(t, sandboxSpec{provider: "wsl", env: w.env, args: w.args()})
	failed := s.waitState(api.StateFailed, 10*time.Second)
	assert.Contains(t, failed.Message, "HCS_E_HYPERV_NOT_INSTALLED")
	assert.Contains(t, failed.Message, "enable the Virtual Machine Platform")
	s.exitFailed(api.CodeProviderUnavailable, 10*time.Second)
	for _, c := range w.calls(t) {
		assert.False(t, strings.HasPrefix(c, "-d "), "no agent started: %s", c)
	}
	assert.NoDirExists(t, filepath.Join("/run/oac/sandboxes", s.name))
}

// wslDoorsRun boots the daemon stand-in in w's fake WSL distribution and
// returns what the stand-in, the workload,
// found of the platform's doors ("none" or "; "-separated findings).
// The distribution's agent is the image's.
func wslDoorsRun(t *testing.T, w *fakeWSL) (*shim, string) {
	t.Helper()
	name := uniqueName("wsl-doors")
	s := startShim(t, sandboxSpec{provider: "wsl", name: name, env: w.env, args: w.args(), bootstrap: standinDaemon(name)})
	s.waitState(api.StateReady, bootTimeout)
	return s, s.waitLog("daemon: doors=", bootTimeout)
}

func TestWSLDoorsAreSeenWhenTheGuestDoesNotCloseThem(t *testing.T) {
	needRootForState(t)
	// The proof the conformance suite's "no platform door" cell on the WSL
	// row means something: the same fake, the same image, an agent built
	// to close nothing (-tags oac_doors_off), and the workload finds every
	// default door.
	w := newWSLDistro(t)
	w.rootfs = guestImageDoorsOff(t)
	s, doors := wslDoorsRun(t, w)
	t.Logf("doors with the checks off: %s", doors)
	require.NotEqual(t, "none", doors)
	// (The workload's environment is the bootstrap's, never the agent's:
	// $WSL_INTEROP and the Windows PATH do not reach it even then.)
	for _, door := range []string{"mount /mnt/c", "mount /mnt/wsl", "mount /mnt/wslg", "/tmp/.X11-unix", "host socket /run/WSL/1_interop", "host path /init", "device /dev/vsock"} {
		assert.Contains(t, doors, door)
	}
	s.signal(syscall.SIGTERM)
	s.waitState(api.StateStopped, 30*time.Second)
}

func TestWSLTheGuestClosesEveryDefaultDoorAndSaysWhich(t *testing.T) {
	needRootForState(t)
	s, doors := wslDoorsRun(t, newWSLDistro(t))
	assert.Equal(t, "none", doors)
	closed := s.waitFor(func(e api.Event) bool {
		return e.Event == api.KindState && strings.Contains(e.Message, "platform doors closed for the workload")
	}, time.Second, "the agent's report of the doors it closed")
	for _, door := range []string{"windows-drive /mnt/c", "shared-mount /mnt/wsl", "display-socket /mnt/wslg", "display-socket /tmp/.X11-unix",
		"wsl-interop binfmt_misc/WSLInterop", "wsl-interop /run/WSL", "wsl-interop $WSL_INTEROP", "windows-path $PATH /mnt/c/Windows/System32"} {
		assert.Contains(t, closed.Message, door)
	}
	s.signal(syscall.SIGTERM)
	s.waitState(api.StateStopped, 30*time.Second)
}

func TestWSLTheImagesWSLConfLeavesOnlyTheDoorsItCannotClose(t *testing.T) {
	needRootForState(t)
	// A WSL that honours the image's /etc/wsl.conf mounts no drive,
	// registers no interop handler and appends no Windows PATH; /mnt/wsl,
	// WSLg and the interop socket directory are not wsl.conf's to close
	// (.wslconfig is the user's), so the agent closes those.
	w := newFakeWSL(t, "")
	w.rootfs = guestImageDoorsOff(t)
	s, doors := wslDoorsRun(t, w)
	t.Logf("doors under the image's wsl.conf, the agent's checks off: %s", doors)
	for _, door := range []string{"/mnt/c", "host path /init"} {
		assert.NotContains(t, doors, door)
	}
	for _, door := range []string{"mount /mnt/wsl", "mount /mnt/wslg", "host socket /run/WSL/1_interop"} {
		assert.Contains(t, doors, door)
	}
	s.signal(syscall.SIGTERM)
	s.waitState(api.StateStopped, 30*time.Second)
}
