package initramfs

import (
	"compress/gzip"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/oac/sandbox-agent/protocol"
)

// Paths inside the image that oac-guest relies on.
const (
	// InitPath is where the agent goes: the kernel runs /init of an
	// initramfs as PID 1.
	InitPath = "/init"
	// ModuleListPath lists the absolute paths of the modules to load, one
	// per line, in load order. oac-guest reads it at boot
	// (guest/vminit.ModuleListPath must stay equal).
	ModuleListPath = "/etc/oac/modules"
	// RuntimeUID and RuntimeGID own RuntimeHome.
	RuntimeUID  = 1000
	RuntimeGID  = 1000
	RuntimeHome = "/home/runtime"
)

// DefaultModules are the modules a VM guest loads at boot when none are
// named: the virtio PCI transport and console (virtio-serial, qemu's
// transport), the virtio socket transport (vsock, Virtualization.framework's),
// the block device and the filesystems of the root disk (ext4 is built into
// Debian's cloud kernel; erofs and the overlay of the writable layers are
// modules), virtio-fs for shares, and nftables for transparent egress.
var DefaultModules = []string{
	"virtio_pci", "virtio_console", "vmw_vsock_virtio_transport",
	"virtio_blk", "erofs", "overlay", "virtiofs",
	"nf_tables", "nft_chain_nat", "nft_redir", "nft_ct", "nft_objref",
}

// File is an extra file copied into the image.
type File struct {
	// Src is the host path.
	Src string
	// Dst is the absolute path in the image.
	Dst string
	// Mode is the permission bits; 0 picks 0755 when Src has any execute
	// bit and 0644 otherwise (the build host's exact bits and times never
	// leak into the image).
	Mode fs.FileMode
}

// Spec is what goes into an image.
type Spec struct {
	// Agent is the host path of the static oac-guest binary; it becomes
	// /init.
	Agent string
	// ModulesDir is a kernel's modules directory (/lib/modules/VERSION,
	// with modules.dep); needed only when Modules is not empty.
	ModulesDir string
	// Modules are module names to load at boot; their dependencies are
	// added from modules.dep. Built-in modules are skipped.
	Modules []string
	// Files are extra files (a daemon, oac-sandbox-io, a CA bundle).
	Files []File
}

// Summary describes a built image.
type Summary struct {
	// Modules are the module paths in the image, in load order.
	Modules []string
	// Entries is the number of archive members.
	Entries int
}

// Build writes the gzip-compressed newc archive of spec to w. The same
// spec and the same input bytes give the same output bytes: members are
// sorted, times, inode and device numbers fixed, and the gzip header
// carries no name and no time.
func Build(spec Spec, w io.Writer) (Summary, error) {
	entries, sum, err := Entries(spec)
	if err != nil {
		return sum, err
	}
	zw, err := gzip.NewWriterLevel(w, gzip.BestCompression)
	if err != nil {
		return sum, err
	}
	cw := NewCpioWriter(zw)
	for _, e := range entries {
		if err := cw.WriteEntry(e); err != nil {
			return sum, err
		}
	}
	if err := cw.Close(); err != nil {
		return sum, err
	}
	if err := zw.Close(); err != nil {
		return sum, fmt.Errorf("compress initramfs: %w", err)
	}
	return sum, nil
}

// Entries returns the archive members of spec in the order Build writes
// them.
func Entries(spec Spec) ([]Entry, Summary, error) {
	var sum Summary
	t := tree{m: map[string]Entry{}}
	dir := func(name string, mode fs.FileMode, uid, gid int) {
		t.m[name] = Entry{Name: name, Mode: fs.ModeDir | mode, UID: uid, GID: gid}
	}
	for _, d := range []string{"dev", "etc", "etc/oac", "home", "proc", "sys", "run"} {
		dir(d, 0o755, 0, 0)
	}
	dir("tmp", 0o777|fs.ModeSticky, 0, 0)
	dir("root", 0o700, 0, 0)
	dir(strings.TrimPrefix(RuntimeHome, "/"), 0o700, RuntimeUID, RuntimeGID)
	t.m["dev/console"] = Entry{Name: "dev/console", Mode: fs.ModeDevice | fs.ModeCharDevice | 0o600, RdevMajor: 5, RdevMinor: 1}
	for name, content := range map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\n" +
			fmt.Sprintf("runtime:x:%d:%d:runtime:%s:/bin/sh\n", RuntimeUID, RuntimeGID, RuntimeHome) +
			"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
		"etc/group":       fmt.Sprintf("root:x:0:\nruntime:x:%d:\nnogroup:x:65534:\n", RuntimeGID),
		"etc/hosts":       "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
		"etc/resolv.conf": protocol.ResolvConf,
	} {
		t.m[name] = Entry{Name: name, Mode: 0o644, Data: []byte(content)}
	}

	if spec.Agent == "" {
		return nil, sum, fmt.Errorf("no agent binary: pass the static oac-guest (make build puts it in bin/)")
	}
	agent, err := os.ReadFile(spec.Agent)
	if err != nil {
		return nil, sum, fmt.Errorf("read agent: %w (make build puts oac-guest in bin/)", err)
	}
	t.m[strings.TrimPrefix(InitPath, "/")] = Entry{Name: strings.TrimPrefix(InitPath, "/"), Mode: 0o755, Data: agent}

	if len(spec.Modules) > 0 {
		if spec.ModulesDir == "" {
			return nil, sum, fmt.Errorf("modules requested but no kernel modules directory given (make kernel caches one in .cache/kernel/modules)")
		}
		md, builtin, err := LoadModuleTree(spec.ModulesDir)
		if err != nil {
			return nil, sum, err
		}
		files, err := md.Resolve(spec.Modules, builtin)
		if err != nil {
			return nil, sum, err
		}
		// The tree's real directory name is the kernel version (the
		// kernel cache links "modules" to lib/modules/VERSION).
		real, err := filepath.EvalSymlinks(spec.ModulesDir)
		if err != nil {
			return nil, sum, fmt.Errorf("kernel modules directory: %w", err)
		}
		version := filepath.Base(real)
		var list strings.Builder
		for _, f := range files {
			data, out, err := ReadModule(spec.ModulesDir, f)
			if err != nil {
				return nil, sum, err
			}
			name := path.Join("lib/modules", version, out)
			if err := t.addFile(Entry{Name: name, Mode: 0o644, Data: data}); err != nil {
				return nil, sum, err
			}
			list.WriteString("/" + name + "\n")
			sum.Modules = append(sum.Modules, "/"+name)
		}
		t.m[strings.TrimPrefix(ModuleListPath, "/")] = Entry{Name: strings.TrimPrefix(ModuleListPath, "/"), Mode: 0o644, Data: []byte(list.String())}
	}

	for _, f := range spec.Files {
		if !path.IsAbs(f.Dst) || path.Clean(f.Dst) != f.Dst || f.Dst == "/" {
			return nil, sum, fmt.Errorf("extra file destination %q must be an absolute clean path", f.Dst)
		}
		st, err := os.Stat(f.Src)
		if err != nil {
			return nil, sum, fmt.Errorf("extra file: %w", err)
		}
		if !st.Mode().IsRegular() {
			return nil, sum, fmt.Errorf("extra file %s is not a regular file", f.Src)
		}
		data, err := os.ReadFile(f.Src)
		if err != nil {
			return nil, sum, fmt.Errorf("extra file: %w", err)
		}
		mode := f.Mode.Perm()
		if mode == 0 {
			mode = 0o644
			if st.Mode().Perm()&0o111 != 0 {
				mode = 0o755
			}
		}
		if err := t.addFile(Entry{Name: strings.TrimPrefix(f.Dst, "/"), Mode: mode, Data: data}); err != nil {
			return nil, sum, err
		}
	}

	names := sortedKeys(t.m)
	out := make([]Entry, 0, len(names)+1)
	// The root comes first: its mode (0755) lets the runtime user, whose
	// ids are not root's, traverse it and exec what lies below.
	out = append(out, Entry{Name: ".", Mode: fs.ModeDir | 0o755})
	for _, n := range names {
		out = append(out, t.m[n])
	}
	sum.Entries = len(out)
	return out, sum, nil
}

// tree holds the image's members by name.
type tree struct{ m map[string]Entry }

// addFile adds a regular file and any missing parent directories (0755,
// root-owned). A name that is already taken is an error naming it.
func (t tree) addFile(e Entry) error {
	if prev, ok := t.m[e.Name]; ok {
		what := "a file"
		if prev.Mode.IsDir() {
			what = "a directory"
		}
		return fmt.Errorf("/%s is already %s in the image; pick another destination", e.Name, what)
	}
	for d := path.Dir(e.Name); d != "."; d = path.Dir(d) {
		if prev, ok := t.m[d]; ok {
			if !prev.Mode.IsDir() {
				return fmt.Errorf("/%s is a file in the image, so /%s cannot go below it", d, e.Name)
			}
			continue
		}
		t.m[d] = Entry{Name: d, Mode: fs.ModeDir | 0o755}
	}
	t.m[e.Name] = e
	return nil
}

// WriteOverlay writes a gzip-compressed newc archive holding only files
// (and their parent directories, 0755, root-owned) to w: appended to an
// initramfs, it adds those files to what the kernel unpacks, or replaces
// files of the same name, because the kernel unpacks concatenated
// archives in order. The archive must start at an offset that is a
// multiple of 4 (ComposeOverlay pads). Same inputs give the same bytes.
func WriteOverlay(w io.Writer, files []File) error {
	t := tree{m: map[string]Entry{}}
	for _, f := range files {
		if !path.IsAbs(f.Dst) || path.Clean(f.Dst) != f.Dst || f.Dst == "/" {
			return fmt.Errorf("overlay file destination %q must be an absolute clean path", f.Dst)
		}
		data, err := os.ReadFile(f.Src)
		if err != nil {
			return fmt.Errorf("overlay file: %w", err)
		}
		mode := f.Mode.Perm()
		if mode == 0 {
			mode = 0o755
		}
		if err := t.addFile(Entry{Name: strings.TrimPrefix(f.Dst, "/"), Mode: mode, Data: data}); err != nil {
			return err
		}
	}
	zw, err := gzip.NewWriterLevel(w, gzip.BestSpeed)
	if err != nil {
		return err
	}
	cw := NewCpioWriter(zw)
	for _, n := range sortedKeys(t.m) {
		if err := cw.WriteEntry(t.m[n]); err != nil {
			return err
		}
	}
	if err := cw.Close(); err != nil {
		return err
	}
	return zw.Close()
}

// ComposeOverlay writes base (an initramfs file) followed by an overlay
// archive of files to out: the initramfs a VM boots when the host installs
// binaries for one start. The base is padded with zeros to a multiple of 4
// bytes, which the kernel skips between archives.
func ComposeOverlay(base, out string, files []File) error {
	in, err := os.Open(base)
	if err != nil {
		return fmt.Errorf("compose initramfs: %w", err)
	}
	defer in.Close()
	f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("compose initramfs: %w", err)
	}
	n, err := io.Copy(f, in)
	if err == nil {
		_, err = f.Write(make([]byte, (4-n%4)%4))
	}
	if err == nil {
		err = WriteOverlay(f, files)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(out)
		return fmt.Errorf("compose initramfs %s: %w", out, err)
	}
	return nil
}
