package vmguest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/host/provider"
)

func TestSharesAreTheWorkspaceAndTheVolumes(t *testing.T) {
	work, home, env := t.TempDir(), t.TempDir(), t.TempDir()
	shares, err := Shares(work, false, map[string]string{"/home": home, "/environment": env})
	require.NoError(t, err)
	assert.Equal(t, []Share{
		{Tag: "environment", HostPath: env, GuestPath: "/environment"},
		{Tag: "workspace", HostPath: work, GuestPath: "/environment/workspace"},
		{Tag: "home", HostPath: home, GuestPath: "/home"},
	}, shares, "sorted by guest path: /environment is mounted before the workspace in it")
	assert.Equal(t, []string{"oac.root=vda", "oac.shares=environment:/environment,workspace:/environment/workspace,home:/home"},
		KernelParams(true, false, shares))
	assert.Empty(t, KernelParams(false, false, nil), "an initramfs guest without shares needs nothing")
	assert.Equal(t, []string{"oac.root=vda", "oac.keep=vdb"}, KernelParams(true, true, nil), "a kept disk comes after the root disk")
	assert.Equal(t, []string{"oac.keep=vda"}, KernelParams(false, true, nil), "without a root disk it is the first")

	none, err := Shares("", false, nil)
	require.NoError(t, err)
	assert.Empty(t, none)
}

func TestSharesRefuseWhatIsNotADirectory(t *testing.T) {
	f := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(f, nil, 0o644))
	_, err := Shares(f, false, nil)
	assert.ErrorIs(t, err, provider.ErrInvalidSpec)
	assert.ErrorContains(t, err, "shared directory: "+f+" is not a directory")
	_, err = Shares("", false, map[string]string{"/home": "relative/dir"})
	assert.ErrorContains(t, err, "volume /home: relative/dir is not an absolute path")
}

func TestInstallFilesAndComposeInitramfs(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "initramfs.img")
	require.NoError(t, os.WriteFile(base, []byte("base"), 0o644))
	got, err := ComposeInitramfs(base, filepath.Join(dir, "composed.img"), nil)
	require.NoError(t, err)
	assert.Equal(t, base, got, "nothing to install: the base as it is")

	tool := filepath.Join(dir, "tool")
	require.NoError(t, os.WriteFile(tool, []byte("#!tool"), 0o700))
	files, err := InstallFiles(map[string]string{"b": tool, "a": tool})
	require.NoError(t, err)
	assert.Equal(t, "/usr/local/bin/a", files[0].Dst, "in name order")
	assert.Equal(t, os.FileMode(0o755), files[0].Mode)
	got, err = ComposeInitramfs(base, filepath.Join(dir, "composed.img"), map[string]string{"tool": tool})
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, "composed.img"), got)

	_, err = InstallFiles(map[string]string{"x": dir})
	assert.ErrorIs(t, err, provider.ErrInvalidSpec)
}
