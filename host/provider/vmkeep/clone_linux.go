package vmkeep

import (
	"os"

	"golang.org/x/sys/unix"
)

// cloneFile makes dst a copy of src sharing its blocks (FICLONE: btrfs,
// xfs) or, where the filesystem cannot, a copy.
func cloneFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) == nil {
		return out.Close()
	}
	out.Close()
	if err := os.Remove(dst); err != nil {
		return err
	}
	return copyFile(src, dst)
}
