package kit

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestTheSeccompProfileIsTheEnginesDefaultPlusTheLaunchersCalls(t *testing.T) {
	b, err := ContainerSeccompProfile()
	require.NoError(t, err)
	var got seccomp.Seccomp
	require.NoError(t, json.Unmarshal(b, &got))
	def := seccomp.DefaultProfile()
	require.Len(t, got.Syscalls, len(def.Syscalls)+2, "the default's rules, then two")
	defJSON, err := json.Marshal(def.Syscalls)
	require.NoError(t, err)
	gotJSON, err := json.Marshal(got.Syscalls[:len(def.Syscalls)])
	require.NoError(t, err)
	assert.JSONEq(t, string(defJSON), string(gotJSON), "the engine's default rules are unchanged")
	assert.Equal(t, def.DefaultAction, got.DefaultAction)
	assert.Equal(t, specs.ActErrno, got.DefaultAction, "anything not listed is refused")

	clone := got.Syscalls[len(def.Syscalls)]
	assert.Equal(t, []string{"clone"}, clone.Names)
	assert.Equal(t, specs.ActAllow, clone.Action)
	require.Len(t, clone.Args, 1)
	a := clone.Args[0]
	assert.Equal(t, specs.OpMaskedEqual, a.Op)
	// flags & mask == value: a user and a mount namespace, and no other.
	allowed := func(flags uint64) bool { return flags&a.Value == a.ValueTwo }
	assert.True(t, allowed(unix.CLONE_NEWUSER|unix.CLONE_NEWNS|uint64(unix.SIGCHLD)|unix.CLONE_PIDFD))
	for _, f := range []uint64{0, unix.CLONE_NEWNS, unix.CLONE_NEWUSER, unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWNET,
		unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID, unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP} {
		assert.False(t, allowed(f), "flags %#x", f)
	}

	calls := got.Syscalls[len(def.Syscalls)+1]
	assert.Equal(t, specs.ActAllow, calls.Action)
	assert.Equal(t, []string{"fsconfig", "fsmount", "fsopen", "mount", "umount2"}, calls.Names)
	for _, n := range []string{"unshare", "setns", "clone3", "open_tree", "move_mount", "pivot_root", "mount_setattr"} {
		for _, r := range got.Syscalls[len(def.Syscalls):] {
			assert.False(t, slices.Contains(r.Names, n), "%s stays the default's", n)
		}
	}
}
