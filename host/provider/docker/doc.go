// Package docker is the provider for hosts with a Docker engine: each
// sandbox is a container started by the docker client, attached, with
// `docker run --rm --network none --read-only --cap-drop ALL --cap-add KILL
// --cap-add SETGID --cap-add SETUID --security-opt no-new-privileges
// --pids-limit 128`, tmpfs on /run and a 128 MiB tmpfs on /tmp (the engine's
// default seccomp profile stays on), the sandbox's socket directory bound at
// /run/oac, the host's oac-guest bound read-only as the entrypoint, a name
// per sandbox (oac-NAME) and --pull never: the image must be present.
//
// Guest ids are not remapped per container: unless the engine runs with
// userns-remap, guest root is host root with only the three capabilities
// above (Detail says which). The OCI provider maps a private id range per
// sandbox instead.
//
// It owns the docker command lines and the mapping of the client's error
// messages to provider errors. It must not talk to the engine's API
// directly, speak the protocol (package sandbox does) or build images.
// It is built for Linux only: the transport is a unix socket bound into the
// container, which needs the engine on the host's own kernel.
package docker
