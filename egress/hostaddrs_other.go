//go:build !linux

package egress

import "errors"

// watchHostAddrs has no netlink here: SystemHostAddrs re-reads the
// interfaces instead.
func watchHostAddrs() (HostAddrs, error) {
	return nil, errors.New("no address notifications on this system")
}
