//go:build !linux

package dataplane

import (
	"errors"
	"net"
)

// Channel is the fd channel, which only a Linux host offers.
type Channel struct{}

var errNoChannel = errors.New("fd channel: only a Linux host passes descriptors")

func serveChannel(c *net.UnixConn, _ Config) error {
	c.Close()
	return errNoChannel
}

// Forward is never called off Linux (there is no channel).
func (*Channel) Forward(int, string) (net.Conn, error) { return nil, errNoChannel }

// Done is closed at once.
func (*Channel) Done() <-chan struct{} { c := make(chan struct{}); close(c); return c }

// Close does nothing.
func (*Channel) Close() error { return nil }

// CanMakePairs is false off Linux.
func CanMakePairs() bool { return false }

// peersGone is not known off Linux: a failed connection is reported as
// failed.
func peersGone(net.Conn, net.Conn) bool { return false }

// CanTakeHanded is false off Linux.
func CanTakeHanded() bool { return false }
