package transparent

import (
	"bytes"
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

// refuseHTTP reads the client's request head (bounded in time and
// bytes), writes the proxy's refusal response, half-closes, and reads
// what else the client sent before closing, so the response is not lost
// to a reset for unread request bytes. It answers after the head, as a
// server does: an answer that arrives before the client has sent its
// request is one a client may take for an unsolicited response and drop
// (Go's HTTP client does, "readLoopPeekFailLocked"); a client that sends
// nothing is answered at the drain's deadline.
func refuseHTTP(c net.Conn, host string, port int, r protocol.EgressReply) {
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(refusalDrain))
	readHead(c, refusalBytes)
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

// readHead reads from c until the end of an HTTP head (an empty line),
// EOF, an error or max bytes.
func readHead(c net.Conn, max int) {
	buf := make([]byte, 4096)
	var tail []byte
	for n := 0; n < max; {
		k, err := c.Read(buf)
		n += k
		tail = append(tail, buf[:k]...)
		if i := bytes.Index(tail, []byte("\r\n\r\n")); i >= 0 || err != nil {
			return
		}
		if len(tail) > 3 {
			tail = tail[len(tail)-3:]
		}
	}
}
