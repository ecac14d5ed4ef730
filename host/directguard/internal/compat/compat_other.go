//go:build !(linux && amd64)

package compat

import "syscall"

// Available tells whether this architecture has the calls at all.
const Available = false

// Getpid is not made here.
func Getpid() int { return -1 }

// Setsockopt is not made here.
func Setsockopt(fd, level, name int, val []byte) error { return syscall.ENOSYS }

// Connect is not made here.
func Connect(fd int, sa []byte) error { return syscall.ENOSYS }
