// Package apparmor is the AppArmor profile oac's guest agent runs under in
// a container on a host that enforces AppArmor (Ubuntu and Debian Docker
// hosts, Kubernetes nodes on Ubuntu), and this host's AppArmor as oac-shim
// sees it: whether the profile is loaded, whether oac-shim may load it,
// loading it.
//
// The engines confine every container with their default profile (the
// Docker engine's docker-default, containerd's cri-containerd.apparmor.d:
// one template), whose `deny mount,` refuses the mounts the workload
// launcher makes in the user and mount namespace it gives each workload
// process (package guest/workload), so the guest refuses to start the
// daemon. The profile oac-guest (Profile) is that template without the
// `deny mount,` and with one rule for each mount the launcher makes, each
// naming its filesystem type, options, source and target (MountRules):
// the mounts were recorded in a VM whose kernel enforces AppArmor
// (testdata), and a test holds the rules to that recording. Docker and
// Kubernetes use the same text (examples/apparmor/oac-guest). The profile
// oac-guest-helper adds the mounts oac-guest helper makes for itself, for
// the E2B template's container under Docker (Helper).
//
// It owns the profiles' text, their version and the sentinel
// ErrProfileMissing. It must not know a provider's settings, talk to a
// container engine, or turn confinement off: no caller may ever be handed
// `unconfined`.
package apparmor
