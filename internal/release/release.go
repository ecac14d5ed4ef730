package release

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/flate"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// Target is one program built for one platform: one archive.
type Target struct {
	Program, GOOS, GOARCH string
}

func (t Target) String() string { return t.Program + "/" + t.GOOS + "/" + t.GOARCH }

// ParseTarget reads PROGRAM/GOOS/GOARCH.
func ParseTarget(s string) (Target, error) {
	p := strings.Split(s, "/")
	if len(p) != 3 {
		return Target{}, fmt.Errorf("target %q: want PROGRAM/GOOS/GOARCH, as oac-shim/linux/amd64", s)
	}
	t := Target{p[0], p[1], p[2]}
	for _, a := range All {
		if a == t {
			return t, nil
		}
	}
	return Target{}, fmt.Errorf("target %q is not one a release ships (%s)", s, targetList())
}

func targetList() string {
	var s []string
	for _, t := range All {
		s = append(s, t.String())
	}
	return strings.Join(s, ", ")
}

// program is how one shipped program is built.
type program struct {
	pkg  string // the main package
	tags string // build tags
}

// programs are what a release ships. oac-shim-kubernetes is oac-shim with
// the kubernetes provider (client-go doubles the shim's memory, so the
// plain shim goes without it). No test stand-in is ever one of them.
var programs = map[string]program{
	"oac-shim":            {pkg: "./cmd/oac-shim"},
	"oac-shim-kubernetes": {pkg: "./cmd/oac-shim", tags: "kubernetes"},
	"oac-guest":           {pkg: "./cmd/oac-guest"},
	"oac-image":           {pkg: "./cmd/oac-image"},
}

// All is every target of a release. The darwin oac-shim is missing on
// purpose: its only provider, vz, needs cgo, so it is built and signed on
// a macOS runner by the release workflow, never from a cgo-less build.
var All = []Target{
	{"oac-shim", "linux", "amd64"},
	{"oac-shim", "linux", "arm64"},
	{"oac-shim", "windows", "amd64"},
	{"oac-shim-kubernetes", "linux", "amd64"},
	{"oac-shim-kubernetes", "linux", "arm64"},
	{"oac-guest", "linux", "amd64"},
	{"oac-guest", "linux", "arm64"},
	{"oac-image", "linux", "amd64"},
	{"oac-image", "linux", "arm64"},
	{"oac-image", "darwin", "amd64"},
	{"oac-image", "darwin", "arm64"},
	{"oac-image", "windows", "amd64"},
}

// Docs are the files every archive carries beside the binary: the name in
// the archive and the path in the source tree.
var Docs = [][2]string{
	{"LICENSE", "LICENSE"},
	{"LICENSE.yamux", "internal/yamux/LICENSE"},
	{"NOTICE", "NOTICE"},
	{"README.md", "README.md"},
}

// Options say what to build.
type Options struct {
	// Version is the release, vX.Y.Z (with an optional -suffix).
	Version string
	// Commit is the full commit hash and Modified whether the tree had
	// changes beyond it: stamped into every binary.
	Commit   string
	Modified bool
	// Time is every archive entry's modification time: the commit's.
	Time time.Time
	// Source is the module's root; Out the directory written (it must not
	// exist or be empty).
	Source, Out string
	// Targets to build; empty: All.
	Targets []Target
	// Go is the go command ("go" when empty).
	Go string
	// SBOM, when set, writes the SBOM of the binary of t, built from the
	// module at moduleDir, to path (see CycloneDX).
	SBOM func(ctx context.Context, t Target, moduleDir, path string) error
	// Log gets one line per step (nil: none).
	Log io.Writer
}

var versionRE = regexp.MustCompile(`^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$`)
var commitRE = regexp.MustCompile(`^[0-9a-f]{40}([0-9a-f]{24})?$`)

// ArchiveName is the file name of t's archive for version.
func ArchiveName(t Target, version string) string {
	ext := ".tar.gz"
	if t.GOOS == "windows" {
		ext = ".zip"
	}
	return t.Program + "_" + version + "_" + t.GOOS + "_" + t.GOARCH + ext
}

// BinaryName is the program's file name on t's OS.
func BinaryName(t Target) string {
	if t.GOOS == "windows" {
		return t.Program + ".exe"
	}
	return t.Program
}

// Build writes the release into o.Out: one archive per target, its SBOM
// when o.SBOM is set, and SHA256SUMS.
func Build(ctx context.Context, o Options) error {
	if !versionRE.MatchString(o.Version) {
		return fmt.Errorf("release version %q: give vX.Y.Z (optionally vX.Y.Z-suffix), as VERSION=v1.2.3", o.Version)
	}
	if !commitRE.MatchString(o.Commit) {
		return fmt.Errorf("commit %q is not a full commit hash: run in a git checkout or pass the commit", o.Commit)
	}
	if o.Time.IsZero() {
		return errors.New("no commit time: run in a git checkout or pass the commit's time")
	}
	if o.Go == "" {
		o.Go = "go"
	}
	targets := o.Targets
	if len(targets) == 0 {
		targets = All
	}
	if ents, err := os.ReadDir(o.Out); err == nil && len(ents) > 0 {
		return fmt.Errorf("release output %s is not empty: remove it first (make release does)", o.Out)
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return fmt.Errorf("release output: %w", err)
	}
	docs := make(map[string][]byte, len(Docs))
	for _, d := range Docs {
		b, err := os.ReadFile(filepath.Join(o.Source, d[1]))
		if err != nil {
			return fmt.Errorf("release: every archive carries %s: %w", d[1], err)
		}
		docs[d[0]] = b
	}
	stage, err := os.MkdirTemp("", "oac-release-")
	if err != nil {
		return fmt.Errorf("release staging directory: %w", err)
	}
	defer os.RemoveAll(stage)
	module := filepath.Join(stage, "module")
	if o.SBOM != nil {
		if err := taggedCopy(ctx, o.Source, module, o.Version, o.Time); err != nil {
			return fmt.Errorf("release: %w", err)
		}
	}

	for _, t := range targets {
		bin := filepath.Join(stage, t.Program+"_"+t.GOOS+"_"+t.GOARCH, BinaryName(t))
		if err := o.build(ctx, t, bin); err != nil {
			return err
		}
		exe, err := os.ReadFile(bin)
		if err != nil {
			return fmt.Errorf("release: read the built %s: %w", t, err)
		}
		name := ArchiveName(t, o.Version)
		root := strings.TrimSuffix(strings.TrimSuffix(name, ".tar.gz"), ".zip")
		files := []entry{{root + "/" + BinaryName(t), exe, 0o755}}
		for _, d := range Docs {
			files = append(files, entry{root + "/" + d[0], docs[d[0]], 0o644})
		}
		var ab []byte
		if t.GOOS == "windows" {
			ab, err = zipArchive(files, o.Time)
		} else {
			ab, err = tarGz(files, o.Time)
		}
		if err != nil {
			return fmt.Errorf("release: archive %s: %w", name, err)
		}
		if err := os.WriteFile(filepath.Join(o.Out, name), ab, 0o644); err != nil {
			return fmt.Errorf("release: write %s: %w", name, err)
		}
		o.logf("%s", name)
		if o.SBOM != nil {
			sb := filepath.Join(o.Out, name+".cdx.json")
			if err := o.SBOM(ctx, t, module, sb); err != nil {
				return fmt.Errorf("release: SBOM of %s: %w", t, err)
			}
			o.logf("%s", filepath.Base(sb))
		}
	}
	if err := WriteSums(o.Out); err != nil {
		return err
	}
	o.logf("SHA256SUMS")
	return nil
}

func (o Options) logf(format string, a ...any) {
	if o.Log != nil {
		fmt.Fprintf(o.Log, format+"\n", a...)
	}
}

// Env is the build environment of t: no cgo, the baseline instruction
// set, and no GOFLAGS of the caller's, so that nothing of the builder's
// machine reaches the bytes.
func Env(t Target) []string {
	var env []string
	for _, kv := range os.Environ() {
		switch k, _, _ := strings.Cut(kv, "="); k {
		case "CGO_ENABLED", "GOOS", "GOARCH", "GOFLAGS", "GOAMD64", "GOARM64", "GOEXPERIMENT", "GOTOOLCHAIN":
		default:
			env = append(env, kv)
		}
	}
	return append(env, "CGO_ENABLED=0", "GOOS="+t.GOOS, "GOARCH="+t.GOARCH, "GOFLAGS=-mod=readonly",
		"GOAMD64=v1", "GOARM64=v8.0", "GOTOOLCHAIN=local")
}

const buildinfoPkg = "github.com/oac/sandbox-agent/internal/buildinfo"

func (o Options) build(ctx context.Context, t Target, out string) error {
	p, ok := programs[t.Program]
	if !ok {
		return fmt.Errorf("release: no program %q", t.Program)
	}
	ldflags := fmt.Sprintf("-s -w -X %[1]s.Version=%[2]s -X %[1]s.Commit=%[3]s -X %[1]s.Modified=%[4]t",
		buildinfoPkg, o.Version, o.Commit, o.Modified)
	args := []string{"build", "-trimpath", "-buildvcs=false", "-ldflags", ldflags, "-o", out}
	if p.tags != "" {
		args = append(args, "-tags", p.tags)
	}
	args = append(args, p.pkg)
	cmd := exec.CommandContext(ctx, o.Go, args...)
	cmd.Dir, cmd.Env = o.Source, Env(t)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("release: build %s: %w\n%s", t, err, stderr.Bytes())
	}
	return nil
}

type entry struct {
	name string
	data []byte
	mode int64
}

// tarGz is a gzipped tar of files in name order, owned by 0:0, all with
// time mtime, with no gzip name or timestamp.
func tarGz(files []entry, mtime time.Time) ([]byte, error) {
	sort.Slice(files, func(i, j int) bool { return files[i].name < files[j].name })
	var buf bytes.Buffer
	gz, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	tw := tar.NewWriter(gz)
	dirs := map[string]bool{}
	for _, f := range files {
		if d := filepath.ToSlash(filepath.Dir(f.name)); d != "." && !dirs[d] {
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: mtime.UTC(), Format: tar.FormatUSTAR}); err != nil {
				return nil, err
			}
		}
		h := &tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: f.mode, Size: int64(len(f.data)), ModTime: mtime.UTC(), Format: tar.FormatUSTAR}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := gz.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// zipArchive is a zip of files in name order, all with time mtime (in UTC,
// so the builder's time zone does not reach the DOS time fields).
func zipArchive(files []entry, mtime time.Time) ([]byte, error) {
	sort.Slice(files, func(i, j int) bool { return files[i].name < files[j].name })
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	zw.RegisterCompressor(zip.Deflate, func(w io.Writer) (io.WriteCloser, error) {
		return flate.NewWriter(w, flate.BestCompression)
	})
	for _, f := range files {
		h := &zip.FileHeader{Name: f.name, Method: zip.Deflate, Modified: mtime.UTC()}
		h.SetMode(os.FileMode(f.mode))
		w, err := zw.CreateHeader(h)
		if err != nil {
			return nil, err
		}
		if _, err := w.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// WriteSums writes dir/SHA256SUMS: every other file of dir, sorted by
// name, in the form sha256sum -c reads.
func WriteSums(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("release sums: %w", err)
	}
	var b strings.Builder
	for _, e := range ents { // ReadDir sorts by name
		if e.IsDir() || e.Name() == "SHA256SUMS" {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return fmt.Errorf("release sums: %w", err)
		}
		sum := sha256.Sum256(data)
		fmt.Fprintf(&b, "%s  %s\n", hex.EncodeToString(sum[:]), e.Name())
	}
	if err := os.WriteFile(filepath.Join(dir, "SHA256SUMS"), []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("release sums: %w", err)
	}
	return nil
}
