package vmkeep

import "golang.org/x/sys/unix"

// cloneFile makes dst an APFS clone of src (copy-on-write) or, where the
// filesystem cannot, a copy.
func cloneFile(src, dst string) error {
	if unix.Clonefile(src, dst, unix.CLONE_NOFOLLOW) == nil {
		return nil
	}
	return copyFile(src, dst)
}
