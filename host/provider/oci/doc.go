// Package oci is the OCI container provider: each sandbox is a container
// run by runc or crun from a runtime bundle the provider writes (config.json
// built with the runtime-spec types) in the sandbox's state directory.
//
// The container has a read-only root (a --rootfs directory, or a skeleton
// into which the host's /usr, /bin, /lib* and a few /etc files are bound
// read-only, like the bwrap provider's default), tmpfs on /run and a
// 128 MiB tmpfs on /tmp, new user, pid, network (lo only), ipc, uts, mount
// and cgroup namespaces, guest ids 0..65535 mapped to a host id range of its
// own (package kit's host-wide id slots, which the bwrap provider draws
// from too), a pids limit of 128, a seccomp deny list, and only the capabilities the agent needs:
// CAP_SETUID and CAP_SETGID (to start the daemon as 1000:1000 without
// supplementary groups), CAP_KILL (to signal it on stop), CAP_SETFCAP (to
// map ids into the daemon's nested user namespace), CAP_NET_ADMIN and
// CAP_NET_BIND_SERVICE (transparent egress in its own network namespace:
// the resolver on port 53 and the capture). Its process is
// oac-guest, bound read-only at /run/oac/oac-guest, dialing the transport
// socket the shim listens on, bound in at /run/oac/agent.sock.
//
// crun 1.8 refuses a hybrid cgroup v1/v2 layout; on such a host the
// provider runs crun in a private mount namespace in which the cgroup2
// mount is unmounted, so crun sees a v1 host.
//
// It owns the bundle, the runtime's command lines and the container's
// removal from the runtime's state. It must not speak the protocol (package
// sandbox does) nor build images.
package oci
