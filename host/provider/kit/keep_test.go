//go:build unix

package kit

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func owner(t *testing.T, p string) (int, int) {
	t.Helper()
	st, err := os.Lstat(p)
	require.NoError(t, err)
	s := st.Sys().(*syscall.Stat_t)
	return int(s.Uid), int(s.Gid)
}

func TestAKeptSandboxGetsItsSlotAgainOrMovesItsFilesToTheNewOne(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (chown to a sandbox's id range)")
	}
	state, keep := t.TempDir(), t.TempDir()
	base := 2_000_000_000
	ids, err := ClaimKeptIDs(state, base, keep)
	require.NoError(t, err)
	assert.Equal(t, base, ids.Base, "the first free slot")
	k, err := PrepareKept(keep, "", []string{"oac-sandbox-io"}, ids.HostID)
	require.NoError(t, err)
	uid, _ := owner(t, k.UsrLocal)
	assert.Equal(t, base+1000, uid, "/usr/local is the workload's")
	uid, _ = owner(t, k.Bin())
	assert.Equal(t, base, uid, "/usr/local/bin is guest root's")
	uid, _ = owner(t, filepath.Join(k.Bin(), "oac-sandbox-io"))
	assert.Equal(t, base, uid, "the install's mount point")
	f := filepath.Join(k.Home, "runtime-file")
	require.NoError(t, os.WriteFile(f, []byte("x"), 0o600))
	require.NoError(t, os.Lchown(f, base+1000, base+1000))
	ids.Close()

	// Free: the same slot again, nothing moves.
	ids, err = ClaimKeptIDs(state, base, keep)
	require.NoError(t, err)
	assert.Equal(t, base, ids.Base)
	ids.Close()

	// Taken by another sandbox meanwhile: a new slot, the files follow.
	other, err := ClaimIDs(state, base)
	require.NoError(t, err)
	defer other.Close()
	ids, err = ClaimKeptIDs(state, base, keep)
	require.NoError(t, err)
	defer ids.Close()
	assert.Equal(t, base+IDRange, ids.Base)
	u, g := owner(t, f)
	assert.Equal(t, [2]int{base + IDRange + 1000, base + IDRange + 1000}, [2]int{u, g})
	uid, _ = owner(t, k.Bin())
	assert.Equal(t, base+IDRange, uid)
	uid, _ = owner(t, filepath.Join(keep, keptIDsFile))
	assert.Equal(t, 0, uid, "the shim's own file is not the guest's")

	require.NoError(t, DiscardKept(keep))
	ents, err := os.ReadDir(keep)
	require.NoError(t, err)
	assert.Empty(t, ents)
}

func TestPrepareKeptSeedsUsrLocalFromTheImageOnce(t *testing.T) {
	rootfs, keep := t.TempDir(), t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(rootfs, "usr", "local", "bin"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(rootfs, "usr", "local", "bin", "oac-sandbox-io"), []byte("image's"), 0o755))
	id := func(n int) (int, int) { return os.Getuid(), os.Getgid() }
	k, err := PrepareKept(keep, rootfs, nil, id)
	require.NoError(t, err)
	b, err := os.ReadFile(filepath.Join(k.Bin(), "oac-sandbox-io"))
	require.NoError(t, err)
	assert.Equal(t, "image's", string(b), "the image's /usr/local is there")
	require.NoError(t, os.WriteFile(filepath.Join(k.UsrLocal, "lib", "pkg"), []byte("installed"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(rootfs, "usr", "local", "bin", "oac-sandbox-io"), []byte("new image's"), 0o755))
	_, err = PrepareKept(keep, rootfs, nil, id)
	require.NoError(t, err)
	b, err = os.ReadFile(filepath.Join(k.Bin(), "oac-sandbox-io"))
	require.NoError(t, err)
	assert.Equal(t, "image's", string(b), "seeded once: the kept state is not replaced")
	_, err = os.Stat(filepath.Join(k.UsrLocal, "lib", "pkg"))
	assert.NoError(t, err)
}
