//go:build linux

package transparent

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/guest/egress"
	"github.com/oac/sandbox-agent/protocol"
)

// A captured connection the host takes (Config.Hand) is the host's from
// then on: the capture neither opens it another way nor touches it; one
// the host refuses is answered by the capture as ever.
func TestACapturedConnectionIsHandedToTheHost(t *testing.T) {
	var mu sync.Mutex
	var kept []net.Conn
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range kept {
			c.Close()
		}
	})
	hand := func(ctx context.Context, c *net.TCPConn, host string, port int, via string, reply, early []byte) (protocol.EgressReply, bool) {
		assert.Equal(t, protocol.ViaTransparent, via)
		assert.Empty(t, reply, "nothing to answer a captured client")
		assert.Empty(t, early)
		if host == "denied.example" {
			_, r := refusing(ctx, host, port, via)
			return r, true
		}
		// The host's copy of the socket: it answers the client itself.
		f, err := c.File()
		require.NoError(t, err)
		mine, err := net.FileConn(f)
		f.Close()
		require.NoError(t, err)
		mu.Lock()
		kept = append(kept, mine)
		mu.Unlock()
		_, _ = io.WriteString(mine, "from the host")
		return protocol.EgressReply{Code: protocol.EgressOK}, true
	}
	exit := egress.NewExit(nil, egress.Hands("hand", hand), egress.Opens("session", func(context.Context, string, int, string) (net.Conn, protocol.EgressReply) {
		t.Error("a connection the host answered was opened again")
		return refusing(context.Background(), "", 0, "")
	}))
	tr, err := Start(Config{Exit: exit, Ask: func(context.Context, string) protocol.DNSReply { return protocol.DNSReply{} },
		DNSAddr: "127.0.0.1:0", NoInstall: true})
	require.NoError(t, err)
	defer tr.Close()

	c := handled(t, tr, "up.example", 443)
	buf := make([]byte, len("from the host"))
	_, err = io.ReadFull(c, buf)
	require.NoError(t, err)
	assert.Equal(t, "from the host", string(buf), "the capture let go of its descriptor; the host's carries on")

	c = handled(t, tr, "denied.example", 80)
	_, err = io.WriteString(c, "GET / HTTP/1.1\r\nHost: denied.example\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusForbidden, resp.StatusCode, "a refusal the host gave is explained by the capture")
}
