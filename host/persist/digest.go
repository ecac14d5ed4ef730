package persist

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// Digest identifies the image at path as "sha256:HEX": of a regular
// file (a disk image, an initramfs) its content; of a directory (a root
// tree) every entry's relative path, type, mode, size, modification time
// and link target, in walk order, without reading the files (a changed
// tree changes some of these; a rootfs of tens of thousands of files is
// hashed in well under a second). "" for "".
func Digest(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	st, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("image %s: %w", path, err)
	}
	h := sha256.New()
	if st.Mode().IsRegular() {
		f, err := os.Open(path)
		if err != nil {
			return "", fmt.Errorf("image %s: %w", path, err)
		}
		defer f.Close()
		if _, err := io.Copy(h, f); err != nil {
			return "", fmt.Errorf("image %s: %w", path, err)
		}
		return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
	}
	err = filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			fmt.Fprintf(h, "error %s\n", p[len(path):])
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		rel, _ := filepath.Rel(path, p)
		target := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			target, _ = os.Readlink(p)
		}
		fmt.Fprintf(h, "%q %o %d %d %q\n", rel, uint32(info.Mode()), info.Size(), info.ModTime().UnixNano(), target)
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("image %s: %w", path, err)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}
