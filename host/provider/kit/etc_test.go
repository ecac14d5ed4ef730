//go:build unix

package kit

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeHostEtc makes a host /etc with shared entries of every kind.
func fakeHostEtc(t *testing.T) string {
	t.Helper()
	etc := t.TempDir()
	must := func(err error) { t.Helper(); require.NoError(t, err) }
	must(os.MkdirAll(filepath.Join(etc, "ssl", "certs"), 0o755))
	must(os.WriteFile(filepath.Join(etc, "ssl", "certs", "ca-certificates.crt"), []byte("bundle"), 0o644))
	must(os.Symlink("/usr/share/ca-certificates/mozilla/X.crt", filepath.Join(etc, "ssl", "certs", "X.pem")))
	must(os.Mkdir(filepath.Join(etc, "ssl", "private"), 0o700))
	must(os.WriteFile(filepath.Join(etc, "ssl", "private", "key.pem"), []byte("secret"), 0o600))
	must(os.WriteFile(filepath.Join(etc, "ssl", "openssl.cnf"), []byte("cnf"), 0o644))
	must(os.WriteFile(filepath.Join(etc, "nsswitch.conf"), []byte("hosts: files dns\n"), 0o644))
	must(os.Symlink("../usr/lib/os-release", filepath.Join(etc, "os-release")))
	must(os.WriteFile(filepath.Join(etc, "services"), []byte("root only"), 0o600))
	old := hostEtc
	hostEtc = etc
	t.Cleanup(func() { hostEtc = old })
	return etc
}

func TestPreparedEtcCopiesWhatOthersMayReadAndIsShared(t *testing.T) {
	etc := fakeHostEtc(t)
	cache := t.TempDir()
	dir, err := PreparedEtc(cache, map[string]string{"resolv.conf": "nameserver 127.0.0.1\n"})
	require.NoError(t, err)
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err, name)
		return string(b)
	}
	assert.Equal(t, Passwd(), read("passwd"))
	assert.Equal(t, Group(), read("group"))
	assert.Equal(t, Hosts(""), read("hosts"))
	assert.Equal(t, "nameserver 127.0.0.1\n", read("resolv.conf"))
	assert.Equal(t, "bundle", read("ssl/certs/ca-certificates.crt"))
	assert.Equal(t, "cnf", read("ssl/openssl.cnf"))
	target, err := os.Readlink(filepath.Join(dir, "ssl/certs/X.pem"))
	require.NoError(t, err)
	assert.Equal(t, "/usr/share/ca-certificates/mozilla/X.crt", target, "links stay links: their targets are in the guest's /usr")
	target, err = os.Readlink(filepath.Join(dir, "os-release"))
	require.NoError(t, err)
	assert.Equal(t, "../usr/lib/os-release", target)
	assert.NoDirExists(t, filepath.Join(dir, "ssl/private"), "what only root may read is not copied")
	assert.NoFileExists(t, filepath.Join(dir, "services"))
	st, err := os.Stat(dir)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o755), st.Mode().Perm(), "the guest's ids read it")

	again, err := PreparedEtc(cache, map[string]string{"resolv.conf": "nameserver 127.0.0.1\n"})
	require.NoError(t, err)
	assert.Equal(t, dir, again, "built once, then shared")

	// A changed host entry makes a new one.
	time.Sleep(10 * time.Millisecond)
	require.NoError(t, os.WriteFile(filepath.Join(etc, "ssl", "certs", "ca-certificates.crt"), []byte("new bundle"), 0o644))
	fresh, err := PreparedEtc(cache, map[string]string{"resolv.conf": "nameserver 127.0.0.1\n"})
	require.NoError(t, err)
	assert.NotEqual(t, dir, fresh)
	b, err := os.ReadFile(filepath.Join(fresh, "ssl/certs/ca-certificates.crt"))
	require.NoError(t, err)
	assert.Equal(t, "new bundle", string(b))
	assert.DirExists(t, dir, "the older one stays while a sandbox may still bind it")

	other, err := PreparedEtc(cache, map[string]string{"resolv.conf": "nameserver 10.0.0.1\n"})
	require.NoError(t, err)
	assert.NotEqual(t, fresh, other, "other content, another directory")
	ents, err := os.ReadDir(cache)
	require.NoError(t, err)
	for _, e := range ents {
		assert.NotContains(t, e.Name(), "tmp-", "no build left behind")
	}
}
