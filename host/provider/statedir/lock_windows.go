//go:build windows

package statedir

import (
	"os"

	"golang.org/x/sys/windows"
)

const openFlags = 0

// tryLock takes an exclusive LockFileEx lock on f's first byte without
// waiting; the lock is dropped when f is closed (or the process dies).
func tryLock(f *os.File) error {
	var ol windows.Overlapped
	return windows.LockFileEx(windows.Handle(f.Fd()), windows.LOCKFILE_EXCLUSIVE_LOCK|windows.LOCKFILE_FAIL_IMMEDIATELY, 0, 1, 0, &ol)
}

// tryLockShared takes a shared LockFileEx lock on f's first byte without
// waiting: any number of shared holders at once, none while an exclusive
// one holds it (a handle that holds it shared cannot also take it
// exclusively: close it and open the file again).
func tryLockShared(f *os.File) error {
	var ol windows.Overlapped
	return windows.LockFileEx(windows.Handle(f.Fd()), windows.LOCKFILE_FAIL_IMMEDIATELY, 0, 1, 0, &ol)
}

// removeLocked drops the lock, then removes the file: Windows does not
// delete a file another handle has open.
func removeLocked(f *os.File, path string) {
	f.Close()
	os.Remove(path)
}
