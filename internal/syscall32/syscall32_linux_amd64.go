package syscall32

import (
	"runtime/debug"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Available reports whether Call works here: the architecture has the
// instruction and the kernel takes it. A kernel can be built with IA32
// emulation and still refuse int 0x80 (ia32_emulation=0, or a hypervisor
// that does not deliver the gate): the instruction then faults (SIGSEGV),
// which is recovered once, on the first call.
func Available() bool {
	works.Do(func() { works.ok = probe() })
	return works.ok
}

var works struct {
	sync.Once
	ok bool
}

// probe makes one harmless i386 call (getpid, 20) with faults turned into
// panics for this goroutine.
func probe() (ok bool) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	return int32(int80(20, 0, 0, 0, 0, 0)) > 0
}

// Call makes i386 system call trap with up to three arguments (which must
// fit in 32 bits) and returns the raw result: a negative errno on failure.
func Call(trap, a1, a2, a3 uintptr) int32 { return int32(int80(trap, a1, a2, a3, 0, 0)) }

// Call5 is Call with up to five arguments.
func Call5(trap, a1, a2, a3, a4, a5 uintptr) int32 { return int32(int80(trap, a1, a2, a3, a4, a5)) }

// Low copies b below 4 GiB, where an i386 call's pointers reach it, and
// returns its address there; free unmaps it.
func Low(b []byte) (addr uintptr, free func(), err error) {
	m, err := unix.Mmap(-1, 0, max(len(b), 1), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON|unix.MAP_32BIT)
	if err != nil {
		return 0, nil, err
	}
	copy(m, b)
	return uintptr(unsafe.Pointer(&m[0])), func() { _ = unix.Munmap(m) }, nil
}

func int80(trap, a1, a2, a3, a4, a5 uintptr) uintptr
