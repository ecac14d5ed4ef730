// Package direct is the guest's side of direct mode (docs/egress.md,
// "Direct mode"): the supervisor of the seccomp listeners the launcher
// passes the agent (package workload traps the workload's connect, bind
// and listen to them).
//
// For a connect of a workload TCP socket to an address outside its
// loopback, the supervisor reads the destination from the workload's
// memory once and asks through the guest's one way out
// (egress.Exit.Direct, which maps a made-up address back to its name and
// checks the target) for the host's own socket connected there (the fd
// channel's direct Connect). The host's broker decides as
// for every other carrier; an allowed connection's socket, locked to its
// upstream, is put in place of the workload's descriptor
// (SECCOMP_IOCTL_NOTIF_ADDFD with SETFD) and the call returns 0: the
// bytes then go from the workload to the upstream in the kernel. A
// refusal is the call's error (ECONNREFUSED for the policy), and the
// host's event says why. The call never goes on with an address the
// supervisor checked: what it connects is what the host decided, so a
// second thread rewriting the address meanwhile changes nothing.
//
// It lets a call continue (SECCOMP_USER_NOTIF_FLAG_CONTINUE) only on the
// workload's own sockets and only where the result is what the workload
// could do without direct mode: a connect to its loopback, of a UDP or
// unix socket, or any connect the host could not take (it then meets the
// capture, the handed path), and every bind and listen. A connect, bind
// or listen on a socket the host gave is refused (EPERM): it stays
// connected to its upstream.
//
// It bounds what a hostile workload can make it do: notifications are
// taken at most MaxRate a second and at most MaxInFlight at once (the
// workload's calls wait), an address is at most 128 bytes, and every
// answer from the host comes within the fd channel's reply timeout.
//
// It must not decide anything about targets (the host does), resolve
// names, or hold a host socket longer than it takes to put it in place.
package direct
