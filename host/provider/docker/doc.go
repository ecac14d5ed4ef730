// Package docker is the provider for hosts with a Docker engine: each
// sandbox is a container started by the docker client, attached, with
// `docker run --rm --network none --read-only --cap-drop ALL` plus the
// hosted contract's capabilities (kit.AgentCaps) and SETFCAP, --security-opt
// no-new-privileges, --pids-limit 128, tmpfs on /run, a 128 MiB tmpfs on
// /tmp and tmpfs /home and /environment (or --volume bind mounts), the
// engine's default seccomp profile plus what the workload launcher's
// nested user and mount namespace needs (kit.ContainerSeccompProfile, written into the
// sandbox's state directory), the sandbox's socket directory bound at
// /run/oac, the host's oac-guest bound read-only as the entrypoint,
// --sandbox-io and --install binaries bound read-only in /usr/local/bin, a
// resolv.conf naming the guest's resolver, a name per sandbox (oac-NAME)
// and --pull never: the image (docker import of the image build's rootfs
// tarball) must be present. Where the engine reports that it confines
// containers with AppArmor, whose default profile refuses the launcher's
// mounts, the container runs under the profile oac-guest (package
// host/apparmor; --security-opt apparmor=oac-guest, never unconfined),
// which oac-shim loads first when it is root (--docker-apparmor load) or
// finds loaded; otherwise Create refuses before it makes anything
// (apparmor.ErrProfileMissing). Check names what is missing: the client,
// the engine, the image, the profile.
//
// Guest ids are not remapped per container: unless the engine runs with
// userns-remap, guest root is host root with only the capabilities above
// (Detail says which). The OCI provider maps a private id range per
// sandbox instead.
//
// It owns the docker command lines and the mapping of the client's error
// messages to provider errors. It must not talk to the engine's API
// directly, speak the protocol (package sandbox does) or build images.
// It is built for Linux only: the transport is a unix socket bound into the
// container, which needs the engine on the host's own kernel.
package docker
