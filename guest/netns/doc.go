// Package netns gives the workload (oac-sandbox-io and the daemon) a
// network namespace of its own with only lo, for a guest whose own
// namespace has another interface: a WSL2 distribution shares the utility
// VM's network, a container may sit on a bridge. The workload must see
// only lo on every provider, so that the host's broker is its only way
// out; where the guest's namespace already has only lo (bwrap, OCI,
// docker with --network none, a VM without a NIC) nothing is made.
//
// The agent stays in its own namespace (it speaks to the host over a
// transport that may need it) and works in the workload's through an NS:
// Do runs code on an OS thread that has entered it, so sockets (the egress
// proxies, the resolver, the capture listener, the health check's and
// forwards' dials) and netlink and nftables requests made there belong to
// it, and File is what package reaper enters before it starts a process.
// A thread that cannot return to the agent's namespace is never reused:
// its goroutine ends locked and the runtime destroys it.
//
// Making a namespace needs CAP_SYS_ADMIN (a WSL distribution's root, a VM's
// PID 1); without it the agent refuses to start the workload rather than
// let it see the other interfaces.
//
// It owns the namespace and the thread switching. It must not configure
// anything in it but lo (package transparent installs the capture).
package netns
