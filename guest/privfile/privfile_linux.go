package privfile

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// Errors; test with errors.Is. Messages name the path (always a fixed path
// of the agent's, never input) and the rule.
var (
	ErrSymlink    = errors.New("is a symbolic link: refused (nothing is written or read through a symlink)")
	ErrNotDir     = errors.New("is not a directory")
	ErrNotRegular = errors.New("is not a regular file")
	ErrOwner      = errors.New("has the wrong owner")
	ErrMode       = errors.New("has the wrong mode")
	ErrTooLarge   = errors.New("is too large")
	ErrPath       = errors.New("must be an absolute clean path below the root")
)

// Options say whose file it is and where the walk starts.
type Options struct {
	// UID and GID own written files and created directories, and must own
	// a file that Read accepts.
	UID, GID int
	// Root is the trusted directory paths are resolved under; default "/"
	// (tests use a temporary directory).
	Root string
}

const (
	// DirMode is the mode of directories created on the way.
	DirMode = 0o700
	// FileMode is the mode of written files and the mode Read requires.
	FileMode = 0o600
)

func (o Options) root() string {
	if o.Root == "" {
		return "/"
	}
	return o.Root
}

func split(p string) (dirs []string, name string, err error) {
	if !path.IsAbs(p) || path.Clean(p) != p || p == "/" || strings.IndexByte(p, 0) >= 0 {
		return nil, "", fmt.Errorf("%s: %w", p, ErrPath)
	}
	comps := strings.Split(p[1:], "/")
	return comps[:len(comps)-1], comps[len(comps)-1], nil
}

// openDir walks dirs from the root with O_NOFOLLOW directory fds and
// returns an fd of the last one. With create, missing directories are made
// DirMode and chowned to o.UID:o.GID.
func openDir(o Options, dirs []string, create bool) (int, error) {
	fd, err := unix.Open(o.root(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open root %s: %w", o.root(), err)
	}
	walked := ""
	for _, c := range dirs {
		walked += "/" + c
		nfd, err := openNoFollow(fd, c, unix.O_RDONLY|unix.O_DIRECTORY)
		if errors.Is(err, unix.ENOENT) && create {
			nfd, err = mkdirOwned(fd, c, o)
		}
		if err != nil {
			unix.Close(fd)
			return -1, describe(walked, err)
		}
		unix.Close(fd)
		fd = nfd
	}
	return fd, nil
}

// openNoFollow opens name under dirfd, refusing a symlink as ErrSymlink
// and a non-directory (when O_DIRECTORY is asked) as ErrNotDir.
func openNoFollow(dirfd int, name string, flags int) (int, error) {
	fd, err := unix.Openat(dirfd, name, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err == nil {
		return fd, nil
	}
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
		var st unix.Stat_t
		if unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
			if st.Mode&unix.S_IFMT == unix.S_IFLNK {
				return -1, ErrSymlink
			}
			if flags&unix.O_DIRECTORY != 0 && st.Mode&unix.S_IFMT != unix.S_IFDIR {
				return -1, ErrNotDir
			}
		}
	}
	return -1, err
}

// mkdirOwned creates name under parent and hands it to o. A directory that
// appeared meanwhile is opened (with the same no-symlink rule) but not
// changed: it is not ours.
func mkdirOwned(parent int, name string, o Options) (int, error) {
	err := unix.Mkdirat(parent, name, DirMode)
	if errors.Is(err, unix.EEXIST) {
		return openNoFollow(parent, name, unix.O_RDONLY|unix.O_DIRECTORY)
	}
	if err != nil {
		return -1, err
	}
	fd, err := openNoFollow(parent, name, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return -1, err
	}
	// Chmod as well as chown: the umask may have narrowed the mode. Chmod
	// first, while the directory is still ours: a container's root has no
	// CAP_FOWNER.
	if err := unix.Fchmod(fd, DirMode); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("chmod: %w", err)
	}
	if err := unix.Fchown(fd, o.UID, o.GID); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("chown: %w", err)
	}
	_ = unix.Fsync(parent)
	return fd, nil
}

func describe(p string, err error) error {
	switch {
	case errors.Is(err, ErrSymlink), errors.Is(err, ErrNotDir):
		return fmt.Errorf("%s %w", p, err)
	}
	return fmt.Errorf("%s: %w", p, err)
}

// EnsureDir makes sure the directory p exists, creating missing components
// DirMode and owned by o.UID:o.GID, without following symlinks. Existing
// directories are left as they are.
func EnsureDir(p string, o Options) error {
	dirs, name, err := split(p)
	if err != nil {
		return err
	}
	fd, err := openDir(o, append(dirs, name), true)
	if err != nil {
		return err
	}
	unix.Close(fd)
	return nil
}

// Write replaces the file p with data, mode FileMode, owned by
// o.UID:o.GID; see the package doc for the steps. A symlink or
// non-regular file at p, or a symlink at any directory on the way, is
// refused and left untouched.
func Write(p string, data []byte, o Options) error {
	dirs, name, err := split(p)
	if err != nil {
		return err
	}
	dirfd, err := openDir(o, dirs, true)
	if err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	defer unix.Close(dirfd)
	var st unix.Stat_t
	switch err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); {
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK:
		return fmt.Errorf("write %s: %s %w", p, p, ErrSymlink)
	case err == nil && st.Mode&unix.S_IFMT != unix.S_IFREG:
		return fmt.Errorf("write %s: %s %w", p, p, ErrNotRegular)
	case err != nil && !errors.Is(err, unix.ENOENT):
		return fmt.Errorf("write %s: %w", p, err)
	}
	tmp, fd, err := createTemp(dirfd, name)
	if err != nil {
		return fmt.Errorf("write %s: create temporary file: %w", p, err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	ok := false
	defer func() {
		if !ok {
			f.Close()
			_ = unix.Unlinkat(dirfd, tmp, 0)
		}
	}()
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	// Chmod before chown, while the file is still ours (no CAP_FOWNER).
	if err := unix.Fchmod(fd, FileMode); err != nil {
		return fmt.Errorf("write %s: chmod: %w", p, err)
	}
	if err := unix.Fchown(fd, o.UID, o.GID); err != nil {
		return fmt.Errorf("write %s: chown: %w", p, err)
	}
	if err := unix.Fsync(fd); err != nil {
		return fmt.Errorf("write %s: fsync: %w", p, err)
	}
	ok = true
	if err := f.Close(); err != nil {
		_ = unix.Unlinkat(dirfd, tmp, 0)
		return fmt.Errorf("write %s: close: %w", p, err)
	}
	if err := unix.Renameat(dirfd, tmp, dirfd, name); err != nil {
		_ = unix.Unlinkat(dirfd, tmp, 0)
		return fmt.Errorf("write %s: rename into place: %w", p, err)
	}
	if err := unix.Fsync(dirfd); err != nil {
		return fmt.Errorf("write %s: fsync directory: %w", p, err)
	}
	return nil
}

// createTemp creates a fresh file beside name with O_CREAT|O_EXCL|
// O_NOFOLLOW; a name planted by someone else (file or symlink) is skipped.
func createTemp(dirfd int, name string) (string, int, error) {
	for range 16 {
		b := make([]byte, 8)
		_, _ = rand.Read(b)
		tmp := "." + name + ".tmp-" + hex.EncodeToString(b)
		fd, err := unix.Openat(dirfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, FileMode)
		if errors.Is(err, unix.EEXIST) {
			continue
		}
		return tmp, fd, err
	}
	return "", -1, errors.New("no free temporary name after 16 tries")
}

// Read returns the content of the file p that a provider placed, after
// checking that no component is a symlink, that it is a regular file owned
// by o.UID:o.GID with mode exactly FileMode, and at most max bytes.
func Read(p string, max int64, o Options) ([]byte, error) {
	dirs, name, err := split(p)
	if err != nil {
		return nil, err
	}
	dirfd, err := openDir(o, dirs, false)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	defer unix.Close(dirfd)
	fd, err := openNoFollow(dirfd, name, unix.O_RDONLY|unix.O_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, describe(p, err))
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return nil, fmt.Errorf("read %s: %s %w", p, p, ErrNotRegular)
	case int(st.Uid) != o.UID || int(st.Gid) != o.GID:
		return nil, fmt.Errorf("read %s: %s %w: want %d:%d", p, p, ErrOwner, o.UID, o.GID)
	case st.Mode&0o7777 != FileMode:
		return nil, fmt.Errorf("read %s: %s %w: want %04o", p, p, ErrMode, FileMode)
	case st.Size > max:
		return nil, fmt.Errorf("read %s: %s %w: limit %d bytes", p, p, ErrTooLarge, max)
	}
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("read %s: %s %w: limit %d bytes", p, p, ErrTooLarge, max)
	}
	return data, nil
}
