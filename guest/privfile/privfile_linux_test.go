package privfile

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const file = "/home/runtime/sandbox-io-bootstrap.json"

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true: these tests chown files and must run as root")
		}
		t.Skip("chowns files: run as root")
	}
}

func opts(t *testing.T) Options {
	return Options{UID: 1000, GID: 1000, Root: t.TempDir()}
}

func statOf(t *testing.T, p string) (os.FileMode, uint32, uint32) {
	t.Helper()
	st, err := os.Lstat(p)
	require.NoError(t, err)
	sys := st.Sys().(*syscall.Stat_t)
	return st.Mode(), sys.Uid, sys.Gid
}

func TestWriteCreatesDirectoriesAndAPrivateFile(t *testing.T) {
	needRoot(t)
	o := opts(t)
	require.NoError(t, Write(file, []byte(`{"a":1}`), o))
	got, err := os.ReadFile(filepath.Join(o.Root, file))
	require.NoError(t, err)
	assert.Equal(t, `{"a":1}`, string(got))
	mode, uid, gid := statOf(t, filepath.Join(o.Root, file))
	assert.Equal(t, os.FileMode(0o600), mode)
	assert.Equal(t, [2]uint32{1000, 1000}, [2]uint32{uid, gid})
	for _, d := range []string{"/home", "/home/runtime"} {
		mode, uid, gid := statOf(t, filepath.Join(o.Root, d))
		assert.Equal(t, os.ModeDir|0o700, mode, d)
		assert.Equal(t, [2]uint32{1000, 1000}, [2]uint32{uid, gid}, d)
	}
	assertNoTempFiles(t, filepath.Join(o.Root, "/home/runtime"))
}

func TestWriteReplacesAStaleFileAtomically(t *testing.T) {
	needRoot(t)
	o := opts(t)
	dir := filepath.Join(o.Root, "home/runtime")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	stale := filepath.Join(dir, "sandbox-io-bootstrap.json")
	require.NoError(t, os.WriteFile(stale, []byte("stale content from an earlier boot"), 0o644))
	// A reader holding the old file keeps seeing the old content: the new
	// one is a different inode renamed over it.
	old, err := os.Open(stale)
	require.NoError(t, err)
	defer old.Close()

	require.NoError(t, Write(file, []byte("new"), o))
	got, _ := os.ReadFile(stale)
	assert.Equal(t, "new", string(got))
	mode, uid, _ := statOf(t, stale)
	assert.Equal(t, os.FileMode(0o600), mode)
	assert.Equal(t, uint32(1000), uid)
	buf := make([]byte, 64)
	n, _ := old.Read(buf)
	assert.Equal(t, "stale content from an earlier boot", string(buf[:n]))
	// Existing directories are not changed.
	dmode, duid, _ := statOf(t, dir)
	assert.Equal(t, os.ModeDir|0o755, dmode)
	assert.Equal(t, uint32(0), duid)
	assertNoTempFiles(t, dir)
}

func TestWriteRefusesASymlinkAtTheFileAndLeavesItsTargetUntouched(t *testing.T) {
	needRoot(t)
	o := opts(t)
	dir := filepath.Join(o.Root, "home/runtime")
	require.NoError(t, os.MkdirAll(dir, 0o700))
	target := filepath.Join(o.Root, "shadow")
	require.NoError(t, os.WriteFile(target, []byte("root:secret"), 0o640))
	link := filepath.Join(dir, "sandbox-io-bootstrap.json")
	require.NoError(t, os.Symlink(target, link))

	err := Write(file, []byte("attacker wins"), o)
	require.ErrorIs(t, err, ErrSymlink)
	got, _ := os.ReadFile(target)
	assert.Equal(t, "root:secret", string(got))
	mode, uid, _ := statOf(t, target)
	assert.Equal(t, os.FileMode(0o640), mode)
	assert.Equal(t, uint32(0), uid, "the target was not chowned")
	lmode, _, _ := statOf(t, link)
	assert.True(t, lmode&os.ModeSymlink != 0, "the link is left in place")
	assertNoTempFiles(t, dir)
}

func TestWriteRefusesASymlinkedDirectory(t *testing.T) {
	needRoot(t)
	o := opts(t)
	elsewhere := filepath.Join(o.Root, "etc")
	require.NoError(t, os.MkdirAll(elsewhere, 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(o.Root, "home"), 0o755))
	require.NoError(t, os.Symlink(elsewhere, filepath.Join(o.Root, "home/runtime")))

	err := Write(file, []byte("x"), o)
	require.ErrorIs(t, err, ErrSymlink)
	assert.Contains(t, err.Error(), "/home/runtime is a symbolic link")
	ents, _ := os.ReadDir(elsewhere)
	assert.Empty(t, ents, "nothing was written through the link")
	mode, uid, _ := statOf(t, elsewhere)
	assert.Equal(t, os.ModeDir|0o755, mode)
	assert.Equal(t, uint32(0), uid)

	// The same for a link higher up.
	o2 := opts(t)
	require.NoError(t, os.Symlink(elsewhere, filepath.Join(o2.Root, "home")))
	require.ErrorIs(t, Write(file, []byte("x"), o2), ErrSymlink)
	require.ErrorIs(t, EnsureDir("/home/runtime", o2), ErrSymlink)
}

func TestWriteRefusesADirectoryOrFifoAtTheFile(t *testing.T) {
	needRoot(t)
	o := opts(t)
	require.NoError(t, os.MkdirAll(filepath.Join(o.Root, file), 0o700))
	require.ErrorIs(t, Write(file, []byte("x"), o), ErrNotRegular)

	o2 := opts(t)
	require.NoError(t, os.MkdirAll(filepath.Join(o2.Root, "home/runtime"), 0o700))
	require.NoError(t, syscall.Mkfifo(filepath.Join(o2.Root, file), 0o600))
	require.ErrorIs(t, Write(file, []byte("x"), o2), ErrNotRegular)
	require.ErrorIs(t, func() error { _, err := Read(file, 100, o2); return err }(), ErrNotRegular)

	o3 := opts(t)
	require.NoError(t, os.WriteFile(filepath.Join(o3.Root, "home"), nil, 0o600))
	require.ErrorIs(t, Write(file, []byte("x"), o3), ErrNotDir)
}

func TestWriteSkipsAPlantedTemporaryName(t *testing.T) {
	needRoot(t)
	o := opts(t)
	dir := filepath.Join(o.Root, "home/runtime")
	require.NoError(t, os.MkdirAll(dir, 0o700))
	// O_EXCL refuses existing names, symlinks included; createTemp picks
	// another random name. Plant a few symlinks to show they stay.
	target := filepath.Join(o.Root, "target")
	require.NoError(t, os.WriteFile(target, []byte("keep"), 0o600))
	for i := range 3 {
		require.NoError(t, os.Symlink(target, filepath.Join(dir, ".sandbox-io-bootstrap.json.tmp-planted"+string(rune('a'+i)))))
	}
	require.NoError(t, Write(file, []byte("ok"), o))
	got, _ := os.ReadFile(target)
	assert.Equal(t, "keep", string(got))
}

func TestEnsureDirCreatesMissingDirectoriesOnly(t *testing.T) {
	needRoot(t)
	o := opts(t)
	require.NoError(t, os.MkdirAll(filepath.Join(o.Root, "environment"), 0o755))
	require.NoError(t, EnsureDir("/environment/workspace", o))
	mode, uid, _ := statOf(t, filepath.Join(o.Root, "environment/workspace"))
	assert.Equal(t, os.ModeDir|0o700, mode)
	assert.Equal(t, uint32(1000), uid)
	mode, uid, _ = statOf(t, filepath.Join(o.Root, "environment"))
	assert.Equal(t, os.ModeDir|0o755, mode, "an existing directory is left alone")
	assert.Equal(t, uint32(0), uid)
	require.NoError(t, EnsureDir("/environment/workspace", o), "idempotent")
}

func TestReadChecksTypeOwnerModeAndSize(t *testing.T) {
	needRoot(t)
	o := opts(t)
	require.NoError(t, Write(file, []byte("provided"), o))
	got, err := Read(file, 16<<10, o)
	require.NoError(t, err)
	assert.Equal(t, "provided", string(got))

	p := filepath.Join(o.Root, file)
	_, err = Read(file, 4, o)
	require.ErrorIs(t, err, ErrTooLarge)

	require.NoError(t, os.Chmod(p, 0o644))
	_, err = Read(file, 100, o)
	require.ErrorIs(t, err, ErrMode)
	require.NoError(t, os.Chmod(p, 0o600))

	require.NoError(t, os.Chown(p, 0, 0))
	_, err = Read(file, 100, o)
	require.ErrorIs(t, err, ErrOwner)
	require.NoError(t, os.Chown(p, 1000, 1000))

	require.NoError(t, os.Rename(p, p+".real"))
	require.NoError(t, os.Symlink(p+".real", p))
	_, err = Read(file, 100, o)
	require.ErrorIs(t, err, ErrSymlink)

	_, err = Read("/home/runtime/missing.json", 100, o)
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestPathsMustBeAbsoluteAndClean(t *testing.T) {
	o := Options{Root: t.TempDir()}
	for _, p := range []string{"relative", "/a/../b", "/", "/a//b", "/a\x00b"} {
		require.ErrorIs(t, Write(p, nil, o), ErrPath, p)
	}
}

func assertNoTempFiles(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range ents {
		assert.False(t, strings.Contains(e.Name(), ".tmp-") && !strings.Contains(e.Name(), "planted"), "temporary file left: %s", e.Name())
	}
}
