package transparent

import (
	"io"
	"net"
	"strconv"
	"time"

	"github.com/oac/sandbox-agent/guest/egress"
	"github.com/oac/sandbox-agent/protocol"
)

// Handle carries one connection whose target is known (the capture, and
// benchmarks and tests without a namespace) as an attempt of the guest's
// way out. A refusal of a connection to port 80 is answered with the
// proxy's explanatory HTTP response (403 for the policy); any other is a
// reset: the kernel already completed the handshake, and nothing else is
// safe to write into a protocol the guest does not know. Either way the
// host's egress event names the connection (its source port), the rule
// and the reason, and the workload can ask the guest why
// (egress.RefusalsPath).
func (t *Transparent) Handle(c net.Conn, host string, port int) {
	t.cfg.Exit.Attempt(t.ctx, c, host, port, protocol.ViaTransparent).Carry(nil, nil, func(r protocol.EgressReply) {
		t.cfg.Log.Debug("capture: refused", "target", net.JoinHostPort(host, strconv.Itoa(port)), "code", r.Code.String(), "reason", r.Reason)
		if port == 80 {
			refuseHTTP(c, host, port, r)
			return
		}
		reset(c)
	})
}

// Bounds of the answer to a refused port-80 connection.
const (
	refusalWrite = 5 * time.Second
	refusalDrain = 2 * time.Second
	refusalBytes = 64 << 10
)

// refuseHTTP writes the proxy's refusal response, half-closes, and reads
// what the client sent (bounded in time and bytes) before closing, so the
// response is not lost to a reset for unread request bytes.
func refuseHTTP(c net.Conn, host string, port int, r protocol.EgressReply) {
	defer c.Close()
	_ = c.SetWriteDeadline(time.Now().Add(refusalWrite))
	if _, err := io.WriteString(c, egress.RefusalResponse(host, port, r)); err != nil {
		return
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_ = c.SetReadDeadline(time.Now().Add(refusalDrain))
	_, _ = io.Copy(io.Discard, io.LimitReader(c, refusalBytes))
}
