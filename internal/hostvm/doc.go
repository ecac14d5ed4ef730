// Package hostvm runs a shell script as root in a qemu VM whose userspace
// is this machine's own and whose kernel is another: the tests' way to
// prove behaviour on a kernel the build machine does not run (Debian's
// cloud kernel enforces AppArmor; the build machine's kernel has none).
//
// The VM boots the given kernel with an initramfs built by package
// initramfs: a static busybox and a shell script as /init, and the
// virtio-fs modules. That script mounts the host's root, shared over
// virtio-fs by virtiofsd and mounted read-only, under an overlay whose
// upper layer is memory, with fresh tmpfs on /tmp and /run, mounts
// Config.Work (a host directory shared read-write) at its host path, and
// switch_roots into it. There the host's own /bin/sh mounts /proc, /sys,
// /dev, cgroup2 and securityfs, binds the kernel's modules at
// /lib/modules/VERSION (modprobe works), and runs the script. The
// script's output comes back on a second serial port, its exit status on
// the console, and the VM powers off. The host's root as it is
// (read-only, /tmp and /run included) is at HostRoot in the VM.
//
// It owns the VM's life only: Run starts qemu and two virtiofsd, bounds
// the run by a timeout and the memory by Config.MemoryMiB, kills every
// process it started by its pid and waits for it before it returns, and
// removes its own temporary directory. It must not write to the host
// outside Config.Work and that directory (the host's root is mounted
// read-only in the VM), start anything that outlives Run, or download
// anything. It boots amd64 guests under software emulation (TCG) only.
package hostvm
