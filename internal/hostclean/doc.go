// Package hostclean lists and removes what a daemon the tests start on
// the host (a private dockerd, a Kubernetes cluster) may leave there:
// network interfaces, iptables chains, mounts below its directory.
//
// It owns the listing and the lazy unmount. It must not decide what is a
// leftover: its callers compare against what they saw before they started.
package hostclean
