//go:build unix

package statedir

import (
	"os"

	"golang.org/x/sys/unix"
)

const openFlags = unix.O_NOFOLLOW | unix.O_CLOEXEC

// tryLock takes an exclusive flock on f without waiting.
func tryLock(f *os.File) error { return unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) }

// tryLockShared takes a shared flock on f without waiting: any number of
// shared holders at once, none while an exclusive one holds it.
func tryLockShared(f *os.File) error { return unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB) }

// removeLocked removes the lock file while still holding it, then drops
// the lock: nobody can claim the name between the two.
func removeLocked(f *os.File, path string) {
	os.Remove(path)
	f.Close()
}
