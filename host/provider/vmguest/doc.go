// Package vmguest is what the VM providers (qemu, vz) share about the guest
// they boot: the kernel image's architecture, the shares of the workspace
// and of the volumes (virtio-fs tags and guest paths), the binaries the
// host installs for one start (an archive appended to the initramfs), and
// the oac.* kernel parameters that tell the guest about them (package
// protocol/vmparams has their formats).
//
// It owns these decisions only. It must not start processes or speak the
// protocol; every function is portable, so the vz provider's decisions are
// tested on every OS.
package vmguest
