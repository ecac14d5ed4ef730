package directguard

import (
	"os"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/moby/sys/mountinfo"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestACgroupIsFoundUnderTheMountThatShowsIt(t *testing.T) {
	for _, c := range []struct {
		rel, root, mountpoint, want string
		ok                          bool
	}{
		{"/", "/", "/sys/fs/cgroup", "/sys/fs/cgroup", true},
		{"/a/b", "/", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/unified/a/b", true},
		{"/a/b", "/a", "/mnt", "/mnt/b", true},
		{"/a", "/a", "/mnt", "/mnt", true},
		{"/ab", "/a", "/mnt", "", false},
		{"/a", "/a/b", "/mnt", "", false},
	} {
		got, ok := cgroupInMount(c.rel, c.root, c.mountpoint)
		assert.Equal(t, c.ok, ok, "%+v", c)
		assert.Equal(t, c.want, got, "%+v", c)
	}
}

func inode(t *testing.T, f *os.File) uint64 {
	t.Helper()
	st, err := f.Stat()
	require.NoError(t, err)
	return st.Sys().(*syscall.Stat_t).Ino
}

func mountpoints(t *testing.T) []string {
	t.Helper()
	ms, err := mountinfo.GetMounts(nil)
	require.NoError(t, err)
	var out []string
	for _, m := range ms {
		out = append(out, m.Mountpoint)
	}
	return out
}

// The fallback where no cgroup2 is mounted: a private mount, in a mount
// namespace of one thread, opens the same cgroup, and the host's mount
// table never shows it.
func TestWithoutACgroup2MountTheGuardMountsItsOwnPrivately(t *testing.T) {
	needRoot(t)
	visible, where, err := openCgroup()
	require.NoError(t, err)
	defer visible.Close()
	if where[0] == '(' {
		t.Skip("no cgroup2 mount here to compare with")
	}
	before := mountpoints(t)
	rel, err := ownCgroup()
	require.NoError(t, err)
	private, err := openCgroupPrivately(rel)
	require.NoError(t, err)
	defer private.Close()
	assert.Equal(t, before, mountpoints(t), "the host's mount table is unchanged")
	assert.Equal(t, inode(t, visible), inode(t, private), "the same cgroup")

	// A program attached through the private descriptor is attached to
	// the cgroup everyone sees.
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.CGroupSockAddr,
		AttachType:   ebpf.AttachCGroupInet4Connect,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()},
		License:      "GPL",
	})
	require.NoError(t, err)
	defer prog.Close()
	l, err := link.AttachRawLink(link.RawLinkOptions{Target: int(private.Fd()), Program: prog, Attach: ebpf.AttachCGroupInet4Connect})
	require.NoError(t, err)
	defer l.Close()
	info, err := prog.Info()
	require.NoError(t, err)
	id, _ := info.ID()
	r, err := link.QueryPrograms(link.QueryOptions{Target: int(visible.Fd()), Attach: ebpf.AttachCGroupInet4Connect})
	require.NoError(t, err)
	var ids []ebpf.ProgramID
	for _, p := range r.Programs {
		ids = append(ids, p.ID)
	}
	assert.Contains(t, ids, id)
}
