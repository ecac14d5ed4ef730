//go:build unix

package client

import (
	"errors"
	"syscall"
)

// gone reports whether no process has the id pid (it exited and was
// reaped).
func gone(pid int) bool { return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) }
