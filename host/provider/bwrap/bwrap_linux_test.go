package bwrap

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/provider/kit"
)

func newTestProvider(t *testing.T) *Provider {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("creating a bwrap sandbox chowns its state to a mapped id range: run as root")
	}
	return &Provider{Bwrap: "/bin/true", StateRoot: t.TempDir(), IDBase: 2_000_000_000}
}

func spec(name string) provider.Spec {
	return provider.Spec{Name: name, AgentPath: "/bin/true"}
}

func TestCreateClaimsADistinctIDRangePerSandbox(t *testing.T) {
	p := newTestProvider(t)
	a, err := p.Create(context.Background(), spec("a"))
	require.NoError(t, err)
	defer a.Destroy()
	b, err := p.Create(context.Background(), spec("b"))
	require.NoError(t, err)
	defer b.Destroy()
	ua, _ := a.(*Instance).HostID(1000)
	ub, _ := b.(*Instance).HostID(1000)
	assert.Equal(t, 2_000_000_000+1000, ua)
	assert.Equal(t, 2_000_000_000+kit.IDRange+1000, ub)
}

func TestASandboxNameCanOnlyRunOnce(t *testing.T) {
	p := newTestProvider(t)
	a, err := p.Create(context.Background(), spec("same"))
	require.NoError(t, err)
	_, err = p.Create(context.Background(), spec("same"))
	require.ErrorIs(t, err, provider.ErrExists)
	require.NoError(t, a.Destroy())
	again, err := p.Create(context.Background(), spec("same"))
	require.NoError(t, err, "the name is free again after Destroy")
	require.NoError(t, again.Destroy())
}

func TestStateDirectoryIsPrivateToTheGuestRootAndRemovedOnDestroy(t *testing.T) {
	p := newTestProvider(t)
	in, err := p.Create(context.Background(), spec("priv"))
	require.NoError(t, err)
	dir := filepath.Join(p.StateRoot, "sandboxes", "priv")
	st, err := os.Stat(dir)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), st.Mode().Perm())
	sock, err := os.Stat(filepath.Join(dir, "agent.sock"))
	require.NoError(t, err)
	assert.Equal(t, os.ModeSocket, sock.Mode().Type())
	assert.Equal(t, os.FileMode(0o600), sock.Mode().Perm())
	require.NoError(t, in.Destroy())
	require.NoError(t, in.Destroy(), "Destroy is idempotent")
	_, err = os.Stat(dir)
	assert.True(t, os.IsNotExist(err))
}

func TestStaleStateFromADeadShimIsReplaced(t *testing.T) {
	p := newTestProvider(t)
	dir := filepath.Join(p.StateRoot, "sandboxes", "stale")
	require.NoError(t, os.MkdirAll(dir, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "agent.sock"), []byte("left over"), 0o600))
	in, err := p.Create(context.Background(), spec("stale"))
	require.NoError(t, err)
	defer in.Destroy()
	st, err := os.Stat(filepath.Join(dir, "agent.sock"))
	require.NoError(t, err)
	assert.Equal(t, os.ModeSocket, st.Mode().Type())
}

func TestCreateRefusesBadSpecsAndLeavesNothing(t *testing.T) {
	p := newTestProvider(t)
	_, err := p.Create(context.Background(), provider.Spec{Name: "../x", AgentPath: "/bin/true"})
	require.ErrorIs(t, err, provider.ErrInvalidSpec)
	_, err = p.Create(context.Background(), provider.Spec{Name: "noagent", AgentPath: "/nonexistent"})
	require.ErrorIs(t, err, provider.ErrInvalidSpec)
	_, err = os.Stat(filepath.Join(p.StateRoot, "sandboxes", "noagent"))
	assert.True(t, os.IsNotExist(err), "a failed Create leaves no state directory")
}

func TestSearchableByOthers(t *testing.T) {
	parent := t.TempDir()
	require.NoError(t, os.Chmod(parent, 0o755))
	dir := filepath.Join(parent, "a", "rootfs")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	if st, err := os.Stat(filepath.Dir(parent)); err != nil || st.Mode().Perm()&0o001 == 0 {
		t.Skip("the temporary directory's parents are not searchable by others here")
	}
	require.NoError(t, searchableByOthers(dir))
	require.NoError(t, os.Chmod(filepath.Join(parent, "a"), 0o700))
	err := searchableByOthers(dir)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "(mode 0700) is not searchable by others")
}
