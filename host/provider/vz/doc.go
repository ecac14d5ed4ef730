// Package vz is the macOS provider: each sandbox is a Virtualization.framework
// virtual machine (through github.com/Code-Hex/vz/v3) booted with the Linux
// boot loader from a kernel and an initramfs whose /init is oac-guest, with
// a virtio console into the sandbox's diagnostics (bounded), an entropy
// device, a memory balloon, the image's root disk (virtio-blk; the guest
// mounts it read-only as its root, oac.root=vda), virtio-fs shares of the
// workspace (tag "workspace", on /environment/workspace) and of the
// volumes (tags "home", "environment"), no network device, and a virtio
// socket device: the host listens on port 1024 and the guest dials it
// (oac.transport=vsock:1024 on the kernel command line). Binaries the host
// installs for one start (--sandbox-io, --install) are appended to a copy
// of the initramfs. The kernel must be the host's architecture (arm64 on
// Apple silicon: make image ARCH=arm64).
//
// All decisions are portable and unit-tested on every OS: Assemble turns the
// settings into a VMConfig (paths, sizes, kernel command line), ended maps
// machine states to the instance's end, mapError maps the framework's errors
// to provider errors. The framework itself is behind the Hypervisor and
// Machine interfaces; the only implementation, hypervisor_darwin.go, needs
// cgo and the macOS SDK and is compiled and tested only on macOS (the
// GitHub Actions workflow .github/workflows/macos.yml); elsewhere, and in
// builds without cgo, the provider reports itself unavailable. The OS
// policy (macOS 12 or newer) is oac-shim's, applied before any provider.
//
// It owns the VM's configuration and lifecycle. It must not speak the
// protocol (package sandbox does) nor build images.
package vz
