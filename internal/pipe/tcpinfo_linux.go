package pipe

import (
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// canSplice: Go splices between sockets on Linux only.
const canSplice = true

// tcpIdle returns how long ago c last sent or received data, from the
// kernel's TCP_INFO (millisecond resolution).
func tcpIdle(c *net.TCPConn) (time.Duration, bool) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, false
	}
	var info *unix.TCPInfo
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); err != nil || ierr != nil {
		return 0, false
	}
	return time.Duration(min(info.Last_data_recv, info.Last_data_sent)) * time.Millisecond, true
}
