// Package doors finds the doors a platform opens from the guest to the
// host by default, and says how the workload's launcher closes each one
// in the workload's own mount namespace (see docs/platform-doors.md).
//
// A WSL2 distribution, as WSL makes it, mounts the Windows drives under
// /mnt, registers the WSLInterop binfmt handler whose socket (/run/WSL,
// $WSL_INTEROP) runs Windows programs as the Windows user, shares /mnt/wsl
// with every other distribution, mounts WSLg's sockets (/mnt/wslg,
// /tmp/.X11-unix) and the host's GPU drivers (/usr/lib/wsl), and appends
// the Windows PATH. The image's /etc/wsl.conf turns most of that off, but
// a user or an older WSL can ignore the file, so the agent looks for
// itself before any workload process starts: Find reads the mount table,
// the binfmt_misc entries and the agent's environment; the Plan detaches
// each door's mount, covers the interop socket directory and masks the
// interop interpreter. Every isolated workload process also gets a /dev
// with only the contract's devices (package workload builds it).
//
// It owns the list of known doors and the decision how each is closed.
// It must not mount anything itself (package workload's launcher applies
// the Plan in a namespace of its own, never the agent's), nor touch the
// kernel's binfmt_misc registrations: they are global to WSL's utility VM,
// so disabling one would break every other distribution of the user.
package doors
