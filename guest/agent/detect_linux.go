package agent

import (
	"fmt"
	"os"

	"github.com/oac/sandbox-agent/protocol/transport"
)

// Well-known places where a provider offers the transport.
const (
	DefaultUnixSocket = "/run/oac/agent.sock"
	DefaultVsockPort  = 1024
	vsockHostCID      = 2
)

// DetectEndpoint picks the transport when none is given: $OAC_TRANSPORT, then
// the socket a container-like provider binds at DefaultUnixSocket, then vsock
// to the host when /dev/vsock exists.
func DetectEndpoint() (transport.Endpoint, error) {
	if v := os.Getenv("OAC_TRANSPORT"); v != "" {
		return transport.Parse(v)
	}
	if st, err := os.Stat(DefaultUnixSocket); err == nil && st.Mode()&os.ModeSocket != 0 {
		return transport.Endpoint{Scheme: transport.SchemeUnix, Path: DefaultUnixSocket}, nil
	}
	if _, err := os.Stat("/dev/vsock"); err == nil {
		return transport.Endpoint{Scheme: transport.SchemeVsock, CID: vsockHostCID, Port: DefaultVsockPort}, nil
	}
	return transport.Endpoint{}, fmt.Errorf("no transport found: pass --transport URL (no %s socket, no /dev/vsock, OAC_TRANSPORT unset)", DefaultUnixSocket)
}
