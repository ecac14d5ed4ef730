// Package dockerd gives the end-to-end tests and the benchmarks a real
// Docker engine: the one already reachable (DOCKER_HOST, else the default
// socket), or a private dockerd it starts and stops again.
//
// A private engine runs with vfs storage (no overlay or thin-pool setup
// needed), its own data root, exec root, pid file, socket, configuration
// and containerd namespaces in one temporary directory, its own cgroup
// parent, no bridge and no iptables rules (sandboxes run with --network
// none). Stop ends it by its pid, unmounts and removes the directory and
// the cgroup parent, and removes any interface or iptables chain that
// appeared while it ran and carries docker's names, so the host is left
// as it was found. Import loads an image built by oac-image (its rootfs
// tarball) with docker import.
//
// It owns the engine's life only. It must not touch an engine it did not
// start beyond running client commands, nor anything of the host that
// existed before Start.
package dockerd
