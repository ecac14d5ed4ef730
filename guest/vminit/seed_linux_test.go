package vminit

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func imageLocal(t *testing.T, sandboxIO string) string {
	t.Helper()
	local := filepath.Join(t.TempDir(), "usr-local")
	require.NoError(t, os.MkdirAll(filepath.Join(local, "bin"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(local, "lib", "tool"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(local, "bin", "oac-sandbox-io"), []byte(sandboxIO), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(local, "lib", "tool", "data"), []byte("image"), 0o644))
	return local
}

func TestAFirstStartSeedsTheKeptVolumeWithTheImagesUsrLocal(t *testing.T) {
	vol := t.TempDir()
	require.NoError(t, seedKept(vol, imageLocal(t, "v1")))
	for _, d := range []string{"home", "environment", "usr-local/lib/tool"} {
		st, err := os.Stat(filepath.Join(vol, d))
		require.NoError(t, err, d)
		assert.True(t, st.IsDir(), d)
	}
	b, err := os.ReadFile(filepath.Join(vol, "usr-local", "bin", "oac-sandbox-io"))
	require.NoError(t, err)
	assert.Equal(t, "v1", string(b))
	st, err := os.Stat(filepath.Join(vol, "usr-local", "bin", "oac-sandbox-io"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o755), st.Mode().Perm(), "an executable stays executable")
}

func TestALaterStartKeepsWhatTheWorkloadInstalledAndRenewsBinFromTheImage(t *testing.T) {
	vol := t.TempDir()
	require.NoError(t, seedKept(vol, imageLocal(t, "v1")))
	installed := filepath.Join(vol, "usr-local", "lib", "node_modules", "pkg")
	require.NoError(t, os.MkdirAll(installed, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(installed, "index.js"), []byte("kept"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(vol, "usr-local", "bin", "planted"), []byte("x"), 0o755))

	require.NoError(t, seedKept(vol, imageLocal(t, "v2")))
	b, err := os.ReadFile(filepath.Join(installed, "index.js"))
	require.NoError(t, err)
	assert.Equal(t, "kept", string(b), "what the workload installed survives")
	b, err = os.ReadFile(filepath.Join(vol, "usr-local", "bin", "oac-sandbox-io"))
	require.NoError(t, err)
	assert.Equal(t, "v2", string(b), "bin is the image's again")
	_, err = os.Stat(filepath.Join(vol, "usr-local", "bin", "planted"))
	assert.ErrorIs(t, err, os.ErrNotExist, "nothing the workload put in bin survives")
}

func TestASymlinkTheWorkloadPutInPlaceOfBinIsRemovedNotFollowed(t *testing.T) {
	vol := t.TempDir()
	require.NoError(t, seedKept(vol, imageLocal(t, "v1")))
	outside := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(outside, "precious"), []byte("keep"), 0o644))
	bin := filepath.Join(vol, "usr-local", "bin")
	require.NoError(t, os.RemoveAll(bin))
	require.NoError(t, os.Symlink(outside, bin))
	home := filepath.Join(vol, "home")
	require.NoError(t, os.Remove(home))
	require.NoError(t, os.Symlink(outside, home))

	require.NoError(t, seedKept(vol, imageLocal(t, "v1")))
	st, err := os.Lstat(bin)
	require.NoError(t, err)
	assert.True(t, st.IsDir(), "bin is a directory again")
	st, err = os.Lstat(home)
	require.NoError(t, err)
	assert.True(t, st.IsDir(), "home is a directory again")
	b, err := os.ReadFile(filepath.Join(outside, "precious"))
	require.NoError(t, err)
	assert.Equal(t, "keep", string(b))
	entries, err := os.ReadDir(outside)
	require.NoError(t, err)
	assert.Len(t, entries, 1, "nothing was written through the symlink")
}

func TestSeedingRefusesAMissingVolume(t *testing.T) {
	err := seedKept(filepath.Join(t.TempDir(), "absent"), imageLocal(t, "v1"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "is the claim mounted there?")
}
