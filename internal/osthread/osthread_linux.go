package osthread

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// Throwaway runs f on a goroutine locked to a thread that ends when f
// returns, so whatever f did to the thread dies with it, and returns f's
// error.
//
// Go does not end the process's main thread: a goroutine that exits
// locked to it parks it forever instead, still changed, and /proc/self
// answers for the main thread (a main thread left in another mount
// namespace makes the process's own mount table read as that one). A
// goroutine that lands on the main thread hands f to a new goroutine,
// which cannot run there while this one holds it locked.
func Throwaway(f func() error) error {
	errc := make(chan error, 1)
	go func() { errc <- throwawayBody(f) }()
	return <-errc
}

// throwawayBody is Throwaway's goroutine; it returns with its thread
// unlocked only when that thread is the main one, which f never ran on.
func throwawayBody(f func() error) error {
	runtime.LockOSThread()
	if unix.Gettid() == unix.Getpid() {
		defer runtime.UnlockOSThread()
		return Throwaway(f)
	}
	return f() // never unlocked: the thread ends with this goroutine
}
