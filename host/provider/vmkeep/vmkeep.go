package vmkeep

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/provider/kit"
)

// Names of what a kept VM sandbox holds in its directory.
const (
	// ImageName is the copy of the image's root disk the sandbox boots.
	ImageName = "image.disk"
	// RecordName records the image ImageName was copied from.
	RecordName = "image.json"
	// DiskName is the kept disk: the guest's writable layer.
	DiskName = "kept.ext4"
	// tmpSuffix marks a file being made (renamed into place when whole).
	tmpSuffix = ".part"
)

// DefaultDiskSize is the kept disk's size: a sparse file, so the host
// pays only for what the guest writes.
const DefaultDiskSize = 16 << 30

// Kept is a kept VM sandbox's disks, ready to boot.
type Kept struct {
	// Image is the copy of the root disk to boot ("" when the sandbox
	// runs from its initramfs).
	Image string
	// Disk is the kept disk (read-write).
	Disk string
	// Changed, when not empty, says that the image the sandbox was
	// created from changed since: the sandbox keeps booting its copy
	// until reset.
	Changed string
}

// Prepare makes or reuses the kept state in dir for a sandbox booting
// image (a root disk; "" runs from the initramfs): on the first call it
// copies the image and makes the kept disk of size bytes with mkfs (the
// mkfs.ext4 binary); later calls reuse them and say whether the image
// changed. A sandbox made with a root disk cannot start without one and
// the other way round (errors wrap provider.ErrInvalidSpec: reset it).
// What a failed first call made is removed by Discard.
func Prepare(dir, image, mkfs string, size int64) (Kept, error) {
	k := Kept{Disk: filepath.Join(dir, DiskName)}
	_, derr := os.Stat(k.Disk)
	made := derr == nil
	rec, rerr := kit.ReadImageRecord(filepath.Join(dir, RecordName))
	switch {
	case made && rerr == nil && image == "":
		return k, fmt.Errorf("%w: the kept sandbox was created from the root disk %s: start it with one (--disk), or reset it", provider.ErrInvalidSpec, rec.Source)
	case made && errors.Is(rerr, os.ErrNotExist) && image != "":
		return k, fmt.Errorf("%w: the kept sandbox was created without a root disk (it runs from its initramfs): start it without --disk, or reset it", provider.ErrInvalidSpec)
	case made && rerr != nil && !errors.Is(rerr, os.ErrNotExist):
		return k, rerr
	}
	if image != "" {
		k.Image = filepath.Join(dir, ImageName)
		if made {
			k.Changed = rec.Changed(image, "booting its copy")
		} else if err := copyImage(image, dir); err != nil {
			return k, err
		}
	}
	if !made {
		if err := makeDisk(k.Disk, mkfs, size); err != nil {
			return k, err
		}
	}
	return k, nil
}

// Discard removes what Prepare made in dir (also when a Prepare was cut
// short) and nothing else; a directory already gone is not an error.
func Discard(dir string) error {
	var errs []error
	for _, n := range []string{ImageName, RecordName, DiskName} {
		for _, p := range []string{filepath.Join(dir, n), filepath.Join(dir, n+tmpSuffix)} {
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// copyImage copies image to dir/ImageName (blocks shared where the
// filesystem can) and writes the record; the copy is read-only.
func copyImage(image, dir string) error {
	if st, err := os.Stat(image); err != nil || !st.Mode().IsRegular() {
		return fmt.Errorf("%w: disk %s is not a readable file", provider.ErrInvalidSpec, image)
	}
	rec, err := kit.RecordImage(image)
	if err != nil {
		return fmt.Errorf("kept sandbox: read the image %s: %w", image, err)
	}
	dst := filepath.Join(dir, ImageName)
	tmp := dst + tmpSuffix
	_ = os.Remove(tmp)
	if err := cloneFile(image, tmp); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("kept sandbox: copy the image %s into %s: %w", image, dir, err)
	}
	if err := os.Chmod(tmp, 0o400); err != nil {
		return fmt.Errorf("kept sandbox: %w", err)
	}
	if err := kit.WriteImageRecord(filepath.Join(dir, RecordName), rec); err != nil {
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return fmt.Errorf("kept sandbox: %w", err)
	}
	return nil
}

// copyFile copies src to a new file dst (io.Copy lets the kernel copy,
// copy_file_range on Linux, which shares blocks where it can).
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// makeDisk makes the kept disk: a sparse file of size bytes with an empty
// ext4 filesystem (lazy inode tables and journal, so it stays sparse; no
// reserved blocks; its root owned by the guest's root).
func makeDisk(path, mkfs string, size int64) error {
	if size <= 0 {
		size = DefaultDiskSize
	}
	tmp := path + tmpSuffix
	_ = os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("kept sandbox: %w", err)
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("kept sandbox: make the kept disk: %w", err)
	}
	cmd := exec.Command(mkfs, MkfsArgs(tmp)...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"}
	cmd.Dir = "/"
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("kept sandbox: %s: %w: %s", mkfs, err, strings.TrimSpace(string(out)))
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("kept sandbox: %w", err)
	}
	return nil
}

// MkfsArgs are mkfs.ext4's arguments for the kept disk at path.
func MkfsArgs(path string) []string {
	return []string{"-q", "-F", "-t", "ext4", "-L", "oac-kept", "-m", "0",
		"-E", "lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0", path}
}

// macMkfs are where Homebrew's e2fsprogs (keg-only) puts mkfs.ext4.
var macMkfs = []string{"/opt/homebrew/opt/e2fsprogs/sbin/mkfs.ext4", "/usr/local/opt/e2fsprogs/sbin/mkfs.ext4"}

// Mkfs returns given, or mkfs.ext4 found in PATH, /sbin, /usr/sbin or
// Homebrew's e2fsprogs. Without one the error wraps
// provider.ErrUnavailable and says what to install.
func Mkfs(prov, given string) (string, error) {
	if given != "" {
		return given, nil
	}
	if p, err := exec.LookPath("mkfs.ext4"); err == nil {
		return p, nil
	}
	for _, p := range append([]string{"/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"}, macMkfs...) {
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: %s: a kept sandbox's disk is made with mkfs.ext4, which is not installed (apt-get install e2fsprogs, or make deps; on macOS brew install e2fsprogs)", provider.ErrUnavailable, prov)
}
