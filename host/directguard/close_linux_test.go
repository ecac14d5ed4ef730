package directguard

import (
	"os"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// attached lists the programs attached to cgroup f at the guard's attach
// points.
func attached(t *testing.T, f *os.File, ids map[ebpf.AttachType]ebpf.ProgramID) map[ebpf.AttachType][]ebpf.ProgramID {
	t.Helper()
	out := map[ebpf.AttachType][]ebpf.ProgramID{}
	for attach := range ids {
		r, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: attach})
		require.NoError(t, err)
		for _, ap := range r.Programs {
			out[attach] = append(out[attach], ap.ID)
		}
	}
	return out
}

func (g *Guard) programIDs(t *testing.T) map[ebpf.AttachType]ebpf.ProgramID {
	t.Helper()
	out := map[ebpf.AttachType]ebpf.ProgramID{}
	for i, p := range programs(g.m) {
		info, err := g.progs[i].Info()
		require.NoError(t, err)
		id, ok := info.ID()
		require.True(t, ok)
		out[p.attach] = id
	}
	return out
}

func TestCloseAbortsDetachesAndReleases(t *testing.T) {
	needRoot(t)
	cg, _, err := openCgroup()
	require.NoError(t, err)
	defer cg.Close()
	dir := t.TempDir()

	start := time.Now()
	g, err := Open(Config{ShareDir: dir})
	require.NoError(t, err)
	t.Logf("Open took %v", time.Since(start))
	ids := g.programIDs(t)
	for attach, id := range ids {
		assert.Contains(t, attached(t, cg, ids)[attach], id, "%v attached", attach)
	}

	l, up := listen(t, "127.0.0.1")
	c := dialLocked(t, g, up, true)
	s, err := l.Accept()
	require.NoError(t, err)
	defer s.Close()

	require.NoError(t, g.Close())
	now := attached(t, cg, ids)
	for attach, id := range ids {
		assert.NotContains(t, now[attach], id, "%v detached", attach)
	}
	require.NoError(t, s.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err = s.Read(make([]byte, 1))
	assert.ErrorContains(t, err, "connection reset", "the sealed socket was aborted first: nothing is left unguarded")
	_, err = c.Read(make([]byte, 1))
	assert.Error(t, err)

	assert.NoError(t, g.Close(), "a second close is harmless")
	_, err = g.Abort()
	assert.ErrorIs(t, err, errClosed)
	rc, err := c.SyscallConn()
	require.NoError(t, err)
	assert.ErrorIs(t, g.Seal(rc), errClosed)
	assert.ErrorIs(t, g.Lock("tcp4", up, rc), errClosed)

	again, err := Open(Config{ShareDir: dir})
	require.NoError(t, err)
	defer again.Close()
	glo, ghi := g.Share()
	alo, ahi := again.Share()
	assert.Equal(t, [2]int{glo, ghi}, [2]int{alo, ahi}, "the share was released")
	assert.False(t, slices.Contains(attached(t, cg, ids)[ebpf.AttachCGroupInet4Connect], ids[ebpf.AttachCGroupInet4Connect]))
}
