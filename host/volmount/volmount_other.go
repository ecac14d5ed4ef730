//go:build !linux

package volmount

import (
	"errors"
	"net"
)

// Volume is a host directory to mount at a guest directory.
type Volume struct {
	Guest string
	Host  string
}

var errUnsupported = errors.New("volumes at claim need a guest that shares a Linux host's kernel")

// Supported reports false: only Linux shims attach volumes.
func Supported() bool { return false }

// Attached is what Attach mounted.
type Attached struct{}

// Attach is unsupported here.
func Attach(net.Conn, []Volume) (*Attached, error) { return nil, errUnsupported }

// Detach does nothing here.
func (a *Attached) Detach() error { return nil }

// Release does nothing here.
func (a *Attached) Release() {}
