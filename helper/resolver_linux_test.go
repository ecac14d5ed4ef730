package helper

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/protocol"
)

func resolvConf(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "resolv.conf")
	require.NoError(t, os.WriteFile(path, []byte(content), 0o644))
	return path
}

func TestThePinnedResolverUsesTheNameserversResolvConfListsNow(t *testing.T) {
	path := resolvConf(t, "nameserver 10.0.0.2\nnameserver fd00::53\noptions ndots:1\n# comment\nnameserver bogus\n")
	r, servers, _ := pinnedResolver(path)
	require.NotNil(t, r)
	assert.Equal(t, []string{"10.0.0.2:53", "[fd00::53]:53"}, servers, "in order, port 53, the bogus one left out")
	assert.True(t, r.PreferGo, "the Go resolver, which dials the pinned servers")
}

func TestThePinnedResolverDialsItsServersInTurnWhateverResolvConfSaysLater(t *testing.T) {
	path := resolvConf(t, "nameserver 127.0.0.1\nnameserver 127.0.0.2\n")
	r, servers, _ := pinnedResolver(path)
	require.NotNil(t, r)
	require.Equal(t, []string{"127.0.0.1:53", "127.0.0.2:53"}, servers)

	// The agent then places its own resolv.conf; the resolver keeps the
	// servers it read, and ignores the address the Go resolver asks for.
	require.NoError(t, os.WriteFile(path, []byte("nameserver 127.0.0.53\n"), 0o644))
	var dialed []string
	for range 3 {
		conn, err := r.Dial(context.Background(), "udp", "192.0.2.1:53")
		require.NoError(t, err)
		dialed = append(dialed, conn.RemoteAddr().String())
		require.NoError(t, conn.Close())
	}
	assert.Equal(t, []string{"127.0.0.1:53", "127.0.0.2:53", "127.0.0.1:53"}, dialed)
}

func TestAZonedNameserverIsPinnedWithoutItsZone(t *testing.T) {
	_, servers, _ := pinnedResolver(resolvConf(t, "nameserver fe80::1%eth0\n"))
	assert.Equal(t, []string{"[fe80::1]:53"}, servers)
}

func TestWithoutNameserversThePinnedResolverIsTheDefault(t *testing.T) {
	for name, path := range map[string]string{
		"a missing file":     filepath.Join(t.TempDir(), "missing"),
		"an empty file":      resolvConf(t, ""),
		"no nameserver line": resolvConf(t, "options ndots:1\n# nameserver 10.0.0.2\nsearch example.com\n"),
		"only bogus ones":    resolvConf(t, "nameserver bogus\nnameserver\nnameserver 10.0.0.256\n"),
		"a directory":        t.TempDir(),
	} {
		r, servers, _ := pinnedResolver(path)
		assert.Nil(t, r, name)
		assert.Nil(t, servers, name)
	}
}

func TestTheAgentsOwnResolvConfIsNeverPinned(t *testing.T) {
	r, servers, err := pinnedResolver(resolvConf(t, protocol.ResolvConf))
	assert.Nil(t, r)
	assert.Empty(t, servers)
	assert.ErrorIs(t, err, ErrOwnResolvConf, "the broker would ask the workload's resolver, its own client")
}
