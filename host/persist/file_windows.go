package persist

import (
	"errors"
	"os"
	"path/filepath"

	"golang.org/x/sys/windows"
)

const openFlags = 0

// tryLock takes an exclusive LockFileEx lock on the first byte without
// waiting; it ends when the file is closed (or the process dies).
func tryLock(f *os.File) error {
	var ol windows.Overlapped
	return windows.LockFileEx(windows.Handle(f.Fd()), windows.LOCKFILE_EXCLUSIVE_LOCK|windows.LOCKFILE_FAIL_IMMEDIATELY, 0, 1, 0, &ol)
}

func unlock(f *os.File) {
	var ol windows.Overlapped
	_ = windows.UnlockFileEx(windows.Handle(f.Fd()), 0, 1, 0, &ol)
}

func wouldBlock(err error) bool { return errors.Is(err, windows.ERROR_LOCK_VIOLATION) }

// DiskUsage returns the bytes of the files under dir (their sizes).
func DiskUsage(dir string) int64 {
	var total int64
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if info, err := d.Info(); err == nil && info.Mode().IsRegular() {
			total += info.Size()
		}
		return nil
	})
	return total
}
