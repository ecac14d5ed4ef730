package workload

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// scratch returns a tmpfs mount that is attached nowhere (new mount API,
// Linux 5.2): only its descriptor reaches it, and it is gone once that is
// closed (at exec at the latest). Its root is 0755, so following a symlink
// in it is never refused as in a world-writable sticky directory.
func scratch() (int, error) {
	fs, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen tmpfs: %w", err)
	}
	defer unix.Close(fs)
	for k, v := range map[string]string{"mode": "0755", "size": "64k", "nr_inodes": "16"} {
		if err := unix.FsconfigSetString(fs, k, v); err != nil {
			return -1, fmt.Errorf("fsconfig %s: %w", k, err)
		}
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return -1, fmt.Errorf("fsconfig create: %w", err)
	}
	mnt, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return -1, fmt.Errorf("fsmount: %w", err)
	}
	return mnt, nil
}

// maskDir is the directory the launcher briefly covers with a tmpfs of
// its own, in its own mount namespace, to make the empty file a mask is
// bound from (every guest has /dev; nothing runs there meanwhile).
const maskDir = "/dev"

// maskFiles mounts an empty, mode 000, read-only file over each path in the
// calling process's mount namespace (which must be its own): opening one
// fails with EACCES, and neither unlink nor rename can move it away (it is
// a mount point). Paths are resolved without following any symlink.
//
// The file lives on a small tmpfs mounted over maskDir, made read-only
// once the file exists, then detached again: the binds keep it alive and
// the directory is as before. (Plain mount(2), so any kernel does.)
func maskFiles(paths []string) error {
	type target struct {
		path string
		fd   int
	}
	var targets []target
	defer func() {
		for _, t := range targets {
			unix.Close(t.fd)
		}
	}()
	for _, p := range paths {
		fd, err := openNoSymlinks(p)
		if errors.Is(err, unix.ENOENT) {
			continue // nothing to hide
		}
		if err != nil {
			return fmt.Errorf("mask %s: %w", p, err)
		}
		targets = append(targets, target{p, fd})
	}
	if len(targets) == 0 {
		return nil
	}
	if err := unix.Mount("tmpfs", maskDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755,size=4k,nr_inodes=4"); err != nil {
		return fmt.Errorf("mask: mount a tmpfs on %s: %w", maskDir, err)
	}
	detached := false
	defer func() {
		if !detached {
			_ = unix.Unmount(maskDir, unix.MNT_DETACH)
		}
	}()
	src := filepath.Join(maskDir, "masked")
	fd, err := unix.Open(src, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("mask: create the empty file: %w", err)
	}
	unix.Close(fd)
	if err := unix.Mount("", maskDir, "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mask: make the tmpfs read-only: %w", err)
	}
	for _, t := range targets {
		if err := unix.Mount(src, "/proc/self/fd/"+strconv.Itoa(t.fd), "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("mask %s: %w", t.path, err)
		}
	}
	if err := unix.Unmount(maskDir, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("mask: detach the tmpfs from %s: %w", maskDir, err)
	}
	detached = true
	return nil
}

// openNoSymlinks opens path as O_PATH without following a symlink in any
// component (a uid-1000 process may have planted one in a directory it
// owns), and requires a file that is not a directory (a regular file, or
// a socket or device a platform mounted in).
func openNoSymlinks(path string) (int, error) {
	fd, err := unix.Openat2(unix.AT_FDCWD, path, &unix.OpenHow{
		Flags: unix.O_PATH | unix.O_CLOEXEC | unix.O_NOFOLLOW, Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if errors.Is(err, unix.ENOSYS) {
		// Before openat2 (5.6): walk with O_NOFOLLOW from the root.
		fd, err = walkNoSymlinks(path)
	}
	if err != nil {
		return -1, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT == unix.S_IFDIR || st.Mode&unix.S_IFMT == unix.S_IFLNK {
		unix.Close(fd)
		return -1, fmt.Errorf("%s is a directory", path)
	}
	return fd, nil
}

func walkNoSymlinks(path string) (int, error) {
	if !filepath.IsAbs(path) {
		return -1, fmt.Errorf("%s is not absolute", path)
	}
	dir, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	parts := splitPath(filepath.Clean(path))
	for i, part := range parts {
		flags := unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC
		if i < len(parts)-1 {
			flags |= unix.O_DIRECTORY
		}
		next, err := unix.Openat(dir, part, flags, 0)
		unix.Close(dir)
		if err != nil {
			return -1, err
		}
		dir = next
	}
	return dir, nil
}

func splitPath(p string) []string {
	var parts []string
	for p != "/" && p != "." {
		parts = append([]string{filepath.Base(p)}, parts...)
		p = filepath.Dir(p)
	}
	return parts
}

// program is an undumpable copy of a binary, and the path to exec it by.
type program struct {
	path string
	// mem is the copy; it must stay open until the exec.
	mem *os.File
}

// undumpable copies the binary at path into a sealed memfd of mode 0111
// and returns how to exec it; why says what went wrong when it cannot (the
// caller then execs path as it is), or, with a program, what is off.
//
// The kernel marks a process not dumpable when its program file is not
// readable by it (fs/exec.c, would_dump); the mark cannot be set from
// outside and is reset by every other exec, so this is the only way to
// have it from the first instruction of a program this project does not
// build. The copy is exec'd through a symlink named like the original in
// a detached tmpfs, so the process's name (comm) is the program's, not a
// descriptor number; without the capability to make that tmpfs, through
// /proc/self/fd.
func undumpable(path string) (*program, string) {
	src, err := os.Open(path)
	if err != nil {
		return nil, err.Error()
	}
	defer src.Close()
	var magic [2]byte
	if _, err := io.ReadFull(src, magic[:]); err != nil || string(magic[:]) == "#!" {
		return nil, "a script cannot run from an unreadable file"
	}
	if _, err := src.Seek(0, io.SeekStart); err != nil {
		return nil, err.Error()
	}
	name := filepath.Base(path)
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|unix.MFD_EXEC)
	if errors.Is(err, unix.EINVAL) { // before Linux 6.3, which added MFD_EXEC
		fd, err = unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	}
	if err != nil {
		return nil, "memfd_create: " + err.Error()
	}
	mem := os.NewFile(uintptr(fd), "memfd:"+name)
	if _, err := io.Copy(mem, src); err != nil {
		mem.Close()
		return nil, "copy the program: " + err.Error()
	}
	if err := unix.Fchmod(fd, 0o111); err != nil {
		mem.Close()
		return nil, "chmod the copy: " + err.Error()
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SEAL|unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_WRITE); err != nil {
		mem.Close()
		return nil, "seal the copy: " + err.Error()
	}
	// mem stays open (close-on-exec) until the exec: the kernel resolves
	// the path before it closes the descriptors.
	memPath := "/proc/self/fd/" + strconv.Itoa(fd)
	unnamed := func(err error) (*program, string) {
		return &program{path: memPath, mem: mem}, fmt.Sprintf("its process name is a descriptor number (%v)", err)
	}
	mnt, err := scratch()
	if err != nil {
		return unnamed(err)
	}
	if err := unix.Symlinkat(memPath, mnt, name); err != nil {
		unix.Close(mnt)
		return unnamed(err)
	}
	return &program{path: "/proc/self/fd/" + strconv.Itoa(mnt) + "/" + name, mem: mem}, ""
}
