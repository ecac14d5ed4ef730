//go:build unix

package main

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// errnoName is the errno's symbolic name (EACCES), what the tests match.
func errnoName(errno syscall.Errno) string { return unix.ErrnoName(errno) }
