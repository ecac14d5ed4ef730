// Package provider defines how oac-shim boots a guest: a small Provider
// interface (availability check and create), an Instance (start, the guest's
// transport connection, exit, kill, destroy), optional capabilities found by
// type assertion, and sentinel errors callers test with errors.Is.
//
// It owns the contract between the sandbox lifecycle and each runtime
// (bubblewrap, OCI runtimes, qemu, Virtualization.framework, WSL). It must
// not speak the protocol or decide policy: an Instance only produces a byte
// stream to the guest and reports when the runtime is gone.
package provider
