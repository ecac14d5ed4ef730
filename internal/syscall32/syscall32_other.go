//go:build !amd64

package syscall32

// Available reports whether Call works on this architecture.
func Available() bool { return false }

// Call is not available on this architecture: it returns -ENOSYS.
func Call(trap, a1, a2, a3 uintptr) int32 { return -38 }
