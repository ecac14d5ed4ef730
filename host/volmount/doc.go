// Package volmount puts a claim's volumes into a running guest that shares
// the host's kernel (docs/warm.md): a host directory, cloned as a detached
// mount in the shim's namespace, is moved onto a guest directory inside
// the mount namespace of the guest's agent, on a thread that entered that
// namespace and is then discarded.
//
// It owns entering the agent's namespace and the mounts it makes there.
// It must not make a mount in the host's namespace (the clone is detached
// until it is moved into the guest's, so a crash at any point leaves
// nothing on the host: the guest's mounts go with the guest), follow a
// symlink or magic link on the guest's side, or decide which host
// directory is shared: the caller (a claim) names it, never the guest.
package volmount
