//go:build unix

package persist

import (
	"errors"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

const openFlags = unix.O_NOFOLLOW | unix.O_CLOEXEC

// tryLock takes an exclusive flock without waiting; it ends with the
// descriptor (or the process).
func tryLock(f *os.File) error { return unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) }

func unlock(f *os.File) { _ = unix.Flock(int(f.Fd()), unix.LOCK_UN) }

func wouldBlock(err error) bool { return errors.Is(err, unix.EWOULDBLOCK) }

// DiskUsage returns the bytes the files under dir take on disk
// (allocated blocks; hard links counted once). Errors inside (a file gone
// meanwhile, a directory it cannot read) leave those out.
func DiskUsage(dir string) int64 {
	var total int64
	seen := map[[2]uint64]bool{}
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		var st unix.Stat_t
		if unix.Lstat(p, &st) != nil {
			return nil
		}
		if st.Nlink > 1 && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			k := [2]uint64{uint64(st.Dev), st.Ino}
			if seen[k] {
				return nil
			}
			seen[k] = true
		}
		total += st.Blocks * 512
		return nil
	})
	return total
}
