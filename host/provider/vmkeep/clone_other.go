//go:build !linux && !darwin

package vmkeep

// cloneFile copies src to dst.
func cloneFile(src, dst string) error { return copyFile(src, dst) }
