package release

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
)

const (
	testVersion = "v0.0.0-test"
	testCommit  = "0123456789abcdef0123456789abcdef01234567"
	testTime    = 1700000000
)

// The targets the test builds: a subset of All (the whole release is
// make release's, minutes on two cores), one of each kind: the shim that
// runs here, the kubernetes shim (client-go in its SBOM), the static guest
// and a Windows zip.
var testTargets = []string{"oac-shim/linux/amd64", "oac-shim-kubernetes/linux/amd64", "oac-guest/linux/amd64", "oac-image/windows/amd64"}

// Two release builds of one source tree, from different directories, with
// different umasks, time zones and source file times, are byte for byte
// the same; their sums verify; the binaries say the release's version and
// commit; each SBOM lists the modules linked into its binary with the
// versions go.mod selects.
func TestReleaseIsReproducible(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	tmp := t.TempDir()

	tool := filepath.Join(tmp, "oac-release")
	build := exec.CommandContext(ctx, "go", "build", "-o", tool, "./cmd/oac-release")
	build.Dir = root
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)
	cdx := filepath.Join(tmp, "cyclonedx-gomod")
	require.NoError(t, BuildCycloneDX(ctx, "", filepath.Join(root, "tools", "sbom"), cdx))

	type builder struct{ dir, tz, umask string }
	builders := []builder{
		{filepath.Join(tmp, "a", "src"), "UTC", "022"},
		{filepath.Join(tmp, "b", "deeper", "checkout"), "Asia/Kathmandu", "077"},
	}
	for i, b := range builders {
		require.NoError(t, copyTree(root, b.dir))
		if i == 1 { // another clock: every source file dated 2001
			old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
			require.NoError(t, filepath.WalkDir(b.dir, func(p string, _ os.DirEntry, err error) error {
				if err != nil {
					return err
				}
				return os.Chtimes(p, old, old)
			}))
		}
		cmd := exec.CommandContext(ctx, "sh", "-c", `umask "$0" && exec "$@"`, b.umask, tool,
			"-version", testVersion, "-commit", testCommit, "-commit-time", "1700000000", "-modified", "false",
			"-only", strings.Join(testTargets, ","), "-cyclonedx-gomod", cdx, "-out", "dist")
		cmd.Dir = b.dir
		cmd.Env = append(os.Environ(), "TZ="+b.tz)
		start := time.Now()
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "release build in %s: %s", b.dir, out)
		t.Logf("release build %d (%d targets): %v", i+1, len(testTargets), time.Since(start).Round(time.Millisecond))
	}

	distA, distB := filepath.Join(builders[0].dir, "dist"), filepath.Join(builders[1].dir, "dist")
	var want []string
	for _, s := range testTargets {
		tg, err := ParseTarget(s)
		require.NoError(t, err)
		want = append(want, ArchiveName(tg, testVersion), ArchiveName(tg, testVersion)+".cdx.json")
	}
	want = append(want, "SHA256SUMS")
	sort.Strings(want)
	require.Equal(t, want, names(t, distA), "what dist/ holds: the archives, their SBOMs and the sums, nothing else")
	require.Equal(t, want, names(t, distB))
	for _, n := range want {
		a, err := os.ReadFile(filepath.Join(distA, n))
		require.NoError(t, err)
		b, err := os.ReadFile(filepath.Join(distB, n))
		require.NoError(t, err)
		assert.True(t, bytes.Equal(a, b), "%s differs between the two builds", n)
	}

	t.Run("sums", func(t *testing.T) {
		sums, err := os.ReadFile(filepath.Join(distA, "SHA256SUMS"))
		require.NoError(t, err)
		lines := strings.Split(strings.TrimSuffix(string(sums), "\n"), "\n")
		require.Len(t, lines, len(want)-1, "a sum for every file but SHA256SUMS")
		for _, l := range lines {
			sum, name, ok := strings.Cut(l, "  ")
			require.True(t, ok, "%q: the form sha256sum -c reads", l)
			data, err := os.ReadFile(filepath.Join(distA, name))
			require.NoError(t, err)
			got := sha256.Sum256(data)
			assert.Equal(t, hex.EncodeToString(got[:]), sum, name)
		}
	})

	t.Run("archives", func(t *testing.T) {
		for _, s := range testTargets {
			tg, _ := ParseTarget(s)
			name := ArchiveName(tg, testVersion)
			dir := strings.TrimSuffix(strings.TrimSuffix(name, ".tar.gz"), ".zip") + "/"
			files := readArchive(t, filepath.Join(distA, name))
			var got []string
			for n, f := range files {
				got = append(got, n)
				assert.Equal(t, int64(testTime), f.mtime.Unix(), "%s: %s's time is the commit's", name, n)
				if n == dir+BinaryName(tg) {
					assert.Equal(t, int64(0o755), f.mode, "%s: %s", name, n)
				} else if !strings.HasSuffix(n, "/") {
					assert.Equal(t, int64(0o644), f.mode, "%s: %s", name, n)
				}
			}
			sort.Strings(got)
			wantFiles := []string{dir + "LICENSE", dir + "LICENSE.yamux", dir + "NOTICE", dir + "README.md", dir + BinaryName(tg)}
			if tg.GOOS != "windows" {
				wantFiles = append(wantFiles, dir)
			}
			sort.Strings(wantFiles)
			assert.Equal(t, wantFiles, got, name)
			lic, err := os.ReadFile(filepath.Join(root, "LICENSE"))
			require.NoError(t, err)
			assert.Equal(t, lic, files[dir+"LICENSE"].data)
			assert.Contains(t, string(files[dir+"LICENSE.yamux"].data), "Mozilla Public License, version 2.0")
		}
	})

	t.Run("versions", func(t *testing.T) {
		for _, p := range []string{"oac-shim", "oac-shim-kubernetes", "oac-guest"} {
			tg := Target{p, "linux", "amd64"}
			name := ArchiveName(tg, testVersion)
			dir := strings.TrimSuffix(name, ".tar.gz") + "/"
			exe := filepath.Join(tmp, p)
			require.NoError(t, os.WriteFile(exe, readArchive(t, filepath.Join(distA, name))[dir+p].data, 0o755))
			out, err := exec.CommandContext(ctx, exe, "--version").Output()
			require.NoError(t, err, p)
			program := strings.TrimSuffix(p, "-kubernetes")
			assert.Regexp(t, `^`+program+` v0\.0\.0-test \(protocol \d+\.\.\d+, commit `+testCommit+`\)\n$`, string(out))
			out, err = exec.CommandContext(ctx, exe, "version", "--json").Output()
			require.NoError(t, err, p)
			var v api.VersionReport
			require.NoError(t, json.Unmarshal(out, &v), "%s", out)
			assert.Equal(t, testVersion, v.Version)
			assert.Equal(t, testCommit, v.Commit)
			assert.False(t, v.Modified)
		}
	})

	t.Run("sboms", func(t *testing.T) {
		gomod := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Path}} {{.Version}}", "golang.org/x/sys", "k8s.io/client-go")
		gomod.Dir = root
		out, err := gomod.Output()
		require.NoError(t, err)
		selected := map[string]string{}
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			p, v, _ := strings.Cut(l, " ")
			selected[p] = v
		}
		for _, s := range testTargets {
			tg, _ := ParseTarget(s)
			var bom struct {
				BOMFormat string `json:"bomFormat"`
				Metadata  struct {
					Component struct{ Name, Version string } `json:"component"`
				} `json:"metadata"`
				Components []struct{ Name, Version string } `json:"components"`
			}
			data, err := os.ReadFile(filepath.Join(distA, ArchiveName(tg, testVersion)+".cdx.json"))
			require.NoError(t, err)
			require.NoError(t, json.Unmarshal(data, &bom))
			assert.Equal(t, "CycloneDX", bom.BOMFormat)
			assert.Equal(t, "github.com/oac/sandbox-agent", bom.Metadata.Component.Name)
			assert.Equal(t, testVersion, bom.Metadata.Component.Version, "the SBOM names the release")
			deps := map[string]string{}
			for _, c := range bom.Components {
				deps[c.Name] = c.Version
			}
			assert.Equal(t, selected["golang.org/x/sys"], deps["golang.org/x/sys"], "%s links golang.org/x/sys", s)
			if tg.Program == "oac-shim-kubernetes" {
				assert.Equal(t, selected["k8s.io/client-go"], deps["k8s.io/client-go"], s)
			} else {
				assert.NotContains(t, deps, "k8s.io/client-go", "%s: client-go is the kubernetes shim's alone", s)
			}
		}
	})
}

func names(t *testing.T, dir string) []string {
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	var n []string
	for _, e := range ents {
		n = append(n, e.Name())
	}
	return n
}

type file struct {
	data  []byte
	mode  int64
	mtime time.Time
}

// readArchive reads a .tar.gz (checking owners 0:0) or a .zip.
func readArchive(t *testing.T, path string) map[string]file {
	t.Helper()
	files := map[string]file{}
	if strings.HasSuffix(path, ".zip") {
		zr, err := zip.OpenReader(path)
		require.NoError(t, err)
		defer zr.Close()
		for _, f := range zr.File {
			rc, err := f.Open()
			require.NoError(t, err)
			data, err := io.ReadAll(rc)
			require.NoError(t, err)
			rc.Close()
			files[f.Name] = file{data, int64(f.Mode().Perm()), f.Modified}
		}
		return files
	}
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	gz, err := gzip.NewReader(f)
	require.NoError(t, err)
	assert.True(t, gz.ModTime.IsZero(), "%s: gzip without a timestamp", path)
	assert.Empty(t, gz.Name)
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		require.NoError(t, err)
		assert.Equal(t, 0, h.Uid, "%s: %s", path, h.Name)
		assert.Equal(t, 0, h.Gid, "%s: %s", path, h.Name)
		data, err := io.ReadAll(tr)
		require.NoError(t, err)
		files[h.Name] = file{data, h.Mode, h.ModTime}
	}
}
