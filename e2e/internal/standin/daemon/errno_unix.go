//go:build unix

package main

import (
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// errnoName is the errno's symbolic name (EACCES), what the tests match.
func errnoName(errno syscall.Errno) string { return unix.ErrnoName(errno) }

// bindAny binds the socket fd to any address and a port of the kernel's
// choice, and returns the port.
func bindAny(fd int, network string) (int, error) {
	if err := unix.Bind(fd, &unix.SockaddrInet4{}); err != nil {
		return 0, err
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return 0, err
	}
	if a, ok := sa.(*unix.SockaddrInet4); ok {
		return a.Port, nil
	}
	return 0, fmt.Errorf("%s: not an IPv4 socket", network)
}
