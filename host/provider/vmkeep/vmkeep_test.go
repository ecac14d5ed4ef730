package vmkeep

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/host/provider"
)

// fakeMkfs is a mkfs.ext4 stand-in that records its arguments beside the
// disk and exits with status code.
func fakeMkfs(t *testing.T, code int) (mkfs, log string) {
	t.Helper()
	d := t.TempDir()
	log = filepath.Join(d, "args")
	mkfs = filepath.Join(d, "mkfs.ext4")
	script := "#!/bin/sh\necho \"$@\" >> " + log + "\nexit " + string(rune('0'+code)) + "\n"
	require.NoError(t, os.WriteFile(mkfs, []byte(script), 0o755))
	return mkfs, log
}

func entries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func TestPrepareCopiesTheImageOnceAndTellsAChangedImage(t *testing.T) {
	mkfs, log := fakeMkfs(t, 0)
	image := filepath.Join(t.TempDir(), "disk.ext4")
	require.NoError(t, os.WriteFile(image, []byte("image one"), 0o644))
	dir := t.TempDir()

	k, err := Prepare(dir, image, mkfs, 1<<20)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, ImageName), k.Image)
	assert.Equal(t, filepath.Join(dir, DiskName), k.Disk)
	assert.Empty(t, k.Changed)
	assert.ElementsMatch(t, []string{ImageName, RecordName, DiskName}, entries(t, dir), "nothing half made is left")
	b, err := os.ReadFile(k.Image)
	require.NoError(t, err)
	assert.Equal(t, "image one", string(b))
	st, err := os.Stat(k.Disk)
	require.NoError(t, err)
	assert.Equal(t, int64(1<<20), st.Size(), "the kept disk has the size asked for")
	args, err := os.ReadFile(log)
	require.NoError(t, err)
	assert.Equal(t, strings.Join(MkfsArgs(k.Disk+tmpSuffix), " ")+"\n", string(args), "mkfs.ext4 ran once, on the disk being made")

	// The same image, even touched: nothing to say, nothing made again.
	future := time.Now().Add(time.Hour)
	require.NoError(t, os.Chtimes(image, future, future))
	k, err = Prepare(dir, image, mkfs, 1<<20)
	require.NoError(t, err)
	assert.Empty(t, k.Changed, "a touched image with the same content is the same image")
	args, _ = os.ReadFile(log)
	assert.Equal(t, 1, strings.Count(string(args), "\n"), "the kept disk is made once")

	// A rebuilt image: said, and the sandbox keeps its copy of the old.
	require.NoError(t, os.WriteFile(image, []byte("image two!"), 0o644))
	k, err = Prepare(dir, image, mkfs, 1<<20)
	require.NoError(t, err)
	assert.Contains(t, k.Changed, "is not the one this sandbox was created from")
	assert.Contains(t, k.Changed, "until reset")
	b, err = os.ReadFile(k.Image)
	require.NoError(t, err)
	assert.Equal(t, "image one", string(b), "the old image is kept until reset")

	// Gone: said too.
	require.NoError(t, os.Remove(image))
	k, err = Prepare(dir, image, mkfs, 1<<20)
	require.NoError(t, err)
	assert.Contains(t, k.Changed, "cannot be read")
}

func TestPrepareKeepsTheWayTheSandboxWasCreated(t *testing.T) {
	mkfs, _ := fakeMkfs(t, 0)
	image := filepath.Join(t.TempDir(), "disk.erofs")
	require.NoError(t, os.WriteFile(image, []byte("x"), 0o644))

	withDisk := t.TempDir()
	_, err := Prepare(withDisk, image, mkfs, 1<<20)
	require.NoError(t, err)
	_, err = Prepare(withDisk, "", mkfs, 1<<20)
	assert.ErrorIs(t, err, provider.ErrInvalidSpec)
	assert.ErrorContains(t, err, "created from the root disk")

	initramfs := t.TempDir()
	k, err := Prepare(initramfs, "", mkfs, 1<<20)
	require.NoError(t, err)
	assert.Empty(t, k.Image, "no root disk: only the kept disk")
	assert.Equal(t, []string{DiskName}, entries(t, initramfs))
	_, err = Prepare(initramfs, image, mkfs, 1<<20)
	assert.ErrorIs(t, err, provider.ErrInvalidSpec)
	assert.ErrorContains(t, err, "without a root disk")
}

func TestAFailedPrepareIsDiscardedAndDiscardTouchesNothingElse(t *testing.T) {
	mkfs, _ := fakeMkfs(t, 1)
	image := filepath.Join(t.TempDir(), "disk.ext4")
	require.NoError(t, os.WriteFile(image, []byte("x"), 0o644))
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "not-ours"), []byte("y"), 0o600))

	_, err := Prepare(dir, image, mkfs, 1<<20)
	require.Error(t, err)
	assert.Contains(t, err.Error(), mkfs)
	assert.Contains(t, entries(t, dir), DiskName+tmpSuffix, "a cut-short create leaves a part")

	require.NoError(t, Discard(dir))
	assert.Equal(t, []string{"not-ours"}, entries(t, dir), "only what Prepare made is removed")
	require.NoError(t, Discard(dir), "discarding twice is fine")
	require.NoError(t, Discard(filepath.Join(dir, "gone")), "so is a directory that is gone")

	_, err = Prepare(t.TempDir(), filepath.Join(dir, "missing"), mkfs, 1<<20)
	assert.ErrorIs(t, err, provider.ErrInvalidSpec)
}

func TestMkfsSaysWhatToInstall(t *testing.T) {
	got, err := Mkfs("qemu", "/opt/mkfs")
	require.NoError(t, err)
	assert.Equal(t, "/opt/mkfs", got)
	t.Setenv("PATH", t.TempDir())
	if _, err := os.Stat("/usr/sbin/mkfs.ext4"); err == nil {
		got, err := Mkfs("qemu", "")
		require.NoError(t, err)
		assert.Equal(t, "/usr/sbin/mkfs.ext4", got)
		return
	}
	_, err = Mkfs("qemu", "")
	assert.ErrorIs(t, err, provider.ErrUnavailable)
	assert.ErrorContains(t, err, "e2fsprogs")
}

func TestARealKeptDiskIsSparseExt4(t *testing.T) {
	mkfs, err := Mkfs("test", "")
	if err != nil {
		t.Skip("mkfs.ext4 is not installed (apt-get install e2fsprogs)")
	}
	dir := t.TempDir()
	k, err := Prepare(dir, "", mkfs, DefaultDiskSize)
	require.NoError(t, err)
	f, err := os.Open(k.Disk)
	require.NoError(t, err)
	defer f.Close()
	b := make([]byte, 2)
	_, err = f.ReadAt(b, 1080)
	require.NoError(t, err)
	assert.Equal(t, []byte{0x53, 0xEF}, b, "an ext4 superblock")
	st, err := os.Stat(k.Disk)
	require.NoError(t, err)
	used := diskUsage(st)
	t.Logf("a %d GiB kept disk uses %d KiB on the host", DefaultDiskSize>>30, used>>10)
	assert.Less(t, used, int64(DefaultDiskSize/16), "the kept disk stays sparse")
}
