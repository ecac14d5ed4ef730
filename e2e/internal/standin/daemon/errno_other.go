//go:build !unix

package main

import "syscall"

// errnoName: the stand-in runs in Linux guests only; elsewhere it is only
// compiled (make cross), and the errno's text is enough.
func errnoName(errno syscall.Errno) string { return errno.Error() }
