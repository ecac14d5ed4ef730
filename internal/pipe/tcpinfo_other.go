//go:build !linux

package pipe

import (
	"net"
	"time"
)

// canSplice: Go splices between sockets on Linux only.
const canSplice = false

// tcpIdle is unknown off Linux: Activity then counts from the copy's
// start and end only.
func tcpIdle(*net.TCPConn) (time.Duration, bool) { return 0, false }
