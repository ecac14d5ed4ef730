//go:build linux

package vminit

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestDetectFSReadsTheSuperblockMagic(t *testing.T) {
	ext4 := make([]byte, 4096)
	ext4[1080], ext4[1081] = 0x53, 0xEF
	fs, err := DetectFS(bytes.NewReader(ext4))
	require.NoError(t, err)
	assert.Equal(t, "ext4", fs)

	erofs := make([]byte, 4096)
	copy(erofs[1024:], []byte{0xE2, 0xE1, 0xF5, 0xE0})
	fs, err = DetectFS(bytes.NewReader(erofs))
	require.NoError(t, err)
	assert.Equal(t, "erofs", fs)

	_, err = DetectFS(bytes.NewReader(make([]byte, 4096)))
	assert.ErrorContains(t, err, "neither an ext4 nor an erofs filesystem")
	_, err = DetectFS(bytes.NewReader(make([]byte, 100)))
	assert.ErrorContains(t, err, "read superblock")
}

func TestRemoveTreeFreesEverythingButWhatItKeeps(t *testing.T) {
	dir := t.TempDir()
	for p, content := range map[string]string{"init": "1234", "lib/modules/a.ko": "123456", "etc/oac/modules": "x", "newroot/keep": "kept"} {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, p), []byte(content), 0o644))
	}
	require.NoError(t, os.Symlink("init", filepath.Join(dir, "sbin-init")))
	var st unix.Stat_t
	require.NoError(t, unix.Lstat(dir, &st))
	freed := removeTree(dir, st.Dev, filepath.Join(dir, "newroot"))
	assert.Equal(t, int64(11), freed, "the bytes of the regular files removed")
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, ents, 1)
	assert.Equal(t, "newroot", ents[0].Name())
	b, err := os.ReadFile(filepath.Join(dir, "newroot", "keep"))
	require.NoError(t, err)
	assert.Equal(t, "kept", string(b))
	assert.Zero(t, removeTree(dir, st.Dev+1, ""), "nothing on another device is touched")
	_, err = os.Stat(filepath.Join(dir, "newroot", "keep"))
	assert.NoError(t, err)
}

func TestHandLocalTo1000GivesTheKeptLocalDirsToTheWorkload(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown needs root")
	}
	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, "usr/local/bin"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(root, "usr/local/lib"), 0o755))
	require.NoError(t, os.Symlink("/etc", filepath.Join(root, "usr/local/etc")))
	require.NoError(t, HandLocalTo1000(root))
	owner := func(p string) uint32 {
		var st unix.Stat_t
		require.NoError(t, unix.Lstat(filepath.Join(root, p), &st))
		return st.Uid
	}
	assert.Equal(t, uint32(1000), owner("usr/local"))
	assert.Equal(t, uint32(1000), owner("usr/local/lib"))
	assert.Equal(t, uint32(0), owner("usr/local/bin"), "bin stays root's: the host's installs are laid there")
	assert.Equal(t, uint32(0), owner("usr/local/etc"), "a symlink is never followed")
}
