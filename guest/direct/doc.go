// Package direct is the guest's side of direct mode (docs/egress.md,
// "Direct mode"): the supervisor of the seccomp listeners the launcher
// passes the agent (package workload traps the workload's connect, bind
// and listen to them, after putting it under a Landlock domain in which
// the kernel refuses every TCP bind and connect of its own).
//
// For each trapped call the supervisor takes a duplicate of the caller's
// descriptor (pidfd_getfd) and works on that object only, never on the
// number again: a second thread may put anything at the number
// meanwhile. A socket of another network namespace than the workload's
// (SO_NETNS_COOKIE: a kernel fact, nothing remembered) is the host's, and
// every call on it is refused (EPERM). On the workload's own sockets:
//
//   - a connect of a TCP socket to an address outside its loopback asks
//     through the guest's one way out (egress.Exit.Direct) for the host's
//     own socket connected there; an allowed connection's socket is put
//     in place of the workload's descriptor (SECCOMP_IOCTL_NOTIF_ADDFD
//     with SETFD) and the call returns 0; a refusal is the call's error
//     (ECONNREFUSED for the policy). The address is read once, and what
//     the host connects is what it decided;
//   - every other connect and bind of a TCP socket (its loopback, a
//     disconnect, its own servers, a target the host could not be asked
//     about), and every listen, is made by the supervisor on the
//     duplicate with the address bytes it read, and answered with the
//     kernel's result (a bind below ip_unprivileged_port_start is
//     EACCES, as for any process without a capability);
//   - a connect or bind of any other socket (UDP, unix) goes on
//     (SECCOMP_USER_NOTIF_FLAG_CONTINUE): the kernel looks the number
//     and the address up again, and whatever is there by then, a TCP
//     bind or connect of the workload's own meets Landlock. Its peer
//     credentials stay the workload's, which a unix connect made here
//     would not.
//
// Notifications are received by a blocking receive on a locked OS thread
// (SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP where the kernel has it), which
// answers at once what needs no wait and hands each TCP connect to one of
// Workers goroutines started ahead: a slow dial holds one worker, never
// another call; beyond them the workload's calls wait. An address is at
// most 128 bytes, and every answer from the host comes within the fd
// channel's reply timeout.
//
// It must not decide anything about targets (the host does), resolve
// names, or hold a host socket longer than it takes to put it in place.
package direct
