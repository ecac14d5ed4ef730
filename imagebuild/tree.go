package imagebuild

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// Node is one entry of an image tree. Times are not kept: every output
// stamps the build's epoch (SOURCE_DATE_EPOCH).
type Node struct {
	// Path is clean and relative to the root, without a leading slash;
	// the root itself is ".".
	Path string
	// Mode holds the type bits (dir, symlink, device, char device, named
	// pipe; none for a regular file) and the permission bits including
	// setuid, setgid and sticky.
	Mode fs.FileMode
	UID  int
	GID  int
	// Target is a symlink's target.
	Target string
	// HardLink, on a regular file, names the node (Path) it is a hard link
	// to; such a node has no content of its own.
	HardLink string
	// Src is the host file holding a regular file's content, or Data holds
	// it.
	Src  string
	Data []byte
	// Size is a regular file's size.
	Size int64
	// RdevMajor and RdevMinor are a device node's numbers.
	RdevMajor, RdevMinor uint32
}

// IsReg reports whether n is a regular file (hard links included).
func (n *Node) IsReg() bool { return n.Mode.Type() == 0 }

// Tree is an image's file tree by path. It is built from a base rootfs,
// then injected into, then written out by the output writers, always in
// sorted path order.
type Tree struct {
	nodes map[string]*Node
}

// NewTree returns a tree holding only a 0755 root directory owned by root.
func NewTree() *Tree {
	return &Tree{nodes: map[string]*Node{".": {Path: ".", Mode: fs.ModeDir | 0o755}}}
}

// Len is the number of nodes, the root included.
func (t *Tree) Len() int { return len(t.nodes) }

// Get returns the node at p (a clean relative path) or nil.
func (t *Tree) Get(p string) *Node { return t.nodes[p] }

// Paths returns every path in the order outputs write them: sorted
// bytewise, so a directory comes before what it holds.
func (t *Tree) Paths() []string {
	out := make([]string, 0, len(t.nodes))
	for p := range t.nodes {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return lessPath(out[i], out[j]) })
	return out
}

// lessPath orders paths component by component, so "a/b" sorts before
// "a-c" ("a" is a prefix) and every directory precedes its contents.
func lessPath(a, b string) bool {
	if a == "." {
		return b != "."
	}
	if b == "." {
		return false
	}
	as, bs := strings.Split(a, "/"), strings.Split(b, "/")
	for i := 0; i < len(as) && i < len(bs); i++ {
		if as[i] != bs[i] {
			return as[i] < bs[i]
		}
	}
	return len(as) < len(bs)
}

// cleanRel turns an archive or user path into a clean relative path; it
// refuses paths that leave the root.
func cleanRel(p string) (string, error) {
	if p == "" || strings.IndexByte(p, 0) >= 0 {
		return "", fmt.Errorf("invalid path %q", p)
	}
	c := path.Clean("/" + p)
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return "", fmt.Errorf("path %q leaves the root", p)
		}
	}
	if c == "/" {
		return ".", nil
	}
	return strings.TrimPrefix(c, "/"), nil
}

// Put adds or replaces n, creating missing parent directories (0755,
// root). Parent components that are symlinks are followed inside the
// tree, so on a merged-/usr base "sbin/x" lands in "usr/sbin/x". A parent
// that is not a directory is an error. Put returns the path n was stored
// under.
func (t *Tree) Put(n Node) (string, error) {
	p, err := cleanRel(n.Path)
	if err != nil {
		return "", err
	}
	if p == "." {
		if !n.Mode.IsDir() {
			return "", errors.New("the root must be a directory")
		}
		n.Path = "."
		t.nodes["."] = &n
		return ".", nil
	}
	dir, err := t.mkdirAll(path.Dir(p), 0)
	if err != nil {
		return "", err
	}
	p = path.Join(dir, path.Base(p))
	if old := t.nodes[p]; old != nil && old.Mode.IsDir() && !n.Mode.IsDir() {
		return "", fmt.Errorf("/%s is a directory in the base; cannot replace it with a file", p)
	}
	if old := t.nodes[p]; old != nil && old.IsReg() && old.HardLink == "" {
		t.promoteLink(p)
	}
	n.Path = p
	t.nodes[p] = &n
	return p, nil
}

// Resolve follows symlinks in every component of p (a clean relative
// path) and returns the path it lands on inside the tree. The last
// component is followed too when follow is true.
func (t *Tree) Resolve(p string, follow bool) (string, error) {
	if p == "." {
		return ".", nil
	}
	parts := strings.Split(p, "/")
	cur := "."
	hops := 0
	for i := 0; i < len(parts); i++ {
		next := path.Join(cur, parts[i])
		n := t.nodes[next]
		last := i == len(parts)-1
		if n != nil && n.Mode&fs.ModeSymlink != 0 && (!last || follow) {
			hops++
			if hops > 40 {
				return "", fmt.Errorf("/%s: too many levels of symbolic links", p)
			}
			target := n.Target
			var base string
			if strings.HasPrefix(target, "/") {
				base = "."
			} else {
				base = cur
			}
			joined := path.Join("/", base, target)
			rest := strings.Join(parts[i+1:], "/")
			np, err := cleanRel(strings.TrimPrefix(path.Join(joined, rest), "/"))
			if err != nil {
				return "", err
			}
			if np == "." {
				return ".", nil
			}
			parts = strings.Split(np, "/")
			cur = "."
			i = -1
			continue
		}
		cur = next
	}
	return cur, nil
}

// mkdirAll makes sure dir exists as a directory (following symlinks) and
// returns its resolved path. New directories get mode 0755 (or perm) and
// owner root.
func (t *Tree) mkdirAll(dir string, perm fs.FileMode) (string, error) {
	if perm == 0 {
		perm = 0o755
	}
	if dir == "." {
		return ".", nil
	}
	parent, err := t.mkdirAll(path.Dir(dir), 0)
	if err != nil {
		return "", err
	}
	p := path.Join(parent, path.Base(dir))
	r, err := t.Resolve(p, true)
	if err != nil {
		return "", err
	}
	if n := t.nodes[r]; n != nil {
		if !n.Mode.IsDir() {
			return "", fmt.Errorf("/%s is not a directory in the image", r)
		}
		return r, nil
	}
	if r != p {
		// A dangling symlink: create what it points at.
		return t.mkdirAll(r, perm)
	}
	t.nodes[p] = &Node{Path: p, Mode: fs.ModeDir | perm}
	return p, nil
}

// LoadDir reads a base rootfs from a host directory: types, permission
// bits and numeric owners as they are (names and times are dropped), hard
// links kept, sockets skipped. File contents are read when an output is
// written.
func LoadDir(root string) (*Tree, error) {
	st, err := os.Stat(root)
	if err != nil {
		return nil, fmt.Errorf("base rootfs: %w", err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("base rootfs %s is not a directory", root)
	}
	t := NewTree()
	type inoKey struct{ dev, ino uint64 }
	seen := map[inoKey]string{}
	err = filepath.WalkDir(root, func(hp string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("base rootfs: %w", err)
		}
		rel, err := filepath.Rel(root, hp)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		var s unix.Stat_t
		if err := unix.Lstat(hp, &s); err != nil {
			return fmt.Errorf("base rootfs: lstat %s: %w", hp, err)
		}
		fi, err := d.Info()
		if err != nil {
			return fmt.Errorf("base rootfs: %w", err)
		}
		n := Node{Path: rel, Mode: fi.Mode() & (fs.ModeType | fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky), UID: int(s.Uid), GID: int(s.Gid)}
		switch {
		case fi.Mode()&fs.ModeSocket != 0:
			return nil
		case fi.Mode().IsRegular():
			k := inoKey{uint64(s.Dev), uint64(s.Ino)}
			if first, ok := seen[k]; ok && s.Nlink > 1 {
				n.HardLink = first
			} else {
				seen[k] = rel
				n.Src, n.Size = hp, fi.Size()
			}
		case fi.Mode()&fs.ModeSymlink != 0:
			if n.Target, err = os.Readlink(hp); err != nil {
				return fmt.Errorf("base rootfs: %w", err)
			}
			n.Mode = fs.ModeSymlink | 0o777
		case fi.Mode()&fs.ModeDevice != 0:
			n.RdevMajor, n.RdevMinor = unix.Major(uint64(s.Rdev)), unix.Minor(uint64(s.Rdev))
		}
		if rel == "." {
			n.Path = "."
			t.nodes["."] = &n
			return nil
		}
		t.nodes[rel] = &n
		return nil
	})
	if err != nil {
		return nil, err
	}
	return t, nil
}
