//go:build unix || windows

package statedir

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestARecordIsOwnerOnlyAndReadWhileItsHolderLives(t *testing.T) {
	root := t.TempDir()
	d, err := Claim(root, "a")
	require.NoError(t, err)
	defer d.Release()
	require.NoError(t, d.WriteFile("shim.json", []byte(`{"v":1}`)))
	require.NoError(t, d.WriteFile("shim.json", []byte(`{"v":2}`)), "replaced whole")
	st, err := os.Stat(filepath.Join(d.Path, "shim.json"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	for _, bad := range []string{"", "lock", "../x", ".hidden"} {
		assert.Error(t, d.WriteFile(bad, nil), "%q is refused", bad)
	}

	found, err := Scan(root, "shim.json", 64)
	require.NoError(t, err)
	require.Len(t, found, 1)
	assert.Equal(t, Found{Name: "a", Held: true, Record: []byte(`{"v":2}`)}, found[0])
	assert.DirExists(t, d.Path, "a live holder's directory stays")
}

func TestScanReportsAndRemovesADeadHoldersRecordNeverTakingItForALiveOne(t *testing.T) {
	root := t.TempDir()
	live, err := Claim(root, "live")
	require.NoError(t, err)
	defer live.Release()
	require.NoError(t, live.WriteFile("shim.json", []byte(`{"pid":8}`)))
	// A holder killed with SIGKILL: its directory, record and lock stay,
	// the lock free.
	dead := filepath.Join(root, "sandboxes", "dead")
	require.NoError(t, os.MkdirAll(dead, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dead, "lock"), nil, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dead, "shim.json"), []byte(`{"pid":7}`), 0o600))

	found, err := Scan(root, "shim.json", 64)
	require.NoError(t, err)
	assert.ElementsMatch(t, []Found{
		{Name: "dead", Held: false, Record: []byte(`{"pid":7}`)},
		{Name: "live", Held: true, Record: []byte(`{"pid":8}`)},
	}, found)
	assert.NoDirExists(t, dead, "the dead holder's directory is removed")

	found, err = Scan(root, "shim.json", 64)
	require.NoError(t, err)
	assert.Equal(t, []Found{{Name: "live", Held: true, Record: []byte(`{"pid":8}`)}}, found, "reported once")
}

func TestScanBoundsTheRecordAndRefusesASymlink(t *testing.T) {
	root := t.TempDir()
	big, err := Claim(root, "big")
	require.NoError(t, err)
	defer big.Release()
	require.NoError(t, big.WriteFile("shim.json", make([]byte, 65)))
	link, err := Claim(root, "link")
	require.NoError(t, err)
	defer link.Release()
	secret := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(secret, []byte("x"), 0o600))
	require.NoError(t, os.Symlink(secret, filepath.Join(link.Path, "shim.json")))

	found, err := Scan(root, "shim.json", 64)
	require.NoError(t, err)
	require.Len(t, found, 2)
	for _, f := range found {
		assert.True(t, f.Held)
		assert.Nil(t, f.Record, f.Name)
		assert.Error(t, f.Err, f.Name)
	}
}

func TestWatchSeesItsHolderGoAndNeverTakesALaterOneForIt(t *testing.T) {
	root := t.TempDir()
	_, err := Watch(root, "a")
	assert.ErrorIs(t, err, os.ErrNotExist, "nobody holds it")

	d, err := Claim(root, "a")
	require.NoError(t, err)
	h, err := Watch(root, "a")
	require.NoError(t, err)
	defer h.Close()
	assert.False(t, h.Gone())
	assert.False(t, h.Gone(), "asking does not take the lock")

	d.Release()
	assert.True(t, h.Gone())
	again, err := Claim(root, "a")
	require.NoError(t, err, "a watch that saw its holder go holds nothing")
	defer again.Release()
	assert.True(t, h.Gone(), "a later holder of the name is not the one watched")
}

func TestWatchSeesADeadHolderGoAndAClaimTakesItOver(t *testing.T) {
	root := t.TempDir()
	d, err := Claim(root, "a")
	require.NoError(t, err)
	h, err := Watch(root, "a")
	require.NoError(t, err)
	defer h.Close()
	// Death: the descriptor closes with the directory left in place.
	d.lock.Close()
	d.lock = nil
	assert.True(t, h.Gone())
	assert.DirExists(t, d.Path)
	next, err := Claim(root, "a")
	require.NoError(t, err)
	defer next.Release()
	assert.True(t, h.Gone(), "the new holder reuses the lock file, and is still not the watched one")
}
