//go:build !unix

package main

import (
	"errors"
	"syscall"
)

// errnoName: the stand-in runs in Linux guests only; elsewhere it is only
// compiled (make cross), and the errno's text is enough.
func errnoName(errno syscall.Errno) string { return errno.Error() }

func bindAny(int, string) (int, error) {
	return 0, errors.New("why probes run on Linux and other unix systems only")
}
