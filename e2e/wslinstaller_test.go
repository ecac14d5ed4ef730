//go:build linux

package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/manifest"
)

// wslCheck runs the real oac-shim check against the fake wsl.exe and
// returns the wsl provider's status.
func wslCheck(t *testing.T, w *fakeWSL, args ...string) (available bool, reason string) {
	t.Helper()
	cmd := exec.Command(bins.shim, append([]string{"check", "--json", "--wsl", bins.fakeWSL}, args...)...)
	cmd.Env = append(os.Environ(), w.env...)
	out, _ := cmd.Output()
	var report struct {
		Providers []struct {
			Name      string
			Available bool
			Reason    string
		}
	}
	require.NoError(t, json.Unmarshal(out, &report), string(out))
	for _, p := range report.Providers {
		if p.Name == "wsl" {
			return p.Available, p.Reason
		}
	}
	t.Fatal("check lists no wsl provider")
	return false, ""
}

// On Windows without WSL (the fake wsl.exe answers --version as the inbox
// stub does) the release's pinned installer, built into the manifest by
// the real oac-image build with a mirror and its plan, is staged and
// verified by the real oac-image stage like an image (its first mirror
// serves other bytes), and oac-shim check names where it is staged, what
// to run and that Windows must restart after.
func TestWSLMissingStagesTheMirroredInstallerAndCheckSaysWhatToRun(t *testing.T) {
	needRootForState(t)
	w := newFakeWSL(t, "missing")
	dir := t.TempDir()
	msi := filepath.Join(dir, "wsl.2.1.5.0.x64.msi")
	require.NoError(t, os.WriteFile(msi, []byte("a mirrored MSI, pinned by its digest"), 0o644))
	out := filepath.Join(dir, "release")
	bad, good := newMirror(t, out, "corrupt"), newMirror(t, out, "good")
	build, err := exec.Command(bins.image, "build", "--agent", bins.guest, "--sandbox-io", bins.sandboxIO, "--output", "tar",
		"--wsl-installer", msi, "--wsl-installer-args", "/passive /norestart", "--base-url", bad.URL+"/oac", "--mirror-url", good.URL+"/oac",
		"--release", "e2e-1", "-o", out).CombinedOutput()
	require.NoError(t, err, "%s", build)
	mf := filepath.Join(out, "manifest.json")
	f, err := os.Open(mf)
	require.NoError(t, err)
	m, err := manifest.Decode(f)
	f.Close()
	require.NoError(t, err)
	arts := m.Find("", manifest.KindWSLInstaller, "windows", "amd64")
	require.Len(t, arts, 1)
	art := arts[0]
	require.Equal(t, []string{good.URL + "/oac/wsl.2.1.5.0.x64.msi"}, art.Mirrors)
	store := filepath.Join(dir, "store")
	staged := manifest.StorePath(store, art.SHA256)

	available, reason := wslCheck(t, w, "--manifest", mf, "--store", store)
	assert.False(t, available)
	assert.Contains(t, reason, "WSL is not installed, or is the Windows component without --version")
	assert.Contains(t, reason, "install WSL with the pinned installer wsl.2.1.5.0.x64.msi (36 bytes, sha256 "+art.SHA256+") from "+art.URL+" (or 1 mirrors): not staged yet")
	assert.Contains(t, reason, "stage it (oac-image stage --store "+store+" --manifest "+mf+" --name "+art.Name+", which verifies it)")

	code, stdout, stderr := runStage(t, "--store", store, "--manifest", mf, "--kind", manifest.KindWSLInstaller, "--platform", "windows", "--quiet")
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, art.Name+" "+staged+"\n", stdout)
	assert.Contains(t, stderr, "oac-image: "+art.Name+": a mirror failed: download corrupted", "a corrupt mirror is said even with --quiet")
	assert.Contains(t, stderr, "mirror "+bad.host+" served other bytes")
	assert.Contains(t, stderr, "oac-image: "+art.Name+": staged from mirror "+good.host)
	require.NoError(t, manifest.VerifyFile(art, staged))

	available, reason = wslCheck(t, w, "--manifest", mf, "--store", store)
	assert.False(t, available)
	assert.Contains(t, reason, "install WSL with the pinned installer wsl.2.1.5.0.x64.msi, staged and verified at "+staged+
		`: run msiexec.exe /i "`+staged+`" /passive /norestart; then restart Windows before WSL is used`)

	// A run says the same and creates nothing.
	s := startShim(t, sandboxSpec{provider: "wsl", env: w.env, args: append(w.args(), "--manifest", mf, "--store", store)})
	failed := s.waitState(api.StateFailed, 10*time.Second)
	assert.Contains(t, failed.Message, `run msiexec.exe /i "`+staged+`" /passive /norestart`)
	s.exitFailed(api.CodeProviderUnavailable, 10*time.Second)
	for _, c := range w.calls(t) {
		assert.Equal(t, "--version", c, "nothing but --version ran")
	}

	// A staged file damaged since is never offered: check says to stage it
	// again, and oac-image stage replaces it.
	require.NoError(t, os.Chmod(staged, 0o644))
	require.NoError(t, os.WriteFile(staged, []byte("a mirrored MSI, pinned by its digesT"), 0o444))
	_, reason = wslCheck(t, w, "--manifest", mf, "--store", store)
	assert.Contains(t, reason, "the staged file does not verify (sha256 mismatch")
	assert.NotContains(t, reason, "staged and verified")
	code, _, stderr = runStage(t, "--store", store, "--manifest", mf, "--name", art.Name, "--quiet")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stderr, "the staged file was damaged")
	require.NoError(t, manifest.VerifyFile(art, staged))
	_, reason = wslCheck(t, w, "--manifest", mf, "--store", store)
	assert.Contains(t, reason, "staged and verified at "+staged)
}
