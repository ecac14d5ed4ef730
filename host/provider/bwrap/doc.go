// Package bwrap is the bubblewrap provider: each sandbox is a bwrap process
// with its own user, pid, net, ipc, uts, mount and cgroup namespaces, no
// network but lo, and oac-guest as PID 1.
//
// When oac-shim runs as root, bwrap is started inside a user namespace that
// maps guest uids/gids 0..65535 to a host range of its own (one slot per
// running sandbox, claimed with a lock file), so guest root and the guest's
// uid 1000 are two distinct, unprivileged host ids. The transport is an
// AF_UNIX socket created by the shim and bound into the sandbox at
// /run/oac/agent.sock; the agent binary, the socket and a rootfs directory
// are passed to bwrap as O_PATH descriptors, so no host path is traversed
// with the guest's ids.
//
// Without root it runs rootless: bwrap creates the user namespace and
// blocks while newuidmap/newgidmap map guest root to the user and guest ids
// 1.. to the user's subordinate ids (/etc/subuid, /etc/subgid). Without
// subordinate ids it refuses, unless the user asks for the single-uid
// fallback. Diagnose turns the host's facts into that decision and into
// what `oac-shim check` explains.
//
// The guest's /home and /environment are fresh tmpfs mounts (0755, guest
// root), or host directories given as volumes; the agent creates
// /home/runtime and /environment/workspace in them. Binaries to install
// (oac-sandbox-io for the default root, stand-ins in tests) are bound
// read-only under /usr/local/bin from O_PATH descriptors; in the default root
// /usr/local is then a tmpfs of its own, remounted read-only.
//
// Where the kernel enforces AppArmor, a profile attached to the bwrap
// binary may run bwrap's children without capabilities (Ubuntu's
// bwrap-userns-restrict: its unpriv_bwrap denies them all), and the agent
// needs them in its own namespaces. Before anything is created, oac-shim
// runs bwrap once with itself as the child (probe_linux.go); when the
// kernel refuses that child a mount the provider is unavailable, and
// check names the fix: a bwrap of the app's own at OwnBwrap under the
// profile examples/apparmor/oac-bwrap (docs/ubuntu.md).
//
// It owns the bwrap command line, the per-sandbox state directory and the id
// range. It must not speak the protocol (the sandbox package does) nor create
// anything inside the guest's runtime directories (the agent does).
package bwrap
