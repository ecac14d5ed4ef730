package transport_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/protocol/transport"
)

// FuzzParseEndpoint parses arbitrary endpoint strings (they come from flags,
// config files and the kernel command line). It must never panic, and every
// endpoint it accepts must print as a URL that parses back to the same
// endpoint, so logs and error messages name the endpoint faithfully.
func FuzzParseEndpoint(f *testing.F) {
	for _, s := range []string{
		"unix:///run/oac/agent.sock", "vsock://2:1024", "stdio://", "serial:///dev/vport1p1",
		"unix:///a%3Fb", "unix:///a%25b", "unix:///a%0Ab", "stdio:x", "vsock://4294967296:1",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		e, err := transport.Parse(raw)
		if err != nil {
			require.Equal(t, transport.Endpoint{}, e)
			return
		}
		s := e.String()
		back, err := transport.Parse(s)
		require.NoError(t, err, "%q parsed to %#v whose String %q does not parse", raw, e, s)
		require.Equal(t, e, back, "%q -> %q", raw, s)
		require.Equal(t, s, back.String())
	})
}
