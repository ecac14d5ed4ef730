package initsys

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// PlaceResolvConf makes path (normally /etc/resolv.conf) read content
// without writing the image: nothing to do when it already does; else a
// bind mount of a copy in spare (a tmpfs directory such as /run/oac) over
// an existing file; else the file is created where the root is writable
// (a VM's initramfs). It returns what it did.
func PlaceResolvConf(path, content, spare string) (string, error) {
	if b, err := os.ReadFile(path); err == nil && bytes.Equal(b, []byte(content)) {
		return "present", nil
	}
	st, err := os.Stat(path) // follows a symlink to what a bind mount would cover
	if err == nil && st.Mode().IsRegular() {
		if err := os.MkdirAll(spare, 0o755); err != nil {
			return "", fmt.Errorf("place %s: %w", path, err)
		}
		src := filepath.Join(spare, filepath.Base(path))
		if err := os.WriteFile(src, []byte(content), 0o644); err != nil {
			return "", fmt.Errorf("place %s: %w", path, err)
		}
		if err := unix.Mount(src, path, "", unix.MS_BIND, ""); err != nil {
			return "", fmt.Errorf("place %s: bind mount: %w", path, err)
		}
		_ = unix.Mount("", path, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, "")
		return "bound", nil
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("place %s: %w", path, err)
	}
	if lst, lerr := os.Lstat(path); lerr == nil && lst.Mode()&os.ModeSymlink != 0 {
		return "", fmt.Errorf("place %s: a dangling symlink; cannot bind over it", path)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		return "", fmt.Errorf("place %s: %w (without it glibc and Go still ask 127.0.0.1)", path, err)
	}
	return "created", nil
}
