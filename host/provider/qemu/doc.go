// Package qemu is the qemu provider: each sandbox is a qemu-system-x86_64
// virtual machine (q35) booted from a kernel and an initramfs whose /init is
// oac-guest (package initramfs builds it). KVM is used when it can run a
// stock kernel (/dev/kvm and a CPU with vmx or svm), software emulation
// (TCG) otherwise. The VM has no network interface but lo.
//
// The transport is a virtio-serial port named "oac.agent" whose qemu
// chardev dials a unix socket the shim already listens on (server=off, so
// there is no connect race), or, when asked and /dev/vhost-vsock exists,
// vsock: the guest gets its own CID and dials the host on a port reserved
// for it; connections from other CIDs are refused. The serial console is
// forwarded, bounded, to the sandbox's diagnostics. qemu runs with
// -no-reboot and the parent-death signal SIGKILL, so it ends when the guest
// powers off, panics, or the shim dies.
//
// It owns the qemu command line, the kernel command line (oac.* settings
// the guest reads) and the per-sandbox state directory. It must not speak
// the protocol (package sandbox does) nor build images.
package qemu
