package imagebuild

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// mke2fsConf pins mke2fs's defaults, so the host's /etc/mke2fs.conf
// cannot change the image. No journal: the disk is attached read-only.
const mke2fsConf = `[defaults]
	base_features = sparse_super,large_file,filetype,resize_inode,dir_index,ext_attr
	blocksize = 4096
	inode_size = 256
	inode_ratio = 16384
[fs_types]
	ext4 = {
		features = extent,huge_file,flex_bg,metadata_csum,64bit,dir_nlink,extra_isize
	}
`

// FSID derives a filesystem UUID (and, with another label, a hash seed)
// from the image's content digest: the same tree always gets the same
// UUID, another tree another one.
func FSID(label, contentDigest string) string {
	s := sha256.Sum256([]byte("oac-image " + label + " " + contentDigest))
	b := s[:16]
	b[6] = b[6]&0x0f | 0x40 // version 4 layout
	b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// ext4Size estimates an image size for t's content with room for
// metadata, rounded up to MiB.
func ext4Size(t *Tree) (bytesTotal int64, inodes int) {
	var blocks int64
	for _, n := range t.nodes {
		switch {
		case n.IsReg() && n.HardLink == "":
			blocks += (n.Size + 4095) / 4096
		case n.Mode.IsDir():
			blocks++
		case n.Mode.Type() == os.ModeSymlink && len(n.Target) >= 60:
			blocks++
		}
	}
	inodes = len(t.nodes) + 64
	total := blocks*4096 + blocks*4096/10 + int64(inodes)*256 + 16<<20
	const mib = 1 << 20
	return (total + mib - 1) / mib * mib, inodes
}

// run runs a command and returns a clear error with its output.
func run(env []string, name string, args ...string) ([]byte, error) {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		if _, lerr := exec.LookPath(name); lerr != nil {
			return nil, fmt.Errorf("%s is not installed (%s; on Debian run make deps)", name, packageOf(name))
		}
		return out.Bytes(), fmt.Errorf("%s: %w: %s", name, err, strings.TrimSpace(out.String()))
	}
	return out.Bytes(), nil
}

func packageOf(tool string) string {
	switch tool {
	case "mkfs.erofs", "fsck.erofs":
		return "package erofs-utils"
	}
	return "package e2fsprogs"
}

// buildExt4 makes an ext4 image of staging (a materialized tree) at out.
// mke2fs 1.47.0 copies each inode's ctime from the staging files, which
// the build cannot choose, so every used inode's times are set to epoch
// afterwards with debugfs. UUID and directory hash seed derive from
// digest.
func buildExt4(t *Tree, staging, out, work string, epoch time.Time, digest string) error {
	conf := filepath.Join(work, "mke2fs.conf")
	if err := os.WriteFile(conf, []byte(mke2fsConf), 0o644); err != nil {
		return err
	}
	size, inodes := ext4Size(t)
	e := strconv.FormatInt(epoch.Unix(), 10)
	// e2fsprogs reads a fake time of 0 as none and takes the wall clock
	// for the superblock (and the reserved inodes): at epoch 0 (the
	// default) they get 1970-01-01T00:00:01 instead, so the default build
	// is reproducible too.
	fake := strconv.FormatInt(max(epoch.Unix(), 1), 10)
	env := []string{"MKE2FS_CONFIG=" + conf, "E2FSPROGS_FAKE_TIME=" + fake, "SOURCE_DATE_EPOCH=" + e, "MKE2FS_SYNC=0", "LC_ALL=C"}
	uuid := FSID("ext4 uuid", digest)
	seed := FSID("ext4 hash seed", digest)
	if _, err := run(env, "mkfs.ext4", "-q", "-F", "-t", "ext4", "-L", "oac-root", "-m", "0",
		"-N", strconv.Itoa(inodes), "-U", uuid,
		"-E", "hash_seed="+seed+",root_owner=0:0,nodiscard,lazy_itable_init=0",
		"-d", staging, out, strconv.FormatInt(size/1024, 10)+"k"); err != nil {
		return err
	}
	hdr, err := run(env, "dumpe2fs", "-h", out)
	if err != nil {
		return err
	}
	count, free := headerInt(hdr, "Inode count:"), headerInt(hdr, "Free inodes:")
	first := headerInt(hdr, "First inode:")
	if count <= 0 || first <= 0 {
		return fmt.Errorf("dumpe2fs: cannot read the inode counts of %s", out)
	}
	used := count - free // inodes 1..first-1 are reserved and counted
	var script strings.Builder
	for _, ino := range append([]int{2}, seq(first, first+used-(first-1))...) {
		for _, f := range []string{"atime", "mtime", "ctime", "crtime"} {
			fmt.Fprintf(&script, "sif <%d> %s @%s\n", ino, f, e)
		}
	}
	sp := filepath.Join(work, "debugfs.cmds")
	if err := os.WriteFile(sp, []byte(script.String()), 0o644); err != nil {
		return err
	}
	outb, err := run(env, "debugfs", "-w", "-f", sp, out)
	if err != nil {
		return err
	}
	if bytes.Contains(outb, []byte("sif: ")) || bytes.Contains(outb, []byte("set_inode_field: ")) {
		return fmt.Errorf("debugfs could not stamp inode times: %s", firstLine(outb))
	}
	return nil
}

func seq(from, to int) []int {
	var s []int
	for i := from; i < to; i++ {
		s = append(s, i)
	}
	return s
}

func headerInt(out []byte, key string) int {
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, key); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err == nil {
				return n
			}
		}
	}
	return -1
}

func firstLine(b []byte) string {
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "sif") || strings.Contains(l, "set_inode_field") {
			return l
		}
	}
	return ""
}

// buildErofs makes an lz4hc-compressed erofs image of staging at out:
// every time is epoch (-T), the UUID derives from digest, extended
// attributes are left out (-x -1), owners are the staging files'.
func buildErofs(staging, out string, epoch time.Time, digest string) error {
	e := strconv.FormatInt(epoch.Unix(), 10)
	_, err := run([]string{"SOURCE_DATE_EPOCH=" + e, "LC_ALL=C"}, "mkfs.erofs", "--quiet", "-zlz4hc", "-x-1",
		"-T"+e, "-U"+FSID("erofs uuid", digest), out, staging)
	return err
}
