package syscall32

// Available reports whether Call works on this architecture.
func Available() bool { return true }

// Call makes i386 system call trap with up to three arguments (which must
// fit in 32 bits) and returns the raw result: a negative errno on failure.
func Call(trap, a1, a2, a3 uintptr) int32 { return int32(int80(trap, a1, a2, a3)) }

func int80(trap, a1, a2, a3 uintptr) uintptr
