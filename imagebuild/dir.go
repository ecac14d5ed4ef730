package imagebuild

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Materialize writes t into dir (which must not exist): entries in sorted
// order, owners, modes, device nodes and hard links as in t, every time
// set to epoch. Owners other than the caller's need root.
func Materialize(t *Tree, epoch time.Time, dir string) error {
	t.normalizeLinks()
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	paths := t.Paths()
	for _, p := range paths {
		n := t.nodes[p]
		hp := filepath.Join(dir, filepath.FromSlash(p))
		if err := materializeNode(t, n, dir, hp); err != nil {
			return fmt.Errorf("materialize /%s: %w", p, err)
		}
	}
	// Times last and deepest first, so creating an entry never touches a
	// directory's stamped mtime again.
	ts := []unix.Timespec{unix.NsecToTimespec(epoch.UnixNano()), unix.NsecToTimespec(epoch.UnixNano())}
	for i := len(paths) - 1; i >= 0; i-- {
		hp := filepath.Join(dir, filepath.FromSlash(paths[i]))
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, hp, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("materialize /%s: set times: %w", paths[i], err)
		}
	}
	return nil
}

func materializeNode(t *Tree, n *Node, root, hp string) error {
	m := n.Mode
	switch {
	case n.Path == ".":
	case m.IsDir():
		if err := os.Mkdir(hp, 0o700); err != nil {
			return err
		}
	case m&fs.ModeSymlink != 0:
		if err := os.Symlink(n.Target, hp); err != nil {
			return err
		}
		return os.Lchown(hp, n.UID, n.GID)
	case m&fs.ModeDevice != 0 || m&fs.ModeNamedPipe != 0:
		kind := uint32(unix.S_IFIFO)
		if m&fs.ModeCharDevice != 0 {
			kind = unix.S_IFCHR
		} else if m&fs.ModeDevice != 0 {
			kind = unix.S_IFBLK
		}
		if err := unix.Mknod(hp, kind|0o600, int(unix.Mkdev(n.RdevMajor, n.RdevMinor))); err != nil {
			return err
		}
	case n.HardLink != "":
		return os.Link(filepath.Join(root, filepath.FromSlash(n.HardLink)), hp)
	default:
		f, err := os.OpenFile(hp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		if err := copyContent(f, n); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	if err := os.Lchown(hp, n.UID, n.GID); err != nil {
		return err
	}
	// chmod after chown: chown clears setuid and setgid bits.
	return os.Chmod(hp, unixPerm(m))
}

// unixPerm keeps permission, setuid, setgid and sticky bits in the form
// os.Chmod takes.
func unixPerm(m fs.FileMode) fs.FileMode {
	return m & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
}

// DirDigest returns the sha256 of a directory tree's canonical listing:
// for every entry in sorted order its path, type and permission bits,
// owner, mtime, device numbers, symlink target, and the sha256 of a
// regular file's content. Two trees with the same digest are the same to
// every runtime that reads them.
func DirDigest(dir string) (string, error) {
	var lines []string
	err := filepath.WalkDir(dir, func(hp string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, hp)
		var s unix.Stat_t
		if err := unix.Lstat(hp, &s); err != nil {
			return err
		}
		line := fmt.Sprintf("%s %o %d:%d %d", filepath.ToSlash(rel), s.Mode, s.Uid, s.Gid, s.Mtim.Sec)
		switch s.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			f, err := os.Open(hp)
			if err != nil {
				return err
			}
			h := sha256.New()
			_, err = io.Copy(h, bufio.NewReader(f))
			f.Close()
			if err != nil {
				return err
			}
			line += fmt.Sprintf(" %d %x", s.Size, h.Sum(nil))
		case unix.S_IFLNK:
			target, err := os.Readlink(hp)
			if err != nil {
				return err
			}
			line += " -> " + target
		case unix.S_IFCHR, unix.S_IFBLK:
			line += fmt.Sprintf(" %d:%d", unix.Major(uint64(s.Rdev)), unix.Minor(uint64(s.Rdev)))
		}
		lines = append(lines, line)
		return nil
	})
	if err != nil {
		return "", err
	}
	sort.Strings(lines)
	sum := sha256.Sum256([]byte(strings.Join(lines, "\n")))
	return hex.EncodeToString(sum[:]), nil
}
