package compat

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// Available tells whether this architecture has the calls at all; the
// kernel may still refuse them (IA32 emulation off).
const Available = true

// i386 system call numbers (arch/x86/entry/syscalls/syscall_32.tbl).
const (
	sysGetpid     = 20
	sysConnect    = 362
	sysSetsockopt = 366
)

func int80(trap, a1, a2, a3, a4, a5 uintptr) uintptr

// low copies b below 4 GiB, where a 32-bit call's pointers can reach it.
func low(b []byte) ([]byte, func(), error) {
	m, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON|unix.MAP_32BIT)
	if err != nil {
		return nil, nil, err
	}
	copy(m, b)
	return m, func() { _ = unix.Munmap(m) }, nil
}

func result(r uintptr) error {
	if e := int32(r); e < 0 && e > -4096 {
		return unix.Errno(-e)
	}
	return nil
}

// Getpid is the 32-bit getpid: it kills the process with SIGSEGV where the
// kernel runs no 32-bit calls.
func Getpid() int { return int(int32(int80(sysGetpid, 0, 0, 0, 0, 0))) }

// Setsockopt is the 32-bit setsockopt.
func Setsockopt(fd, level, name int, val []byte) error {
	m, free, err := low(val)
	if err != nil {
		return err
	}
	defer free()
	return result(int80(sysSetsockopt, uintptr(fd), uintptr(level), uintptr(name), uintptr(unsafe.Pointer(&m[0])), uintptr(len(val))))
}

// Connect is the 32-bit connect to the raw struct sockaddr sa.
func Connect(fd int, sa []byte) error {
	m, free, err := low(sa)
	if err != nil {
		return err
	}
	defer free()
	return result(int80(sysConnect, uintptr(fd), uintptr(unsafe.Pointer(&m[0])), uintptr(len(sa)), 0, 0))
}
