package imagebuild

import (
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/oac/sandbox-agent/initramfs"
	"github.com/oac/sandbox-agent/manifest"
)

// Output kinds.
const (
	OutDir   = "dir"   // rootfs/: a directory for bwrap --rootfs
	OutTar   = "tar"   // rootfs.tar.gz: for wsl --import
	OutExt4  = "ext4"  // disk.ext4: raw ext4 disk image
	OutErofs = "erofs" // disk.erofs: raw erofs disk image (lz4hc)
	OutOCI   = "oci"   // oci/: an OCI image layout
	OutE2B   = "e2b"   // e2b/: an E2B template build context
	OutVM    = "vm"    // vmlinuz and initramfs.img for qemu and macOS
	// OutWSLInstaller is the copied WSL installer (Spec.WSLInstaller); it
	// is not a kind of image and not in AllOutputs.
	OutWSLInstaller = "wsl-installer"
)

// AllOutputs lists every output kind in build order.
var AllOutputs = []string{OutDir, OutTar, OutOCI, OutE2B, OutExt4, OutErofs, OutVM}

// File names in the output directory.
const (
	DirName       = "rootfs"
	TarName       = "rootfs.tar.gz"
	Ext4Name      = "disk.ext4"
	ErofsName     = "disk.erofs"
	OCIName       = "oci"
	E2BName       = "e2b"
	KernelName    = "vmlinuz"
	InitramfsName = "initramfs.img"
	SumsName      = "SHA256SUMS"
	ManifestName  = "manifest.json"

	// E2BDockerfileName is the Dockerfile in E2BName, beside a TarName.
	E2BDockerfileName = "e2b.Dockerfile"
)

// Spec is one build.
type Spec struct {
	// Base is a base rootfs: a directory, or a tar or tar.gz file. Empty
	// starts from an empty root (the injected parts only).
	Base string
	Injection
	// Epoch is every timestamp in the outputs (SOURCE_DATE_EPOCH).
	Epoch int64
	// Arch is the image's architecture (amd64 or arm64; default: this
	// build host's).
	Arch string
	// Outputs are the output kinds to build (default AllOutputs).
	Outputs []string
	// Out is the output directory; it must not exist or be empty.
	Out string
	// Kernel and ModulesDir feed the vm output: the kernel image copied
	// to vmlinuz and the modules directory (with modules.dep) the
	// initramfs's modules come from.
	Kernel, ModulesDir string
	// Modules are the initramfs's modules (default
	// initramfs.DefaultModules).
	Modules []string
	// InitramfsFiles are extra files for the initramfs (a VM guest without
	// switch_root runs from it).
	InitramfsFiles []initramfs.File
	// Ref tags the OCI image (default "latest").
	Ref string
	// BaseURL, when set, makes the build write manifest.json pinning its
	// file outputs at BaseURL + file name; Release names it.
	BaseURL, Release string
	// MirrorURLs are more base URLs serving the same files: each pinned
	// artifact lists MIRROR + file name under mirrors, in this order (at
	// most manifest.MaxMirrors).
	MirrorURLs []string
	// WSLInstaller, when set, is the mirrored WSL installer (an MSI): it
	// is copied into the output under its own name, listed in SHA256SUMS
	// and pinned in the manifest (kind wsl-installer, for windows), where
	// the WSL provider finds it.
	WSLInstaller string
	// WSLInstall, when set, is pinned with the installer: its msiexec
	// arguments and whether Windows must restart after (without it the
	// manifest says nothing and readers assume manifest.DefaultInstall).
	WSLInstall *manifest.Install
	// WorkDir holds temporary files (default: the system's).
	WorkDir string
	// Log gets one line per output (nil: none).
	Log io.Writer
}

// Output is one built output.
type Output struct {
	Kind string
	// Path is the file or directory.
	Path string
	// Size is the file's size, or the total size of a directory's files.
	Size int64
	// SHA256 is the file's digest, or DirDigest of a directory (for the
	// OCI layout: of the layout directory).
	SHA256   string
	Duration time.Duration
}

// Result is a finished build.
type Result struct {
	Outputs []Output
	// Entries is the number of entries in the image tree.
	Entries int
	// TreeDigest identifies the tree's content (it seeds the filesystem
	// UUIDs).
	TreeDigest string
}

// Build runs spec: loads the base, injects, writes every requested
// output, SHA256SUMS and, with BaseURL, manifest.json. On error the
// outputs written so far are removed.
func Build(spec Spec) (res *Result, err error) {
	if spec.Out == "" {
		return nil, errors.New("no output directory given")
	}
	if spec.Arch == "" {
		spec.Arch = runtime.GOARCH
	}
	if spec.Arch != "amd64" && spec.Arch != "arm64" {
		return nil, fmt.Errorf("arch %q: want amd64 or arm64", spec.Arch)
	}
	if spec.Epoch < 0 {
		return nil, errors.New("the epoch must not be negative")
	}
	if spec.Ref == "" {
		spec.Ref = "latest"
	}
	outs := spec.Outputs
	if len(outs) == 0 {
		outs = AllOutputs
	}
	want := map[string]bool{}
	for _, o := range outs {
		if !contains(AllOutputs, o) {
			return nil, fmt.Errorf("unknown output %q (have %s)", o, strings.Join(AllOutputs, ", "))
		}
		want[o] = true
	}
	if want[OutVM] && (spec.Kernel == "" || spec.ModulesDir == "") {
		return nil, errors.New("the vm output needs a kernel and its modules directory (make kernel caches Debian's in .cache/kernel)")
	}
	if err := checkArch(spec, want[OutVM]); err != nil {
		return nil, err
	}
	if spec.BaseURL != "" && spec.Release == "" {
		return nil, errors.New("a manifest (base URL given) needs a release name")
	}
	// Said before building: a manifest of no artifacts is invalid.
	if spec.BaseURL != "" && !want[OutTar] && !want[OutExt4] && !want[OutErofs] && !want[OutVM] && spec.WSLInstaller == "" {
		return nil, errors.New("a manifest (base URL given) pins tar, ext4, erofs, vm or the WSL installer, and none is built (oci and e2b are not pinned)")
	}
	if err := checkPins(spec); err != nil {
		return nil, err
	}
	if w := spec.WSLInstaller; w != "" {
		if st, err := os.Stat(w); err != nil || !st.Mode().IsRegular() {
			return nil, fmt.Errorf("wsl installer %s is not a readable file", w)
		}
		if name := filepath.Base(w); !safeName.MatchString(name) || contains(reservedNames, name) {
			return nil, fmt.Errorf("wsl installer %s: its file name must be 1 to 128 of A-Z, a-z, 0-9, '.', '_', '-' and not one of the image's own", w)
		}
	}
	if err := emptyDir(spec.Out); err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp(spec.WorkDir, "oac-image-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	var made []string
	defer func() {
		if err != nil {
			for _, p := range made {
				os.RemoveAll(p)
			}
		}
	}()
	epoch := time.Unix(spec.Epoch, 0).UTC()

	t, err := loadBase(spec.Base, work)
	if err != nil {
		return nil, err
	}
	if err := Inject(t, spec.Injection); err != nil {
		return nil, err
	}
	t.normalizeLinks()
	res = &Result{Entries: t.Len()}
	logf := func(o Output) {
		if spec.Log != nil {
			fmt.Fprintf(spec.Log, "oac-image: %-5s %-22s %11d bytes  sha256 %s  %s\n", o.Kind, rel(spec.Out, o.Path), o.Size, o.SHA256[:16], o.Duration.Round(time.Millisecond))
		}
	}
	add := func(kind, p string, start time.Time) error {
		o := Output{Kind: kind, Path: p, Duration: time.Since(start)}
		st, err := os.Stat(p)
		if err != nil {
			return err
		}
		if st.IsDir() {
			o.SHA256, err = DirDigest(p)
			o.Size = dirSize(p)
		} else {
			o.Size = st.Size()
			o.SHA256, err = fileDigest(p)
		}
		if err != nil {
			return err
		}
		o.Duration = time.Since(start)
		res.Outputs = append(res.Outputs, o)
		logf(o)
		return nil
	}

	// The tar stream first: its digest identifies the tree (and seeds the
	// filesystem UUIDs), and it is the OCI layer.
	start := time.Now()
	layer, err := writeTarGz(t, epoch, filepath.Join(work, "layer.tar.gz"))
	if err != nil {
		return nil, err
	}
	res.TreeDigest = strings.TrimPrefix(layer.diffID, "sha256:")
	tarTime := time.Since(start)

	staging := ""
	if want[OutDir] || want[OutExt4] || want[OutErofs] {
		start := time.Now()
		staging = filepath.Join(work, "staging")
		if want[OutDir] {
			staging = filepath.Join(spec.Out, DirName)
			made = append(made, staging)
		}
		if err := Materialize(t, epoch, staging); err != nil {
			return nil, fmt.Errorf("%w (owners other than yours need root)", err)
		}
		if want[OutDir] {
			if err := add(OutDir, staging, start); err != nil {
				return nil, err
			}
		}
	}
	if want[OutTar] {
		start := time.Now().Add(-tarTime)
		p := filepath.Join(spec.Out, TarName)
		made = append(made, p)
		if err := copyFile(layer.path, p); err != nil {
			return nil, err
		}
		if err := add(OutTar, p, start); err != nil {
			return nil, err
		}
	}
	if want[OutOCI] {
		start := time.Now()
		p := filepath.Join(spec.Out, OCIName)
		made = append(made, p)
		if err := writeOCILayout(p, layer, spec.Arch, spec.Ref, epoch); err != nil {
			return nil, fmt.Errorf("oci layout: %w", err)
		}
		if err := stampTimes(p, epoch); err != nil {
			return nil, fmt.Errorf("oci layout: %w", err)
		}
		if err := add(OutOCI, p, start); err != nil {
			return nil, err
		}
	}
	if want[OutE2B] {
		start := time.Now()
		p := filepath.Join(spec.Out, E2BName)
		made = append(made, p)
		// The tar output's file when there is one: its bytes, written once.
		src := layer.path
		if want[OutTar] {
			src = filepath.Join(spec.Out, TarName)
		}
		if err := writeE2B(p, src, epoch); err != nil {
			return nil, fmt.Errorf("e2b template: %w", err)
		}
		if err := add(OutE2B, p, start); err != nil {
			return nil, err
		}
	}
	if want[OutExt4] {
		start := time.Now()
		p := filepath.Join(spec.Out, Ext4Name)
		made = append(made, p)
		if err := buildExt4(t, staging, p, work, epoch, res.TreeDigest); err != nil {
			return nil, fmt.Errorf("ext4 image: %w", err)
		}
		if err := add(OutExt4, p, start); err != nil {
			return nil, err
		}
	}
	if want[OutErofs] {
		start := time.Now()
		p := filepath.Join(spec.Out, ErofsName)
		made = append(made, p)
		if err := buildErofs(staging, p, epoch, res.TreeDigest); err != nil {
			return nil, fmt.Errorf("erofs image: %w", err)
		}
		if err := add(OutErofs, p, start); err != nil {
			return nil, err
		}
	}
	if want[OutVM] {
		start := time.Now()
		kp := filepath.Join(spec.Out, KernelName)
		made = append(made, kp)
		if err := copyFile(spec.Kernel, kp); err != nil {
			return nil, fmt.Errorf("kernel: %w", err)
		}
		if err := add("kernel", kp, start); err != nil {
			return nil, err
		}
		start = time.Now()
		mods := spec.Modules
		if len(mods) == 0 {
			mods = initramfs.DefaultModules
		}
		ip := filepath.Join(spec.Out, InitramfsName)
		made = append(made, ip)
		if err := writeInitramfs(ip, initramfs.Spec{Agent: spec.Agent, ModulesDir: spec.ModulesDir, Modules: mods, Files: spec.InitramfsFiles}); err != nil {
			return nil, fmt.Errorf("initramfs: %w", err)
		}
		if err := add("initramfs", ip, start); err != nil {
			return nil, err
		}
	}
	if spec.WSLInstaller != "" {
		start := time.Now()
		name := filepath.Base(spec.WSLInstaller)
		p := filepath.Join(spec.Out, name)
		made = append(made, p)
		if err := copyFile(spec.WSLInstaller, p); err != nil {
			return nil, fmt.Errorf("wsl installer: %w", err)
		}
		if err := add(OutWSLInstaller, p, start); err != nil {
			return nil, err
		}
	}
	sums := filepath.Join(spec.Out, SumsName)
	made = append(made, sums)
	if err := writeSums(sums, spec.Out, res.Outputs); err != nil {
		return nil, err
	}
	if spec.BaseURL != "" {
		p := filepath.Join(spec.Out, ManifestName)
		made = append(made, p)
		if err := writeManifest(p, spec, res.Outputs); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// checkArch makes sure the binaries (when they are ELF files) and, for the
// vm output, the kernel are built for spec.Arch: an arm64 image with an
// amd64 agent would boot and fail at its first exec.
func checkArch(spec Spec, vm bool) error {
	for _, b := range []struct{ what, path, how string }{
		{"agent", spec.Agent, "make image ARCH=" + spec.Arch + " cross-builds it"},
		{"oac-sandbox-io", spec.SandboxIO, "build it for " + spec.Arch},
	} {
		if b.path == "" {
			continue
		}
		arch, err := initramfs.BinaryArch(b.path)
		if err != nil {
			return fmt.Errorf("%s: %w", b.what, err)
		}
		if arch != "" && arch != spec.Arch {
			return fmt.Errorf("%s %s is an %s binary but the image is for %s (%s)", b.what, b.path, arch, spec.Arch, b.how)
		}
	}
	if vm {
		arch, err := initramfs.KernelArch(spec.Kernel)
		if err != nil {
			return err
		}
		if arch != spec.Arch {
			return fmt.Errorf("kernel %s is for %s but the image is for %s (make kernel ARCH=%s fetches Debian's)", spec.Kernel, arch, spec.Arch, spec.Arch)
		}
	}
	return nil
}

// safeName is a file name the output directory and a URL both take as is.
var safeName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

// reservedNames are the output directory's own names.
var reservedNames = []string{DirName, TarName, Ext4Name, ErofsName, OCIName, E2BName, KernelName, InitramfsName, SumsName, ManifestName, ".", ".."}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func rel(base, p string) string {
	r, err := filepath.Rel(base, p)
	if err != nil {
		return p
	}
	return r
}

// emptyDir makes sure dir exists and is empty.
func emptyDir(dir string) error {
	ents, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return os.MkdirAll(dir, 0o755)
	}
	if err != nil {
		return err
	}
	if len(ents) > 0 {
		return fmt.Errorf("output directory %s is not empty; pick a new one (builds never overwrite)", dir)
	}
	return nil
}

// loadBase reads the base rootfs: a directory, a tar or a tar.gz, or none.
func loadBase(base, work string) (*Tree, error) {
	if base == "" {
		return NewTree(), nil
	}
	st, err := os.Stat(base)
	if err != nil {
		return nil, fmt.Errorf("base rootfs: %w", err)
	}
	if st.IsDir() {
		return LoadDir(base)
	}
	f, err := os.Open(base)
	if err != nil {
		return nil, fmt.Errorf("base rootfs: %w", err)
	}
	defer f.Close()
	blobs := filepath.Join(work, "base")
	if err := os.Mkdir(blobs, 0o700); err != nil {
		return nil, err
	}
	return ReadTar(f, DirSink(blobs), TarLimits{})
}

// writeTarGz writes t as a gzip tar at p and returns its digests: of the
// file (the OCI layer digest) and of the uncompressed tar (the diff_id).
// The gzip header carries no name and no time.
func writeTarGz(t *Tree, epoch time.Time, p string) (ociLayer, error) {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return ociLayer{}, err
	}
	defer f.Close()
	outer := sha256.New()
	cw := &countingWriter{w: io.MultiWriter(f, outer)}
	zw, err := gzip.NewWriterLevel(cw, gzip.DefaultCompression)
	if err != nil {
		return ociLayer{}, err
	}
	inner := sha256.New()
	if err := WriteTar(t, epoch, io.MultiWriter(zw, inner)); err != nil {
		return ociLayer{}, err
	}
	if err := zw.Close(); err != nil {
		return ociLayer{}, err
	}
	if err := f.Close(); err != nil {
		return ociLayer{}, err
	}
	return ociLayer{path: p, size: cw.n,
		digest: "sha256:" + hex.EncodeToString(outer.Sum(nil)),
		diffID: "sha256:" + hex.EncodeToString(inner.Sum(nil))}, nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

func writeInitramfs(p string, spec initramfs.Spec) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := initramfs.Build(spec, f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func fileDigest(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func dirSize(dir string) int64 {
	var n int64
	_ = filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

// writeSums writes "HEX  NAME" lines, sorted by name, that `sha256sum -c`
// checks in the output directory: every file output and every file of the
// OCI layout and the E2B context. The rootfs/ directory is left out (its
// tree is rootfs.tar.gz's, whose line is there; its DirDigest is in the
// build's log).
func writeSums(p, out string, outs []Output) error {
	var lines []string
	for _, o := range outs {
		st, err := os.Stat(o.Path)
		if err != nil {
			return err
		}
		if !st.IsDir() {
			lines = append(lines, o.SHA256+"  "+rel(out, o.Path))
			continue
		}
		if o.Kind != OutOCI && o.Kind != OutE2B {
			continue
		}
		err = filepath.Walk(o.Path, func(p string, fi os.FileInfo, err error) error {
			if err != nil || !fi.Mode().IsRegular() {
				return err
			}
			sum, err := fileDigest(p)
			if err != nil {
				return err
			}
			lines = append(lines, sum+"  "+rel(out, p))
			return nil
		})
		if err != nil {
			return err
		}
	}
	sort.Slice(lines, func(i, j int) bool { return lines[i][66:] < lines[j][66:] })
	return os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o644)
}

// checkPins applies the manifest's rules to the base URL, the mirrors
// and the installer's plan before anything is built.
func checkPins(spec Spec) error {
	if spec.BaseURL == "" {
		if len(spec.MirrorURLs) > 0 {
			return errors.New("mirror URLs go with a base URL (the manifest lists them)")
		}
		return nil
	}
	if spec.WSLInstall != nil && spec.WSLInstaller == "" {
		return errors.New("an installer plan (arguments, restart) goes with the WSL installer")
	}
	probe := manifest.Artifact{Name: "probe", Kind: manifest.KindWSLInstaller, Platform: "windows", Arch: "amd64",
		URL: pinURL(spec.BaseURL, "probe"), Mirrors: mirrorURLs(spec, "probe"), Size: 1, SHA256: strings.Repeat("1", 64), Install: spec.WSLInstall}
	m := &manifest.Manifest{Schema: manifest.SchemaVersion, Release: spec.Release, Artifacts: []manifest.Artifact{probe}}
	if err := m.Validate(); err != nil {
		return fmt.Errorf("the manifest's URLs or installer plan: %w", err)
	}
	return nil
}

func pinURL(base, name string) string { return strings.TrimSuffix(base, "/") + "/" + name }

func mirrorURLs(spec Spec, name string) []string {
	var out []string
	for _, m := range spec.MirrorURLs {
		out = append(out, pinURL(m, name))
	}
	return out
}

// writeManifest pins the build's file outputs: the rootfs tar for
// Windows (wsl --import), the disks, kernel and initramfs for macOS and
// Linux (qemu). The oci and e2b directories are not pinned: no host
// stages them (E2B builds its template from e2b/), and e2b's tarball is
// the pinned rootfs tar's bytes.
func writeManifest(p string, spec Spec, outs []Output) error {
	m := &manifest.Manifest{Schema: manifest.SchemaVersion, Release: spec.Release}
	for _, o := range outs {
		var kind string
		platforms := []string{"darwin", "linux"}
		switch o.Kind {
		case OutTar:
			kind, platforms = manifest.KindRootfsTar, []string{"windows"}
		case OutExt4:
			kind = manifest.KindDiskExt4
		case OutErofs:
			kind = manifest.KindDiskErofs
		case "kernel":
			kind = manifest.KindKernel
		case "initramfs":
			kind = manifest.KindInitramfs
		case OutWSLInstaller:
			kind, platforms = manifest.KindWSLInstaller, []string{"windows"}
		default:
			continue
		}
		for _, pl := range platforms {
			a := manifest.Artifact{
				Name: kind + "-" + pl + "-" + spec.Arch, Kind: kind, Platform: pl, Arch: spec.Arch,
				URL: pinURL(spec.BaseURL, filepath.Base(o.Path)), Mirrors: mirrorURLs(spec, filepath.Base(o.Path)), Size: o.Size, SHA256: o.SHA256,
			}
			if kind == manifest.KindWSLInstaller {
				a.Install = spec.WSLInstall
			}
			m.Artifacts = append(m.Artifacts, a)
		}
	}
	m.Sort()
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if err := manifest.Encode(m, f); err != nil {
		f.Close()
		return fmt.Errorf("manifest: %w", err)
	}
	return f.Close()
}

// stampTimes sets the mtime of dir and everything below it to epoch, so a
// written directory compares equal to another build's.
func stampTimes(dir string, epoch time.Time) error {
	var paths []string
	if err := filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		paths = append(paths, p)
		return err
	}); err != nil {
		return err
	}
	for i := len(paths) - 1; i >= 0; i-- {
		if err := os.Chtimes(paths[i], epoch, epoch); err != nil {
			return err
		}
	}
	return nil
}
