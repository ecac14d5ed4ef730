//go:build !linux

package transport

import (
	"context"
	"fmt"
	"net"
)

func dialVsock(_ context.Context, cid, port uint32) (net.Conn, error) {
	return nil, fmt.Errorf("dial vsock://%d:%d: %w (AF_VSOCK sockets exist only on Linux; on macOS the vz provider owns the vsock device)", cid, port, ErrUnsupported)
}
