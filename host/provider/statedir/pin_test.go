//go:build unix || windows

package statedir

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/host/provider"
)

// endedHolder claims name, leaves a journal file and lets go as an
// outliving shim does (lock file kept, lock free).
func endedHolder(t *testing.T, root, name string) string {
	t.Helper()
	d, err := Claim(root, name)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(d.Path, "journal"), []byte("events\n"), 0o600))
	d.ReleaseKeeping(func(n string) bool { return n == "journal" })
	return d.Path
}

func TestAPinnedDirectoryOutlastsEverySweepUntilItsLastReaderUnpins(t *testing.T) {
	root := t.TempDir()
	dir := endedHolder(t, root, "ended")
	a, err := Pin(root, "ended")
	require.NoError(t, err)
	b, err := Pin(root, "ended")
	require.NoError(t, err, "readers pin at once")

	Sweep(root, "")
	assert.False(t, SweepName(root, "ended"))
	found, err := Scan(root, "shim.json", 64)
	require.NoError(t, err)
	assert.Empty(t, found, "a pinned directory is neither removed nor reported")
	assert.FileExists(t, filepath.Join(dir, "journal"))

	a.Close()
	assert.False(t, SweepName(root, "ended"), "the other reader still pins it")
	assert.FileExists(t, filepath.Join(dir, "journal"))
	b.Close()
	b.Close() // twice is fine
	assert.True(t, SweepName(root, "ended"), "the last reader gone, it goes")
	assert.NoDirExists(t, dir)
}

func TestAClaimDoesNotTakeOverAPinnedDirectory(t *testing.T) {
	root := t.TempDir()
	dir := endedHolder(t, root, "ended")
	p, err := Pin(root, "ended")
	require.NoError(t, err)
	_, err = Claim(root, "ended")
	require.ErrorIs(t, err, provider.ErrExists)
	assert.ErrorContains(t, err, "still being read")
	assert.FileExists(t, filepath.Join(dir, "journal"), "what the reader reads stays")

	p.Close()
	d, err := Claim(root, "ended")
	require.NoError(t, err, "unpinned, the name is free again")
	defer d.Release()
	assert.NoFileExists(t, filepath.Join(dir, "journal"), "the new holder starts clean")
}

func TestAPinOfALiveHoldersDirectoryKeepsNothingFromTheHolder(t *testing.T) {
	root := t.TempDir()
	d, err := Claim(root, "live")
	require.NoError(t, err)
	p, err := Pin(root, "live")
	require.NoError(t, err)
	defer p.Close()
	require.NoError(t, d.WriteFile("shim.json", []byte("{}")))
	d.Release()
	if runtime.GOOS != "windows" { // where an open file cannot be removed
		assert.NoDirExists(t, d.Path, "the holder's own release removes it, pinned or not")
	}
}

func TestPinFailsWhenTheDirectoryIsNotThere(t *testing.T) {
	_, err := Pin(t.TempDir(), "none")
	assert.ErrorIs(t, err, os.ErrNotExist)
	_, err = Pin(t.TempDir(), "../x")
	assert.ErrorIs(t, err, provider.ErrInvalidSpec)
}

// The point where a pin may lose: its files are open, the pin not yet
// taken. Whatever comes first there, the pin never holds a directory that
// is not the one it opened.
func TestAPinLosesCleanlyToASweepOrATakeoverThatComesFirst(t *testing.T) {
	for _, tc := range []struct {
		name  string
		first func(t *testing.T, root string)
	}{
		{"a sweep removes the ended holder's directory", func(t *testing.T, root string) {
			require.True(t, SweepName(root, "ended"))
		}},
		{"a new holder takes the name over", func(t *testing.T, root string) {
			d, err := Claim(root, "ended")
			require.NoError(t, err)
			t.Cleanup(d.Release)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			endedHolder(t, root, "ended")
			pinOpened = func() { tc.first(t, root) }
			defer func() { pinOpened = nil }()
			p, err := Pin(root, "ended")
			assert.ErrorIs(t, err, os.ErrNotExist)
			assert.Nil(t, p)
		})
	}
}
