package vminit

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// Subdirectories of a kept volume (a Kubernetes PersistentVolumeClaim)
// that the Pod mounts at KeptDirs.
const (
	SeedHome        = "home"
	SeedEnvironment = "environment"
	SeedUsrLocal    = "usr-local"
)

// SeedKept prepares a kept sandbox's volume, mounted at dir, from this
// image before the agent starts (`oac-guest seed-kept DIR`, a Pod's init
// container): home and environment exist, usr-local is the image's
// /usr/local the first time, and its bin and sbin are the image's again
// on every start (they stay root's: the agent runs oac-sandbox-io from
// there). What the workload put anywhere else under usr-local stays. A
// bin or sbin the workload replaced with a symlink is removed, never
// followed.
func SeedKept(dir string) error {
	return seedKept(dir, "/usr/local")
}

func seedKept(dir, local string) error {
	syscall.Umask(0o022)
	st, err := os.Lstat(dir)
	if err != nil || !st.IsDir() {
		return fmt.Errorf("seed the kept volume: %s is not a directory (is the claim mounted there?)", dir)
	}
	for _, d := range []string{SeedHome, SeedEnvironment} {
		if err := mkdirNoFollow(filepath.Join(dir, d)); err != nil {
			return fmt.Errorf("seed the kept volume: %w", err)
		}
	}
	usr := filepath.Join(dir, SeedUsrLocal)
	if _, err := os.Lstat(usr); errors.Is(err, os.ErrNotExist) {
		// First start: the whole of the image's /usr/local, renamed into
		// place once complete (a start killed half way starts over).
		tmp := usr + ".seeding"
		if err := os.RemoveAll(tmp); err != nil {
			return fmt.Errorf("seed the kept volume: %w", err)
		}
		if err := copyTree(tmp, local); err != nil {
			return fmt.Errorf("seed the kept volume: copy %s: %w", local, err)
		}
		if err := os.Rename(tmp, usr); err != nil {
			return fmt.Errorf("seed the kept volume: %w", err)
		}
		return nil
	}
	if err := mkdirNoFollow(usr); err != nil {
		return fmt.Errorf("seed the kept volume: %w", err)
	}
	for _, d := range []string{"bin", "sbin"} {
		dst := filepath.Join(usr, d)
		if err := os.RemoveAll(dst); err != nil {
			return fmt.Errorf("seed the kept volume: replace %s: %w", dst, err)
		}
		if err := copyTree(dst, filepath.Join(local, d)); err != nil {
			return fmt.Errorf("seed the kept volume: copy %s: %w", filepath.Join(local, d), err)
		}
	}
	return nil
}

// mkdirNoFollow makes p (mode 0755) unless a directory is there; anything
// else there (a symlink the workload made) is removed first.
func mkdirNoFollow(p string) error {
	st, err := os.Lstat(p)
	switch {
	case err == nil && st.IsDir():
		return nil
	case err == nil:
		if err := os.Remove(p); err != nil {
			return err
		}
	case !errors.Is(err, os.ErrNotExist):
		return err
	}
	return os.Mkdir(p, 0o755)
}

// copyTree copies the image's directory src to dst (new), files,
// directories and symlinks, owned by root; a missing src makes an empty
// dst.
func copyTree(dst, src string) error {
	if _, err := os.Lstat(src); errors.Is(err, os.ErrNotExist) {
		return os.Mkdir(dst, 0o755)
	}
	return os.CopyFS(dst, os.DirFS(src))
}
