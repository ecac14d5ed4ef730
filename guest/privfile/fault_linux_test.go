package privfile

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// tmpfsRoot mounts a tmpfs of size bytes (as root) as the walk's root and
// unmounts it when the test ends.
func tmpfsRoot(t *testing.T, size string) string {
	t.Helper()
	needRoot(t)
	dir := t.TempDir()
	require.NoError(t, unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+size+",mode=0755"))
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

func TestWriteOnAFullDiskFailsClearlyAndLeavesNoPartialFile(t *testing.T) {
	root := tmpfsRoot(t, "16k")
	o := Options{UID: 1000, GID: 1000, Root: root}
	// A previous boot's file, then a write that cannot fit.
	old := []byte(`{"version":1,"old":true}`)
	require.NoError(t, Write(file, old, o))
	big := bytes.Repeat([]byte("x"), 64<<10)
	err := Write(file, big, o)
	require.Error(t, err)
	assert.True(t, errors.Is(err, unix.ENOSPC), "%v", err)
	assert.Contains(t, err.Error(), "no space left on device")
	assert.Contains(t, err.Error(), "write "+file, "the error names the file")
	got, err := os.ReadFile(filepath.Join(root, file))
	require.NoError(t, err)
	assert.Equal(t, old, got, "the previous file is untouched: never a partial one")
	assertNoTempFiles(t, filepath.Join(root, filepath.Dir(file)))

	// Nothing there before: nothing there after.
	require.NoError(t, os.Remove(filepath.Join(root, file)))
	require.Error(t, Write(file, big, o))
	_, err = os.Lstat(filepath.Join(root, file))
	assert.True(t, os.IsNotExist(err), "no partial file")
	assertNoTempFiles(t, filepath.Join(root, filepath.Dir(file)))
}

func TestWriteOnAReadOnlyFilesystemFailsClearly(t *testing.T) {
	root := tmpfsRoot(t, "1m")
	o := Options{UID: 1000, GID: 1000, Root: root}
	require.NoError(t, EnsureDir("/home/runtime", o))
	require.NoError(t, unix.Mount("", root, "", unix.MS_REMOUNT|unix.MS_RDONLY, ""))
	err := Write(file, []byte(`{}`), o)
	require.Error(t, err)
	assert.True(t, errors.Is(err, unix.EROFS), "%v", err)
	assert.Contains(t, err.Error(), "read-only file system")
	_, err = os.Lstat(filepath.Join(root, file))
	assert.True(t, os.IsNotExist(err))

	// A directory that has to be created on a read-only root.
	err = Write("/environment/x/file.json", []byte(`{}`), o)
	require.Error(t, err)
	assert.True(t, errors.Is(err, unix.EROFS), "%v", err)
}

func TestWriteOnAFilledDiskBeforeItsDirectoriesExistFailsClearly(t *testing.T) {
	root := tmpfsRoot(t, "4k")
	// Fill the inodes and blocks.
	for i := 0; ; i++ {
		if err := os.WriteFile(filepath.Join(root, "fill"+string(rune('a'+i%26))+string(rune('a'+i/26))), bytes.Repeat([]byte("y"), 4096), 0o600); err != nil {
			break
		}
		if i > 100 {
			t.Fatal("the tmpfs never filled")
		}
	}
	err := Write(file, bytes.Repeat([]byte("z"), 8192), Options{UID: 1000, GID: 1000, Root: root})
	require.Error(t, err)
	assert.True(t, errors.Is(err, unix.ENOSPC), "%v", err)
}
