//go:build !linux

package transport

import (
	"fmt"
	"net"
)

func dialSerial(path string) (net.Conn, error) {
	return nil, fmt.Errorf("open serial port %s: %w (virtio-serial guests are Linux)", path, ErrUnsupported)
}
