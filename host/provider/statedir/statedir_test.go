//go:build unix || windows

package statedir

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/host/provider"
)

func TestClaimLocksClearsStaleContentAndReleaseRemoves(t *testing.T) {
	root := t.TempDir()
	stale := filepath.Join(root, "sandboxes", "a", "old.sock")
	require.NoError(t, os.MkdirAll(filepath.Dir(stale), 0o700))
	require.NoError(t, os.WriteFile(stale, nil, 0o600))

	d, err := Claim(root, "a")
	require.NoError(t, err)
	assert.NoFileExists(t, stale, "a leftover whose lock is free is stale")
	st, err := os.Stat(d.Path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), st.Mode().Perm())

	_, err = Claim(root, "a")
	assert.ErrorIs(t, err, provider.ErrExists)

	d.Release()
	d.Release()
	assert.NoDirExists(t, d.Path)
	again, err := Claim(root, "a")
	require.NoError(t, err, "free again after release")
	again.Release()
}

func TestClaimSlotTakesTheLowestFreeSlot(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ids")
	s0, f0, err := ClaimSlot(dir, 2, "id")
	require.NoError(t, err)
	s1, f1, err := ClaimSlot(dir, 2, "id")
	require.NoError(t, err)
	assert.Equal(t, [2]int{0, 1}, [2]int{s0, s1})
	_, _, err = ClaimSlot(dir, 2, "id")
	assert.EqualError(t, err, "all 2 id slots are in use: stop some sandboxes")
	f0.Close()
	s, f, err := ClaimSlot(dir, 2, "id")
	require.NoError(t, err)
	assert.Equal(t, 0, s, "a released slot is reused")
	f.Close()
	f1.Close()
}

func TestSweepRemovesLeftoversOfKilledShimsButNotRunningOnes(t *testing.T) {
	root := t.TempDir()
	// A shim killed with SIGKILL: its socket and lock file stay, unlocked.
	stale := filepath.Join(root, "sandboxes", "killed")
	require.NoError(t, os.MkdirAll(filepath.Join(stale, "etc"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(stale, "agent.sock"), nil, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(stale, "lock"), nil, 0o600))
	running, err := Claim(root, "running")
	require.NoError(t, err)
	defer running.Release()
	require.NoError(t, os.WriteFile(filepath.Join(running.Path, "agent.sock"), nil, 0o600))

	next, err := Claim(root, "next") // every Claim sweeps
	require.NoError(t, err)
	defer next.Release()
	assert.NoDirExists(t, stale, "the killed shim's directory is removed")
	assert.FileExists(t, filepath.Join(running.Path, "agent.sock"), "a running sandbox's directory is untouched")
}

func TestALockLeftAMomentByAKilledShimsChildIsWaitedOut(t *testing.T) {
	root := t.TempDir()
	held, err := Claim(root, "b")
	require.NoError(t, err)
	// Another open file description of the same lock stands in for the
	// child a killed shim forked: it lets go 100 ms later.
	other, err := os.OpenFile(filepath.Join(held.Path, "lock"), os.O_RDWR, 0)
	require.NoError(t, err)
	held.lock.Close()
	require.NoError(t, tryLock(other))
	go func() {
		time.Sleep(100 * time.Millisecond)
		other.Close()
	}()
	d, err := Claim(root, "b")
	require.NoError(t, err, "the lock was let go within heldWait")
	d.Release()
}

func TestReleaseKeepingLeavesWhatItNamesForTheNextSweep(t *testing.T) {
	root := t.TempDir()
	d, err := Claim(root, "k")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(d.Path, "keep-me"), []byte("x"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(d.Path, "drop-me"), []byte("x"), 0o600))
	d.ReleaseKeeping(func(n string) bool { return n == "keep-me" })
	d.ReleaseKeeping(func(string) bool { return true }) // once only
	assert.FileExists(t, filepath.Join(d.Path, "keep-me"))
	assert.NoFileExists(t, filepath.Join(d.Path, "drop-me"))
	assert.FileExists(t, filepath.Join(d.Path, "lock"), "the free lock stays: what a sweep judges by")

	held, err := Claim(root, "held")
	require.NoError(t, err)
	defer held.Release()
	assert.False(t, SweepName(root, "held"), "a held directory is never swept")
	assert.False(t, SweepName(root, "../k"), "only a sandbox's name")
	assert.True(t, SweepName(root, "k"))
	assert.NoDirExists(t, d.Path)
	assert.True(t, SweepName(root, "never-there"))
}
