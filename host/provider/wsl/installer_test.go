//go:build unix || windows

package wsl

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/manifest"
)

var msi = []byte("a mirrored MSI")

// installerManifest pins msi as the WSL installer for Windows on this
// architecture, with mirrors and plan as given.
func installerManifest(t *testing.T, mirrors []string, plan *manifest.Install) (string, manifest.Artifact) {
	t.Helper()
	sum := sha256.Sum256(msi)
	a := manifest.Artifact{
		Name: "wsl-installer-windows-" + runtime.GOARCH, Kind: manifest.KindWSLInstaller, Platform: "windows", Arch: runtime.GOARCH,
		URL: "https://storage.example.com/oac/wsl.2.1.5.0.x64.msi", Mirrors: mirrors, Size: int64(len(msi)), SHA256: hex.EncodeToString(sum[:]),
		Install: plan,
	}
	var b bytes.Buffer
	require.NoError(t, manifest.Encode(&manifest.Manifest{Schema: manifest.SchemaVersion, Release: "test-1", Artifacts: []manifest.Artifact{a}}, &b))
	p := filepath.Join(t.TempDir(), "manifest.json")
	require.NoError(t, os.WriteFile(p, b.Bytes(), 0o644))
	return p, a
}

func stageInto(t *testing.T, store string, a manifest.Artifact, content []byte) string {
	t.Helper()
	p := manifest.StorePath(store, a.SHA256)
	require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(t, os.WriteFile(p, content, 0o444))
	return p
}

func TestMissingWSLNamesTheStagedInstallerAndWhatToRun(t *testing.T) {
	r := newFakeRunner()
	r.version = ""
	p := newTestProvider(t, r)
	p.Manifest, _ = installerManifest(t, nil, &manifest.Install{Args: []string{"/passive", "/norestart"}, Restart: true})
	_, a := installerManifest(t, nil, nil)
	p.Store = t.TempDir()
	staged := stageInto(t, p.Store, a, msi)

	err := p.Check(context.Background())
	assert.ErrorIs(t, err, provider.ErrUnavailable)
	assert.ErrorContains(t, err, "WSL is not installed")
	assert.ErrorContains(t, err, "install WSL with the pinned installer wsl.2.1.5.0.x64.msi, staged and verified at "+staged+
		`: run msiexec.exe /i "`+staged+`" /passive /norestart; then restart Windows before WSL is used`)

	// A plan that needs no restart says so.
	p.Manifest, _ = installerManifest(t, nil, &manifest.Install{Args: []string{"/quiet"}})
	assert.ErrorContains(t, p.Check(context.Background()), `/quiet; no restart is needed`)
}

func TestAnInstallerPinnedWithoutAPlanIsRunInteractivelyWithARestart(t *testing.T) {
	r := newFakeRunner()
	r.version = "WSL version: 0.70.4\r\n"
	p := newTestProvider(t, r)
	var a manifest.Artifact
	p.Manifest, a = installerManifest(t, nil, nil)
	p.Store = t.TempDir()
	staged := stageInto(t, p.Store, a, msi)
	err := p.Check(context.Background())
	assert.ErrorContains(t, err, "WSL 0.70.4 is older than 1.0.0")
	assert.ErrorContains(t, err, `run msiexec.exe /i "`+staged+`"; then restart Windows`)
}

func TestAnInstallerNotStagedYetSaysHowToStageIt(t *testing.T) {
	r := newFakeRunner()
	r.version = ""
	p := newTestProvider(t, r)
	var a manifest.Artifact
	p.Manifest, a = installerManifest(t, []string{"https://mirror.example.net/oac/wsl.msi"}, nil)
	p.Store = t.TempDir()
	err := p.Check(context.Background())
	assert.ErrorContains(t, err, "install WSL with the pinned installer wsl.2.1.5.0.x64.msi (14 bytes, sha256 "+a.SHA256+
		") from https://storage.example.com/oac/wsl.2.1.5.0.x64.msi (or 1 mirrors): not staged yet; stage it (oac-image stage --store "+p.Store+
		" --manifest "+p.Manifest+" --name "+a.Name+", which verifies it), then run msiexec.exe /i \""+manifest.StorePath(p.Store, a.SHA256)+"\"; then restart Windows")

	p.Store = ""
	assert.ErrorContains(t, p.Check(context.Background()), "oac-image stage --store DIR --manifest", "outside Windows no store is assumed")
}

func TestADamagedStagedInstallerIsNeverOffered(t *testing.T) {
	r := newFakeRunner()
	r.version = ""
	p := newTestProvider(t, r)
	var a manifest.Artifact
	p.Manifest, a = installerManifest(t, nil, &manifest.Install{Args: []string{"/passive"}, Restart: true})
	p.Store = t.TempDir()
	other := append([]byte(nil), msi...)
	other[0] ^= 1
	stageInto(t, p.Store, a, other)
	err := p.Check(context.Background())
	assert.ErrorContains(t, err, "the staged file does not verify (sha256 mismatch")
	assert.ErrorContains(t, err, "stage it again (oac-image stage --store "+p.Store)
	assert.NotContains(t, err.Error(), "staged and verified")
}
