//go:build linux

package main

import (
	"fmt"
	"net"
	"runtime"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// reach connects to addr with no proxy (the capture, or in direct mode
// the host's own socket) and tries, on that connection, what would reach
// past it into its network namespace: list the interfaces (SIOCGIFCONF),
// bind it to one (SO_BINDTODEVICE), disconnect it (connect AF_UNSPEC,
// the first step of connecting it elsewhere). Each result is "ok" or the
// errno's name.
func reach(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, probeTimeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return "", err
	}
	var out string
	name := func(e error) string {
		if e == nil {
			return "ok"
		}
		if errno, ok := e.(syscall.Errno); ok {
			return errnoName(errno)
		}
		return e.Error()
	}
	err = rc.Control(func(fd uintptr) {
		var buf [1024]byte
		conf := struct {
			len int32
			_   int32
			buf uintptr
		}{len: int32(len(buf)), buf: uintptr(unsafe.Pointer(&buf[0]))}
		_, _, e := unix.Syscall(unix.SYS_IOCTL, fd, unix.SIOCGIFCONF, uintptr(unsafe.Pointer(&conf)))
		runtime.KeepAlive(&buf)
		var ifconf error
		if e != 0 {
			ifconf = e
		}
		bind := unix.SetsockoptString(int(fd), unix.SOL_SOCKET, unix.SO_BINDTODEVICE, "lo")
		var unspec [16]byte
		var disconnect error
		if _, _, e := unix.Syscall(unix.SYS_CONNECT, fd, uintptr(unsafe.Pointer(&unspec[0])), 16); e != 0 {
			disconnect = e
		}
		out = fmt.Sprintf("ifconf=%s bindtodevice=%s disconnect=%s", name(ifconf), name(bind), name(disconnect))
	})
	_ = c.SetDeadline(time.Now())
	return out, err
}
