package initramfs

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strconv"
)

// Entry is one member of a newc cpio archive. Everything that would make
// two archives of the same content differ (mtime, inode numbers, device
// numbers of the build host) is fixed by the writer, not taken from the
// build host.
type Entry struct {
	// Name is the path inside the archive without a leading slash ("init",
	// "dev/console").
	Name string
	// Mode holds the type bits (fs.ModeDir, fs.ModeSymlink,
	// fs.ModeCharDevice|fs.ModeDevice) and permissions, including setuid,
	// setgid and sticky.
	Mode fs.FileMode
	UID  int
	GID  int
	// RdevMajor and RdevMinor are the device numbers of a device node.
	RdevMajor, RdevMinor int
	// Data is the content of a regular file or the target of a symlink.
	Data []byte
}

// Mode bits as cpio stores them (octal, from stat(2)).
const (
	cpioDir     = 0o040000
	cpioReg     = 0o100000
	cpioSymlink = 0o120000
	cpioChar    = 0o020000
	cpioBlock   = 0o060000
	cpioFIFO    = 0o010000
	cpioTypes   = 0o170000
	newcMagic   = "070701"
	trailer     = "TRAILER!!!"
	headerLen   = 110
	// maxCpioName bounds a member name on read (PATH_MAX).
	maxCpioName = 4096
)

// cpioMode converts a Go file mode to the cpio mode field.
func cpioMode(m fs.FileMode) (uint32, error) {
	v := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		v |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		v |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		v |= 0o1000
	}
	switch {
	case m.IsRegular():
		return v | cpioReg, nil
	case m.IsDir():
		return v | cpioDir, nil
	case m&fs.ModeSymlink != 0:
		return v | cpioSymlink, nil
	case m&fs.ModeCharDevice != 0:
		return v | cpioChar, nil
	case m&fs.ModeDevice != 0:
		return v | cpioBlock, nil
	case m&fs.ModeNamedPipe != 0:
		return v | cpioFIFO, nil
	}
	return 0, fmt.Errorf("cpio: unsupported file type %s", m.Type())
}

// goMode converts a cpio mode field to a Go file mode.
func goMode(v uint32) (fs.FileMode, error) {
	m := fs.FileMode(v & 0o777)
	if v&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if v&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if v&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	switch v & cpioTypes {
	case cpioReg:
	case cpioDir:
		m |= fs.ModeDir
	case cpioSymlink:
		m |= fs.ModeSymlink
	case cpioChar:
		m |= fs.ModeDevice | fs.ModeCharDevice
	case cpioBlock:
		m |= fs.ModeDevice
	case cpioFIFO:
		m |= fs.ModeNamedPipe
	default:
		return 0, fmt.Errorf("cpio: unknown file type bits %#o", v&cpioTypes)
	}
	return m, nil
}

// CpioWriter writes a newc ("070701") cpio archive, the format the Linux
// kernel unpacks as an initramfs. Inode numbers count up from 1 in write
// order, mtimes are 0 and the archive's own device numbers are 0, so the
// output depends only on the entries and their order.
type CpioWriter struct {
	w      io.Writer
	ino    uint32
	closed bool
}

// NewCpioWriter returns a writer that writes to w.
func NewCpioWriter(w io.Writer) *CpioWriter { return &CpioWriter{w: w} }

// WriteEntry appends one member.
func (c *CpioWriter) WriteEntry(e Entry) error {
	if c.closed {
		return errors.New("cpio: write after Close")
	}
	if e.Name == "" || e.Name == trailer || bytes.IndexByte([]byte(e.Name), 0) >= 0 || e.Name[0] == '/' {
		return fmt.Errorf("cpio: invalid member name %q (want a relative path without NUL)", e.Name)
	}
	mode, err := cpioMode(e.Mode)
	if err != nil {
		return fmt.Errorf("%w: %s", err, e.Name)
	}
	if len(e.Data) > 0 && !e.Mode.IsRegular() && e.Mode&fs.ModeSymlink == 0 {
		return fmt.Errorf("cpio: %s: only regular files and symlinks carry data", e.Name)
	}
	if uint64(len(e.Data)) > 0xffffffff {
		return fmt.Errorf("cpio: %s: larger than 4 GiB", e.Name)
	}
	c.ino++
	return c.write(c.ino, mode, e, e.Name)
}

func (c *CpioWriter) write(ino, mode uint32, e Entry, name string) error {
	nlink := 1
	if mode&cpioTypes == cpioDir {
		nlink = 2
	}
	var h bytes.Buffer
	h.Grow(headerLen + len(name) + 4)
	h.WriteString(newcMagic)
	for _, v := range []uint64{
		uint64(ino), uint64(mode), uint64(e.UID), uint64(e.GID), uint64(nlink),
		0, // mtime
		uint64(len(e.Data)),
		0, 0, // devmajor, devminor of the archive's filesystem
		uint64(e.RdevMajor), uint64(e.RdevMinor),
		uint64(len(name) + 1),
		0, // check (newc has no checksum)
	} {
		fmt.Fprintf(&h, "%08x", uint32(v))
	}
	h.WriteString(name)
	h.WriteByte(0)
	h.Write(make([]byte, pad4(h.Len())))
	if _, err := c.w.Write(h.Bytes()); err != nil {
		return fmt.Errorf("cpio: write %s: %w", name, err)
	}
	if len(e.Data) > 0 {
		if _, err := c.w.Write(e.Data); err != nil {
			return fmt.Errorf("cpio: write %s: %w", name, err)
		}
		if _, err := c.w.Write(make([]byte, pad4(len(e.Data)))); err != nil {
			return fmt.Errorf("cpio: write %s: %w", name, err)
		}
	}
	return nil
}

// Close writes the trailer. It does not close the underlying writer.
func (c *CpioWriter) Close() error {
	if c.closed {
		return nil
	}
	c.closed = true
	return c.write(0, 0, Entry{}, trailer)
}

func pad4(n int) int { return (4 - n%4) % 4 }

// ReadCpio decodes a newc archive into its entries, stopping at the
// trailer. It reads at most maxTotal bytes of member data in all, so a
// hostile archive cannot make it allocate more.
func ReadCpio(r io.Reader, maxTotal int64) ([]Entry, error) {
	var out []Entry
	var total int64
	var off int64
	read := func(n int) ([]byte, error) {
		b := make([]byte, n)
		if _, err := io.ReadFull(r, b); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
		off += int64(n)
		return b, nil
	}
	skipPad := func() error {
		_, err := read(pad4(int(off % 4)))
		return err
	}
	for {
		start := off
		hdr, err := read(headerLen)
		if err != nil {
			return nil, fmt.Errorf("cpio: header at offset %d: %w", start, err)
		}
		if string(hdr[:6]) != newcMagic {
			return nil, fmt.Errorf("cpio: bad magic at offset %d (only newc 070701 is supported)", start)
		}
		var f [13]uint32
		for i := range f {
			v, err := strconv.ParseUint(string(hdr[6+8*i:14+8*i]), 16, 32)
			if err != nil {
				return nil, fmt.Errorf("cpio: header field %d at offset %d is not hex", i, start)
			}
			f[i] = uint32(v)
		}
		mode, uid, gid, size, rmaj, rmin, namesize := f[1], f[2], f[3], f[6], f[9], f[10], f[11]
		if namesize < 2 || namesize > maxCpioName {
			return nil, fmt.Errorf("cpio: name size %d at offset %d out of range", namesize, start)
		}
		nb, err := read(int(namesize))
		if err != nil {
			return nil, fmt.Errorf("cpio: name at offset %d: %w", start, err)
		}
		if nb[namesize-1] != 0 || bytes.IndexByte(nb[:namesize-1], 0) >= 0 {
			return nil, fmt.Errorf("cpio: name at offset %d is not NUL-terminated", start)
		}
		name := string(nb[:namesize-1])
		if err := skipPad(); err != nil {
			return nil, fmt.Errorf("cpio: padding after %q: %w", name, err)
		}
		if name == trailer {
			return out, nil
		}
		total += int64(size)
		if total > maxTotal {
			return nil, fmt.Errorf("cpio: member data exceeds the limit of %d bytes at %q", maxTotal, name)
		}
		data, err := read(int(size))
		if err != nil {
			return nil, fmt.Errorf("cpio: data of %q: %w", name, err)
		}
		if err := skipPad(); err != nil {
			return nil, fmt.Errorf("cpio: padding after %q: %w", name, err)
		}
		m, err := goMode(mode)
		if err != nil {
			return nil, fmt.Errorf("%w (member %q)", err, name)
		}
		e := Entry{Name: name, Mode: m, UID: int(uid), GID: int(gid), RdevMajor: int(rmaj), RdevMinor: int(rmin)}
		if size > 0 {
			e.Data = data
		}
		out = append(out, e)
	}
}
