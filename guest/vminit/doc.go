// Package vminit is what oac-guest does as PID 1 of a virtual machine
// booted from an oac initramfs: it reads its settings from the kernel
// command line (oac.transport=serial:NAME or vsock:[CID:]PORT,
// oac.host_grace=DUR, oac.debug=1, oac.root=DEV, oac.shares=TAG:PATH,...),
// loads the kernel modules the image lists (finit_module, in dependency
// order), and then:
//
//   - with oac.root, switches into the image's root disk (ext4 or erofs,
//     mounted read-only): /dev, /proc, /sys, /run and /tmp move over from
//     the initramfs; /home and /environment get a writable layer (an
//     overlay whose upper layer is on tmpfs) unless a share is mounted
//     there; the initramfs's /usr/local/bin (binaries the host installed
//     for this start) is laid read-only over the image's; the initramfs's
//     files are freed; the new root becomes / by moving it there and
//     chrooting. oac-guest stays PID 1 and execs nothing, as the init of
//     a container VM does; without oac.root the guest runs from its
//     initramfs as before;
//   - mounts the virtio-fs shares where the host says (the workspace at
//     /environment/workspace), writable by uid 1000;
//   - mounts cgroup2, finds the transport (a virtio-serial port by name
//     under /sys/class/virtio-ports, or vsock to the host), and supervises
//     agent sessions: each Welcome sets the clock from the host's, a
//     Shutdown powers the VM off, and a host that is gone longer than the
//     grace (at boot or after a lost connection) powers it off too, so no
//     VM outlives its host.
//
// It owns the VM boot sequence and the decision to power off. It must never
// return to its caller or exit (PID 1 exiting panics the kernel): fatal
// errors are logged on the console and power the VM off. It must not speak
// the protocol itself (package agent does) nor mount the basic pseudo
// filesystems (package initsys does, before Boot).
package vminit
