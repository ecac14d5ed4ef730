package transport_test

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/protocol/transport"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		want transport.Endpoint
		err  string // empty: valid
	}{
		// unix
		{raw: "unix:///run/oac/agent.sock", want: transport.Endpoint{Scheme: "unix", Path: "/run/oac/agent.sock"}},
		{raw: "unix:/run/oac/agent.sock", want: transport.Endpoint{Scheme: "unix", Path: "/run/oac/agent.sock"}},
		{raw: "UNIX:///run/a.sock", want: transport.Endpoint{Scheme: "unix", Path: "/run/a.sock"}},
		{raw: "unix:///run/with%20space.sock", want: transport.Endpoint{Scheme: "unix", Path: "/run/with space.sock"}},
		{raw: "unix:///", want: transport.Endpoint{Scheme: "unix", Path: "/"}},
		{raw: "unix://run/agent.sock", err: "want unix:///absolute/clean/path"},
		{raw: "unix://localhost/run/agent.sock", err: "want unix:///absolute/clean/path"},
		{raw: "unix:agent.sock", err: "want unix:///absolute/clean/path"},
		{raw: "unix://", err: "want unix:///absolute/clean/path"},
		{raw: "unix:///run/../etc/agent.sock", err: "want unix:///absolute/clean/path"},
		{raw: "unix:///run//agent.sock", err: "want unix:///absolute/clean/path"},
		{raw: "unix:///run/agent.sock/", err: "want unix:///absolute/clean/path"},
		{raw: "unix:///run/./agent.sock", err: "want unix:///absolute/clean/path"},
		{raw: "unix:///run/agent.sock?mode=0600", err: "query and fragment are not allowed"},
		{raw: "unix:///run/agent.sock#x", err: "query and fragment are not allowed"},
		{raw: "unix://user@/run/agent.sock", err: "user info"},

		// vsock
		{raw: "vsock://2:1024", want: transport.Endpoint{Scheme: "vsock", CID: 2, Port: 1024}},
		{raw: "vsock://2:1024/", want: transport.Endpoint{Scheme: "vsock", CID: 2, Port: 1024}},
		{raw: "vsock://4294967295:4294967295", want: transport.Endpoint{Scheme: "vsock", CID: 0xffffffff, Port: 0xffffffff}},
		{raw: "vsock://0:0", want: transport.Endpoint{Scheme: "vsock"}},
		{raw: "vsock://2", err: "want vsock://CID:PORT"},
		{raw: "vsock://2:1024/path", err: "want vsock://CID:PORT"},
		{raw: "vsock://:1024", err: "decimal 32-bit numbers"},
		{raw: "vsock://2:", err: "decimal 32-bit numbers"},
		{raw: "vsock://4294967296:1", err: "decimal 32-bit numbers"},
		{raw: "vsock://2:4294967296", err: "decimal 32-bit numbers"},
		{raw: "vsock://host:1024", err: "decimal 32-bit numbers"},
		{raw: "vsock://0x2:1024", err: "decimal 32-bit numbers"},
		{raw: "vsock://2:1:3", err: "decimal 32-bit numbers"},
		{raw: "vsock://[2]:1", err: "invalid host"},
		{raw: "vsock:2:1024", err: "want vsock://CID:PORT"},
		{raw: "vsock://2:1024?x=1", err: "query and fragment are not allowed"},

		// stdio
		{raw: "stdio://", want: transport.Endpoint{Scheme: "stdio"}},
		{raw: "stdio:///", want: transport.Endpoint{Scheme: "stdio"}},
		{raw: "stdio:", want: transport.Endpoint{Scheme: "stdio"}},
		{raw: "stdio://host", err: "stdio takes no address"},
		{raw: "stdio:///dev/tty", err: "stdio takes no address"},
		{raw: "stdio:tty", err: "stdio takes no address"},

		// serial
		{raw: "serial:///dev/vport1p1", want: transport.Endpoint{Scheme: "serial", Path: "/dev/vport1p1"}},
		{raw: "serial:///dev/hvc0", want: transport.Endpoint{Scheme: "serial", Path: "/dev/hvc0"}},
		{raw: "serial://dev/vport1p1", err: "want serial:///absolute/clean/path"},
		{raw: "serial:///dev/../vport1p1", err: "want serial:///absolute/clean/path"},

		// others
		{raw: "", err: `unknown scheme ""`},
		{raw: "/run/agent.sock", err: `unknown scheme ""`},
		{raw: "tcp://127.0.0.1:1024", err: `unknown scheme "tcp"`},
		{raw: "http://example.com/", err: `unknown scheme "http"`},
		{raw: "unix:///run/\x00.sock", err: "invalid control character"},
		{raw: "unix:///run/%zz.sock", err: "invalid URL escape"},
		{raw: "://x", err: "missing protocol scheme"},
	} {
		t.Run(tc.raw, func(t *testing.T) {
			e, err := transport.Parse(tc.raw)
			if tc.want != (transport.Endpoint{}) {
				require.NoError(t, err)
				assert.Equal(t, tc.want, e)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.err)
			assert.Equal(t, transport.Endpoint{}, e)
		})
	}
}

func TestEndpointStringIsTheCanonicalURL(t *testing.T) {
	for raw, want := range map[string]string{
		"unix:/run/a.sock":               "unix:///run/a.sock",
		"UNIX:///run/a.sock":             "unix:///run/a.sock",
		"serial:///dev/hvc0":             "serial:///dev/hvc0",
		"vsock://002:01024/":             "vsock://2:1024",
		"stdio:":                         "stdio://",
		"stdio:///":                      "stdio://",
		"unix:///run/with%20space.sock":  "unix:///run/with%20space.sock",
		"unix:///run/q%3Fmark%23hash":    "unix:///run/q%3Fmark%23hash",
		"unix:///run/percent%25sign":     "unix:///run/percent%25sign",
		"unix:///run/%E2%9C%93/a.sock":   "unix:///run/%E2%9C%93/a.sock",
		"unix:///run/colon:at@semi;.eq=": "unix:///run/colon:at@semi;.eq=",
	} {
		e, err := transport.Parse(raw)
		require.NoError(t, err, raw)
		assert.Equal(t, want, e.String(), raw)
		back, err := transport.Parse(e.String())
		require.NoError(t, err, e.String())
		assert.Equal(t, e, back, raw)
	}
}

func TestUnixEndpointDialsARealSocket(t *testing.T) {
	e := transport.Endpoint{Scheme: transport.SchemeUnix, Path: filepath.Join(t.TempDir(), "a.sock")}
	l, err := net.Listen("unix", e.Path)
	require.NoError(t, err)
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			accepted <- c
		}
		close(accepted)
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := e.Dial(ctx)
	require.NoError(t, err)
	defer c.Close()
	s := <-accepted
	require.NotNil(t, s)
	defer s.Close()

	_, err = c.Write([]byte("ping"))
	require.NoError(t, err)
	buf := make([]byte, 4)
	_, err = s.Read(buf)
	require.NoError(t, err)
	assert.Equal(t, "ping", string(buf))
	_, err = s.Write([]byte("pong"))
	require.NoError(t, err)
	_, err = c.Read(buf)
	require.NoError(t, err)
	assert.Equal(t, "pong", string(buf))
}

func TestUnixDialOfAMissingSocketNamesTheEndpoint(t *testing.T) {
	e := transport.Endpoint{Scheme: transport.SchemeUnix, Path: filepath.Join(t.TempDir(), "missing.sock")}

	_, err := e.Dial(context.Background())

	require.Error(t, err)
	assert.Contains(t, err.Error(), "dial "+e.String())
}

func TestAnEndpointOfUnknownSchemeDoesNotDial(t *testing.T) {
	e := transport.Endpoint{Scheme: "tcp", Path: "/x"}

	_, err := e.Dial(context.Background())
	require.ErrorIs(t, err, transport.ErrUnsupported)
}

func TestStdioDialReturnsAConnNamedStdio(t *testing.T) {
	// Not closed: closing it would close the test binary's stdin and stdout.
	c, err := transport.Endpoint{Scheme: transport.SchemeStdio}.Dial(context.Background())

	require.NoError(t, err)
	assert.Equal(t, "stdio", c.LocalAddr().String())
	assert.Equal(t, "stdio", c.RemoteAddr().String())
}
