//go:build unix || windows

package wsl

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/manifest"
)

func newTestProvider(t *testing.T, r Runner) *Provider {
	t.Helper()
	dir := t.TempDir()
	tar := filepath.Join(dir, "rootfs.tar.gz")
	require.NoError(t, os.WriteFile(tar, []byte("not really"), 0o644))
	return &Provider{Runner: r, Rootfs: tar, StateRoot: filepath.Join(dir, "state"), Manifest: pinnedManifest(t)}
}

func TestLifecycleRunsTheExpectedCommands(t *testing.T) {
	r := newFakeRunner()
	p := newTestProvider(t, r)
	require.NoError(t, p.Check(context.Background()))
	assert.Contains(t, p.Detail(context.Background()), "WSL 2.1.5.0")

	inst, err := p.Create(context.Background(), provider.Spec{Name: "demo", AgentPath: "unused", Stderr: io.Discard})
	require.NoError(t, err)
	in := inst.(*Instance)
	assert.Equal(t, "oac-demo", in.Distro())
	_, err = in.Accept(context.Background())
	assert.ErrorIs(t, err, provider.ErrNotStarted)
	require.NoError(t, in.Start(context.Background()))
	assert.Equal(t, 4242, in.HostPID())

	c, err := in.Accept(context.Background())
	require.NoError(t, err)
	// The conn is the process's stdio: what the "agent" writes arrives.
	go func() { _, _ = r.started.outW.Write([]byte("hello")) }()
	buf := make([]byte, 5)
	_, err = io.ReadFull(c, buf)
	require.NoError(t, err)
	assert.Equal(t, "hello", string(buf))

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = in.Accept(ctx)
	assert.ErrorIs(t, err, context.DeadlineExceeded, "one connection per start")

	require.NoError(t, in.Destroy())
	require.NoError(t, in.Destroy(), "safe to call twice")
	<-in.Done()
	assert.ErrorContains(t, in.Err(), "sandbox runtime exited: wsl.exe")
	dir := filepath.Join(p.StateRoot, "sandboxes", "demo")
	assert.Equal(t, []string{
		"--version", // Check
		"--version", // Detail
		"--version", // Create
		"--list --quiet",
		"--import oac-demo " + filepath.Join(dir, "distro") + " " + p.Rootfs + " --version 2",
		"-d oac-demo -u root --exec /sbin/oac-guest --transport stdio://",
		"--terminate oac-demo",
		"--unregister oac-demo",
		"--terminate oac-demo", // the second Destroy; harmless
	}, r.commands())
	assert.NoDirExists(t, dir)
	assert.Empty(t, r.distros)
}

func TestCreateUnregistersAStaleDistribution(t *testing.T) {
	r := newFakeRunner()
	r.distros["oac-demo"] = true
	p := newTestProvider(t, r)
	inst, err := p.Create(context.Background(), provider.Spec{Name: "demo", AgentPath: "unused"})
	require.NoError(t, err)
	defer inst.Destroy()
	assert.Contains(t, r.commands(), "--unregister oac-demo")
	assert.True(t, r.distros["oac-demo"])
}

func TestResetUnregistersWhatASandboxLeftAndAFreshStartImportsAgain(t *testing.T) {
	r := newFakeRunner()
	p := newTestProvider(t, r)
	var rs provider.Resetter = p
	require.NoError(t, rs.Reset(context.Background(), "demo"), "nothing left: nothing to do")
	assert.Equal(t, []string{"--list --quiet"}, r.commands())

	r.distros["oac-demo"] = true // an unregister that failed
	require.NoError(t, rs.Reset(context.Background(), "demo"))
	cmds := r.commands()
	assert.Equal(t, "--unregister oac-demo", cmds[len(cmds)-1])
	assert.Empty(t, r.distros)

	inst, err := p.Create(context.Background(), provider.Spec{Name: "demo", AgentPath: "unused"})
	require.NoError(t, err)
	defer inst.Destroy()
	cmds = r.commands()
	assert.True(t, strings.HasPrefix(cmds[len(cmds)-1], "--import oac-demo "))
	require.NoError(t, inst.Start(context.Background()), "startable after a reset")
	select {
	case <-inst.Done():
		t.Fatal("a fresh start has a fresh Done")
	default:
	}
}

func TestMissingOrOldWSLPointsAtTheInstaller(t *testing.T) {
	r := newFakeRunner()
	r.version = ""
	p := newTestProvider(t, r)
	err := p.Check(context.Background())
	assert.ErrorIs(t, err, provider.ErrUnavailable)
	assert.ErrorContains(t, err, "WSL is not installed, or is the Windows component without --version")
	assert.ErrorContains(t, err, "install WSL with the pinned installer wsl.msi (7 bytes, sha256 "+strings.Repeat("ab", 32)+") from https://mirror.example/oac/wsl.msi",
		"the installer comes from the pinned manifest")

	r.version = "WSL version: 0.70.4\r\n"
	err = p.Check(context.Background())
	assert.ErrorIs(t, err, provider.ErrUnavailable)
	assert.ErrorContains(t, err, "WSL 0.70.4 is older than 1.0.0")

	p.Manifest = filepath.Join(t.TempDir(), "missing.json")
	assert.ErrorContains(t, p.Check(context.Background()), "wsl.exe --install --no-distribution); the pinned manifest cannot be read")
	p.Manifest = ""
	assert.ErrorContains(t, p.Check(context.Background()), "wsl.exe --install --no-distribution)")
	_, err = p.Create(context.Background(), provider.Spec{Name: "demo", AgentPath: "x"})
	assert.ErrorIs(t, err, provider.ErrUnavailable)
}

func TestNoWSLBinaryOutsideWindows(t *testing.T) {
	if onlyOnWindows == "" {
		t.Skip("Windows looks for wsl.exe")
	}
	err := (&Provider{}).Check(context.Background())
	assert.ErrorIs(t, err, provider.ErrUnavailable)
	assert.EqualError(t, err, "provider unavailable: wsl: WSL runs only on Windows")
}

func TestMissingTarballIsUnavailableOrInvalid(t *testing.T) {
	r := newFakeRunner()
	p := newTestProvider(t, r)
	p.Rootfs = filepath.Join(t.TempDir(), "missing.tar.gz")
	assert.ErrorIs(t, p.Check(context.Background()), provider.ErrUnavailable)
	_, err := p.Create(context.Background(), provider.Spec{Name: "demo", AgentPath: "x"})
	assert.ErrorIs(t, err, provider.ErrInvalidSpec)
	assert.ErrorContains(t, err, "is not a readable file")
	assert.NotContains(t, r.commands(), "--list --quiet", "nothing was touched")
}

func TestImportFailureLeavesNothingBehind(t *testing.T) {
	r := newFakeRunner()
	r.fail["--import"] = "Please enable the Virtual Machine Platform Windows feature.\r\nError code: Wsl/Service/RegisterDistro/CreateVm/HCS/HCS_E_HYPERV_NOT_INSTALLED\r\n"
	p := newTestProvider(t, r)
	_, err := p.Create(context.Background(), provider.Spec{Name: "demo", AgentPath: "x"})
	assert.ErrorIs(t, err, provider.ErrUnavailable)
	assert.ErrorContains(t, err, "enable the Virtual Machine Platform")
	assert.NoDirExists(t, filepath.Join(p.StateRoot, "sandboxes", "demo"))
	assert.NotContains(t, r.commands(), "--unregister oac-demo", "nothing imported, nothing to unregister")
}

func TestTwoSandboxesOfOneNameCannotExist(t *testing.T) {
	r := newFakeRunner()
	p := newTestProvider(t, r)
	a, err := p.Create(context.Background(), provider.Spec{Name: "demo", AgentPath: "x"})
	require.NoError(t, err)
	defer a.Destroy()
	_, err = p.Create(context.Background(), provider.Spec{Name: "demo", AgentPath: "x"})
	assert.ErrorIs(t, err, provider.ErrExists)
}

func TestExecRunnerRunsAProgram(t *testing.T) {
	sh := "/bin/sh"
	if _, err := os.Stat(sh); err != nil {
		t.Skip("no /bin/sh")
	}
	r := ExecRunner{Path: sh}
	out, err := r.Output(context.Background(), "-c", `printf "%s" "$WSL_UTF8"`)
	require.NoError(t, err)
	assert.Equal(t, "1", string(out), "wsl.exe is asked for UTF-8")

	var stderr bytes.Buffer
	p, err := r.Start([]string{"-c", `read x; echo "got $x"; echo oops >&2`}, &stderr)
	require.NoError(t, err)
	_, err = p.Stdin().Write([]byte("ping\n"))
	require.NoError(t, err)
	b, err := io.ReadAll(p.Stdout())
	require.NoError(t, err)
	assert.Equal(t, "got ping\n", string(b))
	require.NoError(t, p.Wait())
	assert.Positive(t, p.Pid())
}

// pinnedManifest writes a manifest pinning a WSL installer for Windows on
// this architecture.
func pinnedManifest(t *testing.T) string {
	t.Helper()
	m := &manifest.Manifest{Schema: manifest.SchemaVersion, Release: "test-1", Artifacts: []manifest.Artifact{{
		Name: "wsl-installer-windows-" + runtime.GOARCH, Kind: manifest.KindWSLInstaller, Platform: "windows", Arch: runtime.GOARCH,
		URL: "https://mirror.example/oac/wsl.msi", Size: 7, SHA256: strings.Repeat("ab", 32),
	}}}
	var b bytes.Buffer
	require.NoError(t, manifest.Encode(m, &b))
	p := filepath.Join(t.TempDir(), "manifest.json")
	require.NoError(t, os.WriteFile(p, b.Bytes(), 0o644))
	return p
}

func TestAKeptDistributionStaysRegisteredAcrossRunsUntilDiscard(t *testing.T) {
	r := newFakeRunner()
	p := newTestProvider(t, r)
	dir := t.TempDir()
	spec := provider.Spec{Name: "demo", AgentPath: "unused", Stderr: io.Discard, Keep: &provider.Keep{Dir: dir}}

	inst, err := p.Create(context.Background(), spec)
	require.NoError(t, err)
	require.NoError(t, inst.Start(context.Background()))
	require.NoError(t, inst.Destroy())
	assert.Equal(t, []string{
		"--version", "--list --quiet",
		"--import oac-demo " + filepath.Join(dir, "distro") + " " + p.Rootfs + " --version 2",
		"-d oac-demo -u root --exec /sbin/oac-guest --transport stdio:// --kept",
		"--terminate oac-demo",
	}, r.commands(), "the first start imports into the kept directory; the end terminates, never unregisters")
	assert.True(t, r.distros["oac-demo"], "the distribution stays registered")
	assert.FileExists(t, filepath.Join(dir, "distro.json"))

	r.calls = nil
	inst, err = p.Create(context.Background(), spec)
	require.NoError(t, err)
	assert.Empty(t, inst.(provider.ImageChecker).ImageChanged())
	require.NoError(t, inst.Start(context.Background()))
	require.NoError(t, inst.Destroy())
	assert.Equal(t, []string{"--version", "--list --quiet", "-d oac-demo -u root --exec /sbin/oac-guest --transport stdio:// --kept", "--terminate oac-demo"},
		r.commands(), "the next start imports nothing")

	require.NoError(t, os.WriteFile(p.Rootfs, []byte("a rebuilt tarball"), 0o644))
	inst, err = p.Create(context.Background(), spec)
	require.NoError(t, err)
	assert.Contains(t, inst.(provider.ImageChecker).ImageChanged(), "until reset", "a changed tarball is said")
	require.NoError(t, inst.Destroy())
	assert.True(t, r.distros["oac-demo"], "and the old distribution kept")

	var k provider.Keeper = p
	r.calls = nil
	require.NoError(t, k.Discard(context.Background(), "demo", dir))
	assert.Equal(t, []string{"--list --quiet", "--unregister oac-demo"}, r.commands())
	assert.Empty(t, r.distros)
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, ents, "Discard leaves nothing in the directory")
	require.NoError(t, k.Discard(context.Background(), "demo", dir), "twice is fine")
}

func TestAKeptSandboxNeverTakesADistributionItDidNotImport(t *testing.T) {
	r := newFakeRunner()
	r.distros["oac-demo"] = true
	p := newTestProvider(t, r)
	dir := t.TempDir()
	_, err := p.Create(context.Background(), provider.Spec{Name: "demo", AgentPath: "unused", Keep: &provider.Keep{Dir: dir}})
	assert.ErrorIs(t, err, provider.ErrExists)
	assert.True(t, r.distros["oac-demo"], "left alone")
	require.NoError(t, p.Discard(context.Background(), "demo", dir))
	assert.True(t, r.distros["oac-demo"], "Discard does not unregister what the sandbox did not import")

	// An import that fails is discarded whole.
	delete(r.distros, "oac-demo")
	r.fail["--import"] = "Error code: Wsl/Service/RegisterDistro/E_FAIL"
	_, err = p.Create(context.Background(), provider.Spec{Name: "demo", AgentPath: "unused", Keep: &provider.Keep{Dir: dir}})
	require.Error(t, err)
	require.NoError(t, p.Discard(context.Background(), "demo", dir))
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, ents)
}
