package imagebuild

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// TarLimits bound what a base tar may make the builder store.
type TarLimits struct {
	// MaxEntries is the most members accepted (default 1,000,000).
	MaxEntries int
	// MaxBytes is the most file content accepted in all (default 32 GiB).
	MaxBytes int64
}

func (l TarLimits) withDefaults() TarLimits {
	if l.MaxEntries <= 0 {
		l.MaxEntries = 1_000_000
	}
	if l.MaxBytes <= 0 {
		l.MaxBytes = 32 << 30
	}
	return l
}

// BlobSink stores a regular file's content while a tar is read and returns
// the host path that now holds it ("" keeps the content in memory).
type BlobSink func(index int, r io.Reader) (src string, data []byte, err error)

// DirSink stores contents as files under dir (one per member).
func DirSink(dir string) BlobSink {
	return func(index int, r io.Reader) (string, []byte, error) {
		p := filepath.Join(dir, strconv.Itoa(index))
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return "", nil, err
		}
		if _, err := io.Copy(f, r); err != nil {
			f.Close()
			return "", nil, err
		}
		return p, nil, f.Close()
	}
}

// ReadTar reads a base rootfs from a tar or gzip-compressed tar stream
// (detected by its magic). Member names are cleaned; a name that leaves
// the root, a hard link to a member not seen before, or a member type
// other than file, directory, symlink, hard link, device or FIFO is an
// error. Owners are kept as numbers; names, times and extended
// attributes are dropped. Later members replace earlier ones, as tar
// extraction does.
func ReadTar(r io.Reader, sink BlobSink, lim TarLimits) (*Tree, error) {
	lim = lim.withDefaults()
	br := bufio.NewReader(r)
	var in io.Reader = br
	if magic, err := br.Peek(2); err == nil && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("base tar: gzip: %w", err)
		}
		zr.Multistream(false)
		in = zr
	}
	tr := tar.NewReader(in)
	t := NewTree()
	var total int64
	for i := 0; ; i++ {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("base tar: member %d: %w", i, err)
		}
		if i >= lim.MaxEntries {
			return nil, fmt.Errorf("base tar: more than %d members", lim.MaxEntries)
		}
		p, err := cleanRel(h.Name)
		if err != nil {
			return nil, fmt.Errorf("base tar: member %d: %w", i, err)
		}
		if h.Uid < 0 || h.Gid < 0 || h.Uid > 1<<31-2 || h.Gid > 1<<31-2 {
			return nil, fmt.Errorf("base tar: /%s: owner %d:%d out of range", p, h.Uid, h.Gid)
		}
		perm := fs.FileMode(h.Mode) & fs.ModePerm
		if h.Mode&04000 != 0 {
			perm |= fs.ModeSetuid
		}
		if h.Mode&02000 != 0 {
			perm |= fs.ModeSetgid
		}
		if h.Mode&01000 != 0 {
			perm |= fs.ModeSticky
		}
		n := Node{Path: p, Mode: perm, UID: h.Uid, GID: h.Gid}
		switch h.Typeflag {
		case tar.TypeReg, tar.TypeRegA:
			if h.Size < 0 {
				return nil, fmt.Errorf("base tar: /%s: negative size", p)
			}
			total += h.Size
			if total > lim.MaxBytes {
				return nil, fmt.Errorf("base tar: contents exceed the limit of %d bytes at /%s", lim.MaxBytes, p)
			}
			n.Size = h.Size
			if n.Src, n.Data, err = sink(i, tr); err != nil {
				return nil, fmt.Errorf("base tar: /%s: %w", p, err)
			}
			if n.Src == "" && int64(len(n.Data)) != h.Size {
				return nil, fmt.Errorf("base tar: /%s: %w", p, io.ErrUnexpectedEOF)
			}
		case tar.TypeDir:
			n.Mode |= fs.ModeDir
		case tar.TypeSymlink:
			if h.Linkname == "" {
				return nil, fmt.Errorf("base tar: /%s: symlink without a target", p)
			}
			n.Mode, n.Target = fs.ModeSymlink|0o777, h.Linkname
		case tar.TypeLink:
			lp, err := cleanRel(h.Linkname)
			if err != nil {
				return nil, fmt.Errorf("base tar: /%s: hard link: %w", p, err)
			}
			target := t.nodes[lp]
			if target == nil || !target.IsReg() {
				return nil, fmt.Errorf("base tar: /%s: hard link to /%s, which is not a regular file seen before", p, lp)
			}
			if target.HardLink != "" {
				lp = target.HardLink
			}
			if lp == p {
				continue // a link to itself changes nothing
			}
			n.HardLink = lp
		case tar.TypeChar:
			n.Mode |= fs.ModeDevice | fs.ModeCharDevice
			n.RdevMajor, n.RdevMinor = uint32(h.Devmajor), uint32(h.Devminor)
		case tar.TypeBlock:
			n.Mode |= fs.ModeDevice
			n.RdevMajor, n.RdevMinor = uint32(h.Devmajor), uint32(h.Devminor)
		case tar.TypeFifo:
			n.Mode |= fs.ModeNamedPipe
		case tar.TypeXGlobalHeader:
			continue
		default:
			return nil, fmt.Errorf("base tar: /%s: unsupported member type %q", p, h.Typeflag)
		}
		if p == "." {
			if !n.Mode.IsDir() {
				return nil, errors.New("base tar: the root member is not a directory")
			}
			n.Path = "."
			t.nodes["."] = &n
			continue
		}
		// A member replaces what was there; missing parents are made.
		if old := t.nodes[p]; old != nil && old.Mode.IsDir() && n.Mode.IsDir() {
			old.Mode, old.UID, old.GID = n.Mode, n.UID, n.GID
			continue
		}
		if old := t.nodes[p]; old != nil && old.Mode.IsDir() {
			return nil, fmt.Errorf("base tar: /%s replaces a directory with a non-directory", p)
		}
		if err := t.putRaw(n); err != nil {
			return nil, fmt.Errorf("base tar: %w", err)
		}
	}
	return t, nil
}

// putRaw stores n at its exact path (no symlink following: a tar's
// members name the paths they create), making missing parents.
func (t *Tree) putRaw(n Node) error {
	for d := parentOf(n.Path); d != "."; d = parentOf(d) {
		if old := t.nodes[d]; old != nil {
			if !old.Mode.IsDir() {
				return fmt.Errorf("/%s needs /%s to be a directory", n.Path, d)
			}
			continue
		}
		t.nodes[d] = &Node{Path: d, Mode: fs.ModeDir | 0o755}
	}
	if old := t.nodes[n.Path]; old != nil && old.IsReg() && old.HardLink == "" {
		t.promoteLink(n.Path)
	}
	t.nodes[n.Path] = &n
	return nil
}

// promoteLink keeps hard links to p valid when p is replaced: the first
// link becomes the holder of the content.
func (t *Tree) promoteLink(p string) {
	old := t.nodes[p]
	var first *Node
	for _, q := range t.Paths() {
		n := t.nodes[q]
		if n.HardLink != p {
			continue
		}
		if first == nil {
			first = n
			n.HardLink, n.Src, n.Data, n.Size = "", old.Src, old.Data, old.Size
			continue
		}
		n.HardLink = first.Path
	}
}

func parentOf(p string) string {
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] == '/' {
			return p[:i]
		}
	}
	return "."
}

// tarHeader returns the normalized header of n: numeric owners only, the
// build's epoch as the only time, no names of users or groups.
func tarHeader(n *Node, epoch time.Time) *tar.Header {
	name := n.Path
	h := &tar.Header{Name: name, Uid: n.UID, Gid: n.GID, ModTime: epoch, Format: tar.FormatPAX}
	h.Mode = int64(n.Mode.Perm())
	if n.Mode&fs.ModeSetuid != 0 {
		h.Mode |= 04000
	}
	if n.Mode&fs.ModeSetgid != 0 {
		h.Mode |= 02000
	}
	if n.Mode&fs.ModeSticky != 0 {
		h.Mode |= 01000
	}
	switch {
	case n.Mode.IsDir():
		h.Typeflag, h.Name = tar.TypeDir, name+"/"
	case n.Mode&fs.ModeSymlink != 0:
		h.Typeflag, h.Linkname = tar.TypeSymlink, n.Target
	case n.Mode&fs.ModeCharDevice != 0:
		h.Typeflag, h.Devmajor, h.Devminor = tar.TypeChar, int64(n.RdevMajor), int64(n.RdevMinor)
	case n.Mode&fs.ModeDevice != 0:
		h.Typeflag, h.Devmajor, h.Devminor = tar.TypeBlock, int64(n.RdevMajor), int64(n.RdevMinor)
	case n.Mode&fs.ModeNamedPipe != 0:
		h.Typeflag = tar.TypeFifo
	case n.HardLink != "":
		h.Typeflag, h.Linkname = tar.TypeLink, n.HardLink
	default:
		h.Typeflag, h.Size = tar.TypeReg, n.Size
	}
	if h.Uid < 1<<21 && h.Gid < 1<<21 && len(h.Name) <= 100 && len(h.Linkname) <= 100 && h.Size < 1<<33 {
		// Plain ustar when it fits: no PAX records, which some
		// importers print warnings about.
		h.Format = tar.FormatUSTAR
	}
	return h
}

// WriteTar writes t as an uncompressed tar to w, members in sorted order
// (the root itself is not a member), every time set to epoch.
func WriteTar(t *Tree, epoch time.Time, w io.Writer) error {
	t.normalizeLinks()
	tw := tar.NewWriter(w)
	for _, p := range t.Paths() {
		if p == "." {
			continue
		}
		n := t.nodes[p]
		if err := tw.WriteHeader(tarHeader(n, epoch)); err != nil {
			return fmt.Errorf("tar /%s: %w", p, err)
		}
		if n.IsReg() && n.HardLink == "" && n.Size > 0 {
			if err := copyContent(tw, n); err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

// copyContent writes n's content to w, checking that it still has the
// size recorded when the tree was loaded.
func copyContent(w io.Writer, n *Node) error {
	if n.Src == "" {
		if int64(len(n.Data)) != n.Size {
			return fmt.Errorf("/%s: content is %d bytes, want %d", n.Path, len(n.Data), n.Size)
		}
		_, err := w.Write(n.Data)
		return err
	}
	f, err := os.Open(n.Src)
	if err != nil {
		return fmt.Errorf("/%s: %w", n.Path, err)
	}
	defer f.Close()
	c, err := io.Copy(w, io.LimitReader(f, n.Size+1))
	if err != nil {
		return fmt.Errorf("/%s: %w", n.Path, err)
	}
	if c != n.Size {
		return fmt.Errorf("/%s: %s changed while the image was built (%d bytes, want %d)", n.Path, n.Src, c, n.Size)
	}
	return nil
}

// normalizeLinks makes the first path (in output order) of every hard
// link group the one that holds the content, so a link always follows
// its target in an archive.
func (t *Tree) normalizeLinks() {
	groups := map[string][]*Node{}
	for _, n := range t.nodes {
		if n.HardLink != "" {
			groups[n.HardLink] = append(groups[n.HardLink], n)
		}
	}
	for primary, links := range groups {
		holder := t.nodes[primary]
		if holder == nil || !holder.IsReg() || holder.HardLink != "" {
			for _, l := range links {
				l.HardLink = "" // dangling: cannot happen through the loaders
			}
			continue
		}
		min := holder
		for _, l := range links {
			if lessPath(l.Path, min.Path) {
				min = l
			}
		}
		if min == holder {
			continue
		}
		min.HardLink, min.Src, min.Data, min.Size = "", holder.Src, holder.Data, holder.Size
		min.Mode, min.UID, min.GID = holder.Mode, holder.UID, holder.GID
		holder.HardLink, holder.Src, holder.Data, holder.Size = min.Path, "", nil, 0
		for _, l := range links {
			if l != min {
				l.HardLink = min.Path
			}
		}
	}
}
