// Package directguard is the host's side of direct mode's kernel
// guarantees: a socket of the host's own network namespace, handed to the
// guest connected to an upstream the egress broker allowed, stays on that
// upstream whoever holds it (the workload, or root in the guest, which has
// every capability in its own namespaces and none in the host's).
//
// It owns three things:
//
//   - The cgroup guard. Open loads BPF programs (assembled here: no
//     compiler) and attaches them, as bpf_links, to this process's own
//     cgroup v2, so they run for every socket this process makes, whoever
//     later holds it (a socket keeps the cgroup it was made in). Seal marks
//     one socket in a socket-storage map. On a marked socket the kernel
//     then refuses connect (any address, after an AF_UNSPEC disconnect
//     too, and a MSG_FASTOPEN send), bind, and the setsockopt options of
//     internal/netreach.Sockopts (and IP_LOCAL_PORT_RANGE, so the port
//     share holds). An egress program drops every packet of a marked
//     socket bound to a device or addressed to anything but the peer it
//     was sealed with: that is what holds against a 32-bit (compat)
//     setsockopt, which the kernel never shows to cgroup setsockopt
//     programs. A socket accepted from a marked one is marked too (the map
//     clones into it).
//   - The port share. Each Guard holds one slot of the kernel's ephemeral
//     port range (a flock on a lock file, which the kernel drops if the
//     process dies); Lock confines a socket's automatic port to it
//     (IP_LOCAL_PORT_RANGE), so the direct sockets of all sandboxes
//     together never take more than half of the host's ephemeral ports.
//     Lock also attaches the locked peer filter: a classic BPF socket
//     filter admitting only the upstream's segments.
//   - Abort: every sealed socket still alive (open, orphaned while closing,
//     in TIME_WAIT, or accepted from a sealed one) is destroyed through
//     sock_diag; the peer of an open one gets a reset.
//
// Costs and limits. When the process is in the root cgroup (0::/), the
// programs run for every connect, bind and setsockopt and every outgoing
// IP packet of the host, each costing one socket-storage lookup for an
// unmarked socket. The links go with the process: a killed shim leaves
// nothing attached, and its sealed sockets unguarded (their peer filters
// still drop every reply but the upstream's), so the guest must not
// outlive it. No cgroup hook sees a socket's ioctls: the netreach.Ioctls
// that need no capability (listing the host's interfaces, SIOCGIFCONF)
// stay open to whoever holds a sealed socket. The egress check pins a
// packet's destination address, not its route.
//
// It must not decide targets or policy (the egress broker does), dial
// anything, or hold a handed socket's descriptor after Seal returns: it
// keeps only socket cookies, pruned to the sockets still alive.
package directguard
