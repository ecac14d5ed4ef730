package doors

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/moby/sys/mountinfo"
)

// binfmtDir is where the kernel shows the binfmt_misc entries.
const binfmtDir = "/proc/sys/fs/binfmt_misc"

// Scan reads the agent's own view: its mount table, the binfmt_misc
// entries and its environment. shares are the contract's share mount
// points.
func Scan(shares []string) (Sources, error) {
	mounts, err := mountinfo.GetMounts(nil)
	if err != nil {
		return Sources{}, fmt.Errorf("read the mount table: %w", err)
	}
	src := Sources{Mounts: mounts, Binfmt: map[string]string{}, Env: os.Environ(), Shares: shares, Lstat: lstatFS}
	ents, err := os.ReadDir(binfmtDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return Sources{}, fmt.Errorf("read %s: %w", binfmtDir, err)
	}
	for _, e := range ents {
		if n := e.Name(); n != "register" && n != "status" {
			if b, err := os.ReadFile(filepath.Join(binfmtDir, n)); err == nil {
				src.Binfmt[n] = string(b)
			}
		}
	}
	return src, nil
}

func lstatFS(p string) (fs.FileMode, error) {
	fi, err := os.Lstat(p)
	if err != nil {
		return 0, err
	}
	return fi.Mode(), nil
}
