// Package provider defines how oac-shim boots a guest, the way Lima's
// drivers are built: a small Provider interface (its Capabilities,
// availability check and create), an Instance (start, the guest's
// transport connection, exit, kill, destroy), and sentinel errors callers
// test with errors.Is. What a provider can do is data, one Capabilities
// value (the features it honours, whether it keeps sandboxes, the
// warnings its settings call for), as Lima's DriverFeatures; optional
// interfaces are for behaviour only (Keeper's Discard, Detailer,
// Resetter, ImageNamer, Confiner; DataPlane on instances).
//
// Each provider package (bwrap, docker, oci, qemu, vz, wsl) registers a
// Driver from init: its name, its settings struct whose tagged fields are
// its flags, and its constructor; oac-shim declares every driver's flags
// (Declare) and builds the one asked for, knowing none of their settings.
// Every Instance embeds Process, the shared lifecycle: it watches the
// runtime, hands out the guest's connection (Listen, Accept), kills the
// runtime the provider's way (KillBy) and releases what Create claimed
// (Own, OnDestroy, Destroy). The pieces several providers need live in
// package kit; no provider imports another.
//
// It owns the contract between the sandbox lifecycle and each runtime. It
// must not speak the protocol or decide policy: an Instance only produces
// a byte stream to the guest and reports when the runtime is gone. A
// Create gets a Spec that passed Validate (the sandbox checks it once).
package provider
