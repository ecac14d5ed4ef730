//go:build !(linux && amd64)

package syscall32

import "errors"

// Available reports whether Call works on this architecture.
func Available() bool { return false }

// Call is not available on this architecture: it returns -ENOSYS.
func Call(trap, a1, a2, a3 uintptr) int32 { return -38 }

// Call5 is not available on this architecture: it returns -ENOSYS.
func Call5(trap, a1, a2, a3, a4, a5 uintptr) int32 { return -38 }

// Low is not needed on this architecture.
func Low(b []byte) (uintptr, func(), error) {
	return 0, nil, errors.New("no i386 calls on this architecture")
}
