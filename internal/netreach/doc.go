// Package netreach lists what reaches past one TCP socket into the
// network namespace it belongs to: the socket options that bind it to an
// interface or route its segments somewhere other than its peer, and the
// socket ioctls that list or change the namespace's interfaces, addresses,
// routes and neighbours.
//
// Direct mode puts a socket of the host's own namespace in the guest's
// hands, so these must be refused there: the workload's seccomp filter
// refuses them on every socket (package guest/workload), and the host's
// guard refuses the options on its direct sockets whoever holds them
// (package host/directguard). One table serves both.
//
// It only lists; it must not decide who is refused, or when.
package netreach
