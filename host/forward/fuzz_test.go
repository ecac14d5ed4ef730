package forward

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzParseSpec feeds arbitrary --forward values and control-API listen
// strings to the parser. It must never panic; an accepted spec is a
// loopback address or a clean absolute path, with a port 1..65535, and
// prints back to what was parsed.
func FuzzParseSpec(f *testing.F) {
	for _, s := range []string{
		"127.0.0.1:8080=4096", "[::1]:0=22", "/run/oac/d.sock=4096", "0.0.0.0:1=1",
		"127.0.0.1:8080=04096", "=", "a=b=c", "/a/../b=1", "[fe80::1%eth0]:1=1",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sp, err := ParseSpec(s)
		if err != nil {
			require.Less(t, len(err.Error()), 400, "errors quote a bounded prefix")
			return
		}
		require.GreaterOrEqual(t, sp.GuestPort, 1)
		require.LessOrEqual(t, sp.GuestPort, 65535)
		if sp.IsUnix() {
			require.True(t, strings.HasPrefix(sp.Listen, "/"))
			require.NotContains(t, sp.Listen, "/../")
		} else {
			ap, err := netip.ParseAddrPort(sp.Listen)
			require.NoError(t, err)
			require.True(t, ap.Addr().IsLoopback())
		}
		require.Equal(t, s, sp.String())
	})
}
