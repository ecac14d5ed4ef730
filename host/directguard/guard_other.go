//go:build !linux

package directguard

import (
	"errors"
	"net/netip"
	"syscall"
)

var errNotLinux = errors.New("direct mode needs Linux: its guard is a set of Linux kernel programs")

// Guard is direct mode's host-side guard; it exists only on Linux.
type Guard struct{}

// Open fails: direct mode needs Linux.
func Open(Config) (*Guard, error) { return nil, errNotLinux }

// Lock fails: direct mode needs Linux.
func (*Guard) Lock(string, netip.AddrPort, syscall.RawConn) error { return errNotLinux }

// Seal fails: direct mode needs Linux.
func (*Guard) Seal(syscall.RawConn) error { return errNotLinux }

// Abort fails: direct mode needs Linux.
func (*Guard) Abort() (int, error) { return 0, errNotLinux }

// Share returns an empty range.
func (*Guard) Share() (lo, hi int) { return 0, 0 }

// Close does nothing.
func (*Guard) Close() error { return nil }
