//go:build linux

package e2e

import (
	"archive/tar"
	"compress/gzip"
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

// The WSL provider runs here against a fake wsl.exe (internal/fakewsl)
// that honours the provider's argv and runs the real oac-guest, unpacked
// from a real rootfs tarball, over its stdio: the stdio transport and the
// provider's command handling are real; Windows and WSL are not.

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

func newFakeWSL(t *testing.T, mode string) *fakeWSL {
	state := t.TempDir()
	return &fakeWSL{state: state, rootfs: wslRootfs(t), env: []string{"OAC_FAKE_WSL_STATE=" + state, "OAC_FAKE_WSL_MODE=" + mode}}
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
	w := newFakeWSL(t, "")
	s := startShim(t, sandboxSpec{provider: "wsl", env: w.env, args: w.args(), bootstrap: daemon(
		`trap 'echo daemon got TERM; exit 0' TERM; echo "uid=$(id -u) gid=$(id -g) groups=$(id -G)"; sleep 1000 & wait`)})
	agent := s.waitFor(func(e api.Event) bool { return e.Event == api.KindAgent }, bootTimeout, "agent event")
	assert.Equal(t, 1, agent.Protocol)
	ready := s.waitState(api.StateReady, bootTimeout)
	t.Logf("wsl (fake): %s", ready.Message)
	assert.Equal(t, "1000 gid=1000 groups=1000", s.waitLog("uid=", bootTimeout), "the agent runs as root in the distro and starts the daemon as 1000")
	assert.Equal(t, []string{"oac-" + s.name}, w.distros())

	s.signal(syscall.SIGTERM)
	s.waitLog("daemon got TERM", 10*time.Second)
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
	w := newFakeWSL(t, "")
	s := startShim(t, sandboxSpec{provider: "wsl", env: w.env, args: w.args(), bootstrap: daemon("exec sleep 1000")})
	agent := s.waitFor(func(e api.Event) bool { return e.Event == api.KindAgent }, bootTimeout, "agent event")
	s.waitState(api.StateReady, bootTimeout)
	// The fake wsl.exe became the agent (exec), so Hello's pid is a host pid.
	require.Contains(t, readCmdline(agent.PID), "--transport")
	require.NoError(t, syscall.Kill(agent.PID, syscall.SIGKILL))

	failed := s.waitState(api.StateFailed, 10*time.Second)
	assert.Regexp(t, `guest connection lost|sandbox runtime exited`, failed.Message)
	s.exitFailed(api.CodeRuntimeFailed, 15*time.Second)
	assert.Contains(t, w.calls(t), "--unregister oac-"+s.name)
	assert.Empty(t, w.distros())
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
