//go:build kubernetes && unix

package kubernetes

import (
	"fmt"
	"net"
	"os"
	"syscall"
)

// sessionPair joins the session (host) to the exec stream (pod) through
// a socketpair: the kernel buffers each direction (net.Pipe hands every
// write over synchronously, so the session's writer waited for the exec
// stream's reader on every frame).
func sessionPair() (host, pod net.Conn, err error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes: the session's socketpair: %w", err)
	}
	conns := make([]net.Conn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "kubernetes session")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			for _, o := range conns[:i] {
				o.Close()
			}
			if i == 0 {
				syscall.Close(fds[1])
			}
			return nil, nil, fmt.Errorf("kubernetes: the session's socketpair: %w", err)
		}
		conns[i] = c
	}
	return conns[0], conns[1], nil
}
