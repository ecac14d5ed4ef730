// Package syscall32 makes 32-bit x86 system calls (int 0x80) from a 64-bit
// process. The kernel sees such a call with the i386 arch value and i386
// numbers, so tests use it to prove that the workload's seccomp filter
// applies its deny list to that convention too, inside real guests, and
// that direct mode's guard holds against the compat setsockopt and
// connect, which no cgroup setsockopt program sees.
//
// It owns that one instruction. It must not be used by production code.
package syscall32
