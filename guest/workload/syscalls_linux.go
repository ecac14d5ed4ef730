package workload

import "golang.org/x/sys/unix"

// abi is one system call convention a guest process can use: the kernel
// tells them apart by seccomp_data.arch, and each numbers its calls its own
// way. Numbers are the kernel's (checked against golang.org/x/sys by
// TestSyscallTablesMatchTheKernelHeaders).
type abi struct {
	name  string
	audit uint32
	// x32 marks x86_64, where a call whose number has x32Bit set is an x32
	// call with the same arch value.
	x32 bool
	nr  map[string]uint32
	// absent are calls of the policy this convention does not have.
	absent []string
}

// x32Bit marks an x32 system call on x86_64 (__X32_SYSCALL_BIT).
const x32Bit = 0x40000000

var (
	abiX86_64 = abi{name: "x86_64", audit: unix.AUDIT_ARCH_X86_64, x32: true, absent: []string{"socketcall"}, nr: map[string]uint32{
		"add_key": 248, "bpf": 321, "clone": 56, "clone3": 435, "fanotify_init": 300,
		"io_uring_enter": 426, "io_uring_register": 427, "io_uring_setup": 425, "kcmp": 312,
		"kexec_file_load": 320, "kexec_load": 246, "keyctl": 250, "open_by_handle_at": 304,
		"perf_event_open": 298, "pidfd_getfd": 438, "process_madvise": 440, "process_vm_readv": 310,
		"process_vm_writev": 311, "ptrace": 101, "request_key": 249, "setns": 308, "unshare": 272,
		"userfaultfd": 323, "socket": 41,
		"connect": 42, "bind": 49, "listen": 50, "sendto": 44, "sendmsg": 46, "sendmmsg": 307,
		"ioctl": 16, "setsockopt": 54,
	}}
	// abiI386 is the 32-bit x86 convention (int 0x80 and friends) an x86_64
	// kernel with IA32 emulation also accepts.
	abiI386 = abi{name: "i386", audit: unix.AUDIT_ARCH_I386, absent: []string{"kexec_file_load"}, nr: map[string]uint32{
		"add_key": 286, "bpf": 357, "clone": 120, "clone3": 435, "fanotify_init": 338,
		"io_uring_enter": 426, "io_uring_register": 427, "io_uring_setup": 425, "kcmp": 349,
		"kexec_load": 283, "keyctl": 288, "open_by_handle_at": 342,
		"perf_event_open": 336, "pidfd_getfd": 438, "process_madvise": 440, "process_vm_readv": 347,
		"process_vm_writev": 348, "ptrace": 26, "request_key": 287, "setns": 346, "unshare": 310,
		"userfaultfd": 374, "socket": 359, "socketcall": 102,
		"connect": 362, "bind": 361, "listen": 363, "sendto": 369, "sendmsg": 370, "sendmmsg": 345,
		"ioctl": 54, "setsockopt": 366,
	}}
	abiAArch64 = abi{name: "aarch64", audit: unix.AUDIT_ARCH_AARCH64, absent: []string{"socketcall"}, nr: map[string]uint32{
		"add_key": 217, "bpf": 280, "clone": 220, "clone3": 435, "fanotify_init": 262,
		"io_uring_enter": 426, "io_uring_register": 427, "io_uring_setup": 425, "kcmp": 272,
		"kexec_file_load": 294, "kexec_load": 104, "keyctl": 219, "open_by_handle_at": 265,
		"perf_event_open": 241, "pidfd_getfd": 438, "process_madvise": 440, "process_vm_readv": 270,
		"process_vm_writev": 271, "ptrace": 117, "request_key": 218, "setns": 268, "unshare": 97,
		"userfaultfd": 282, "socket": 198,
		"connect": 203, "bind": 200, "listen": 201, "sendto": 206, "sendmsg": 211, "sendmmsg": 269,
		"ioctl": 29, "setsockopt": 208,
	}}
	// abiARM is the 32-bit ARM EABI convention an arm64 kernel with compat
	// support also accepts.
	abiARM = abi{name: "arm", audit: unix.AUDIT_ARCH_ARM, absent: []string{"socketcall"}, nr: map[string]uint32{
		"add_key": 309, "bpf": 386, "clone": 120, "clone3": 435, "fanotify_init": 367,
		"io_uring_enter": 426, "io_uring_register": 427, "io_uring_setup": 425, "kcmp": 378,
		"kexec_file_load": 401, "kexec_load": 347, "keyctl": 311, "open_by_handle_at": 371,
		"perf_event_open": 364, "pidfd_getfd": 438, "process_madvise": 440, "process_vm_readv": 376,
		"process_vm_writev": 377, "ptrace": 26, "request_key": 310, "setns": 375, "unshare": 337,
		"userfaultfd": 388, "socket": 281,
		"connect": 283, "bind": 282, "listen": 284, "sendto": 290, "sendmsg": 296, "sendmmsg": 374,
		"ioctl": 54, "setsockopt": 294,
	}}
)

// abis returns the conventions a process on goarch can use: the native one
// first, then the 32-bit one its kernel may also accept. Any other arch
// value kills the process.
func abis(goarch string) []abi {
	switch goarch {
	case "amd64":
		return []abi{abiX86_64, abiI386}
	case "arm64":
		return []abi{abiAArch64, abiARM}
	}
	return nil
}
