package imagecli

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/internal/cli"
	"github.com/oac/sandbox-agent/manifest"
	"github.com/oac/sandbox-agent/schema"
)

func TestEveryCommandHasHelpOnStdout(t *testing.T) {
	for _, cmd := range [][]string{{"build", "--help"}, {"stage", "--help"}, {"manifest", "--help"}, {"manifest", "verify", "--help"}, {"--help"}} {
		var stdout, stderr bytes.Buffer
		require.Equal(t, 0, Main(cmd, &stdout, &stderr), "%v: %s", cmd, stderr.String())
		assert.Contains(t, stdout.String(), "usage:", "%v", cmd)
		assert.Contains(t, stdout.String(), "xample", "%v gives an example", cmd)
	}
}

func TestNewCommandsRefuseBadUsage(t *testing.T) {
	for _, cmd := range [][]string{
		{"build", "-o", "x"},
		{"stage", "--store", "s"},
		{"stage", "--store", "s", "--manifest", "m", "--url", "u"},
		{"stage", "--store", "s", "--manifest", "m", "--mirror", "https://m.example/x"},
		{"manifest"},
		{"manifest", "verify"},
		{"manifest", "verify", "a", "b"},
	} {
		var stdout, stderr bytes.Buffer
		assert.Equal(t, 2, Main(cmd, &stdout, &stderr), "%v", cmd)
	}
}

func TestBuildVerifyAndStageThroughTheCLI(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"agent", "sio", "ca"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, n), []byte(n), 0o755))
	}
	srv := httptest.NewServer(http.FileServer(http.Dir(filepath.Join(dir, "out"))))
	defer srv.Close()
	out := filepath.Join(dir, "out")
	var stdout, stderr bytes.Buffer
	code := Main([]string{"build", "--agent", filepath.Join(dir, "agent"), "--sandbox-io", filepath.Join(dir, "sio"),
		"--ca-bundle", filepath.Join(dir, "ca"), "--output", "tar,oci", "--epoch", "1", "--base-url", srv.URL, "--release", "t1", "-o", out}, &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	assert.Contains(t, stdout.String(), filepath.Join(out, "rootfs.tar.gz"))
	mf := filepath.Join(out, "manifest.json")

	stdout.Reset()
	require.Equal(t, 0, Main([]string{"manifest", "verify", mf, "--dir", out}, &stdout, &stderr), stderr.String())
	assert.Contains(t, stdout.String(), "rootfs-tar-windows-")
	assert.Contains(t, stdout.String(), " ok ")

	store := filepath.Join(dir, "store")
	stdout.Reset()
	stderr.Reset()
	require.Equal(t, 0, Main([]string{"stage", "--store", store, "--manifest", mf, "--progress", "json"}, &stdout, &stderr), stderr.String())
	assert.Contains(t, stderr.String(), `"event":"done"`)
	require.Equal(t, 0, Main([]string{"manifest", "verify", "--store", store, mf}, &stdout, &stderr))

	// A damaged file fails verification.
	tarPath := filepath.Join(out, "rootfs.tar.gz")
	require.NoError(t, os.WriteFile(tarPath, []byte("damaged"), 0o644))
	stdout.Reset()
	assert.Equal(t, 1, Main([]string{"manifest", "verify", mf, "--dir", out}, &stdout, &stderr))
	assert.Contains(t, stdout.String(), "FAIL wrong size")

	// A single URL with a wrong pin: the sha256 of other bytes.
	sum := sha256.Sum256([]byte("other"))
	stderr.Reset()
	code = Main([]string{"stage", "--store", store, "--url", srv.URL + "/rootfs.tar.gz", "--size", "7", "--sha256", hex.EncodeToString(sum[:]), "--quiet"}, &stdout, &stderr)
	assert.Equal(t, 1, code)
	assert.True(t, strings.HasPrefix(stderr.String(), "oac-image: corrupt: "), stderr.String())

	stderr.Reset()
	code = Main([]string{"stage", "--store", store, "--manifest", mf, "--name", "nope"}, &stdout, &stderr)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr.String(), "no artifact in the manifest matches")
}

func TestBuildWritesTheE2BContextThroughTheCLI(t *testing.T) {
	var stdout, stderr bytes.Buffer
	require.Equal(t, 0, Main([]string{"build", "--help"}, &stdout, &stderr))
	assert.Contains(t, stdout.String(), "  e2b    DIR/e2b/ ")
	assert.Contains(t, stdout.String(), "dir,tar,oci,e2b,ext4,erofs,vm", "--output lists it")

	dir := t.TempDir()
	for _, n := range []string{"agent", "sio", "ca"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, n), []byte(n), 0o755))
	}
	sums := map[string]string{}
	for _, o := range []string{"a", "b"} {
		out := filepath.Join(dir, o)
		stdout.Reset()
		code := Main([]string{"build", "--agent", filepath.Join(dir, "agent"), "--sandbox-io", filepath.Join(dir, "sio"),
			"--ca-bundle", filepath.Join(dir, "ca"), "--output", "e2b,tar", "--epoch", "1", "-o", out}, &stdout, &stderr)
		require.Equal(t, 0, code, stderr.String())
		assert.Contains(t, stdout.String(), "  "+filepath.Join(out, "e2b")+"\n")
		tarGz, err := os.ReadFile(filepath.Join(out, "rootfs.tar.gz"))
		require.NoError(t, err)
		e2bTarGz, err := os.ReadFile(filepath.Join(out, "e2b", "rootfs.tar.gz"))
		require.NoError(t, err)
		assert.True(t, bytes.Equal(tarGz, e2bTarGz))
		df, err := os.ReadFile(filepath.Join(out, "e2b", "e2b.Dockerfile"))
		require.NoError(t, err)
		assert.Contains(t, string(df), "FROM scratch\nADD rootfs.tar.gz /\n")
		b, err := os.ReadFile(filepath.Join(out, "SHA256SUMS"))
		require.NoError(t, err)
		assert.Contains(t, string(b), "  e2b/e2b.Dockerfile\n")
		assert.Contains(t, string(b), "  e2b/rootfs.tar.gz\n")
		sums[o] = string(b)
	}
	assert.Equal(t, sums["a"], sums["b"], "two builds give the same bytes")
}

func TestStageNamesAFailedMirrorEvenWhenQuiet(t *testing.T) {
	content := []byte("the pinned bytes")
	sum := sha256.Sum256(content)
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("other bytes, sam")) // the pinned size, other bytes
	}))
	defer bad.Close()
	good := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(content) }))
	defer good.Close()
	store := t.TempDir()
	var stdout, stderr bytes.Buffer
	code := Main([]string{"stage", "--store", store, "--url", bad.URL + "/f,1.bin", "--mirror", good.URL + "/f,1.bin",
		"--size", "16", "--sha256", hex.EncodeToString(sum[:]), "--name", "f", "--quiet"}, &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	badHost, goodHost := strings.TrimPrefix(bad.URL, "http://"), strings.TrimPrefix(good.URL, "http://")
	assert.Contains(t, stderr.String(), "oac-image: f: a mirror failed: download corrupted")
	assert.Contains(t, stderr.String(), "mirror "+badHost+" served other bytes")
	assert.Contains(t, stderr.String(), "oac-image: f: staged from mirror "+goodHost+"\n")
	assert.NotContains(t, stderr.String(), "f,1.bin", "a mirror is named by its host only")
	assert.Equal(t, "f "+filepath.Join(store, "sha256", hex.EncodeToString(sum[:]))+"\n", stdout.String())
}

func TestBuildPinsMirrorsAndTheInstallersPlan(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"agent", "sio", "ca", "wsl.2.1.5.0.x64.msi"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, n), []byte(n), 0o755))
	}
	out := filepath.Join(dir, "out")
	build := func(extra ...string) (int, string) {
		var stdout, stderr bytes.Buffer
		code := Main(append([]string{"build", "--agent", filepath.Join(dir, "agent"), "--sandbox-io", filepath.Join(dir, "sio"),
			"--ca-bundle", filepath.Join(dir, "ca"), "--output", "tar", "--epoch", "1", "--base-url", "https://storage.example.com/oac/r1",
			"--release", "r1", "-o", out}, extra...), &stdout, &stderr)
		return code, stderr.String()
	}
	code, stderr := build("--mirror-url", "https://mirror-a.example.net/oac/r1/", "--mirror-url", "https://mirror-b.example.org/r1",
		"--wsl-installer", filepath.Join(dir, "wsl.2.1.5.0.x64.msi"), "--wsl-installer-args", "/passive  /norestart", "--wsl-installer-restart=false")
	require.Equal(t, 0, code, stderr)
	f, err := os.Open(filepath.Join(out, "manifest.json"))
	require.NoError(t, err)
	defer f.Close()
	m, err := manifest.Decode(f)
	require.NoError(t, err)
	inst := m.Find("", manifest.KindWSLInstaller, "windows", "")
	require.Len(t, inst, 1)
	assert.Equal(t, []string{"https://storage.example.com/oac/r1/wsl.2.1.5.0.x64.msi", "https://mirror-a.example.net/oac/r1/wsl.2.1.5.0.x64.msi",
		"https://mirror-b.example.org/r1/wsl.2.1.5.0.x64.msi"}, inst[0].URLs())
	assert.Equal(t, manifest.Install{Args: []string{"/passive", "/norestart"}, Restart: false}, inst[0].InstallPlan())
	tar := m.Find("", manifest.KindRootfsTar, "windows", "")
	require.Len(t, tar, 1)
	assert.Equal(t, []string{"https://mirror-a.example.net/oac/r1/rootfs.tar.gz", "https://mirror-b.example.org/r1/rootfs.tar.gz"}, tar[0].Mirrors)
	assert.Nil(t, tar[0].Install)

	// Refused before anything is built.
	require.NoError(t, os.RemoveAll(out))
	code, stderr = build("--mirror-url", "http://mirror.example.net/oac")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "mirror 0: url must be https")
	code, stderr = build("--wsl-installer-args", "/passive")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "an installer plan (arguments, restart) goes with the WSL installer")
	code, stderr = build("--wsl-installer", filepath.Join(dir, "wsl.2.1.5.0.x64.msi"), "--wsl-installer-args", `/passive "x"`)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "install: arg 1 must be")
	_, err = os.Stat(filepath.Join(out, "rootfs.tar.gz"))
	assert.ErrorIs(t, err, os.ErrNotExist)
}

// Every command of oac-image's table prints its usage on stdout and exits
// 0 for -h and --help, and completion names every command and flag.
func TestEveryPathHasHelpAndCompletion(t *testing.T) {
	p := &cli.Program{Name: "oac-image", Commands: commands()}
	paths := p.Paths()
	require.Contains(t, paths, "manifest verify")
	for path := range paths {
		for _, flag := range []string{"-h", "--help"} {
			args := append(strings.Fields(path), flag)
			var stdout, stderr bytes.Buffer
			assert.Equal(t, 0, Main(args, &stdout, &stderr), "%q", args)
			assert.Empty(t, stderr.String(), "%q", args)
			assert.True(t, strings.HasPrefix(stdout.String(), "usage: oac-image"), "%q: %s", args, stdout.String())
		}
	}
	for _, sh := range cli.Shells {
		var stdout, stderr bytes.Buffer
		require.Equal(t, 0, Main([]string{"completion", sh}, &stdout, &stderr), stderr.String())
		for path, words := range paths {
			assert.Contains(t, stdout.String(), path, "%s", sh)
			for _, w := range words {
				assert.Contains(t, stdout.String(), strings.TrimLeft(w, "-"), "%s: %q of %q", sh, w, path)
			}
		}
	}
}

func TestFlagsGoAfterTheFileToo(t *testing.T) {
	dir := t.TempDir()
	agent := filepath.Join(dir, "oac-guest")
	require.NoError(t, os.WriteFile(agent, []byte("\x7fELF"), 0o755))
	out := filepath.Join(dir, "initramfs.img")
	var stdout, stderr bytes.Buffer
	require.Equal(t, 0, Main([]string{"initramfs", "-o", out, "--agent", agent}, &stdout, &stderr), stderr.String())
	stdout.Reset()
	require.Equal(t, 0, Main([]string{"list", out}, &stdout, &stderr), stderr.String())
	assert.Contains(t, stdout.String(), "/init\n")
	for _, args := range [][]string{{"list", out, "extra"}, {"list", out, "--bogus"}} {
		stderr.Reset()
		assert.Equal(t, 2, Main(args, &stdout, &stderr), "%q", args)
		assert.NotEmpty(t, stderr.String())
	}
}

func TestVersionOfOacImage(t *testing.T) {
	var stdout, stderr bytes.Buffer
	require.Equal(t, 0, Main([]string{"--version"}, &stdout, &stderr))
	assert.Regexp(t, `^oac-image \S+ \(protocol \d+\.\.\d+(, commit [0-9a-f]+)?(, modified)?\)\n$`, stdout.String())
	stdout.Reset()
	require.Equal(t, 0, Main([]string{"version", "--json"}, &stdout, &stderr))
	assert.NoError(t, schema.Validate(schema.Version, stdout.Bytes()), stdout.String())
}

// Every --json output of oac-image follows its schema: build, manifest
// verify (files that check and one that does not), stage (staged, then
// cached, then a corrupt pin) and list.
func TestJSONOutputsFollowTheirSchemas(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"agent", "sio", "ca"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, n), []byte(n), 0o755))
	}
	out := filepath.Join(dir, "out")
	srv := httptest.NewServer(http.FileServer(http.Dir(out)))
	defer srv.Close()
	run := func(want int, args ...string) []byte {
		t.Helper()
		var stdout, stderr bytes.Buffer
		require.Equal(t, want, Main(args, &stdout, &stderr), "%q: %s", args, stderr.String())
		return stdout.Bytes()
	}
	valid := func(name string, doc []byte, into any) {
		t.Helper()
		require.NoError(t, schema.Validate(name, doc), "%s", doc)
		require.NoError(t, json.Unmarshal(doc, into))
	}

	var built api.ImageBuildReport
	valid(schema.ImageBuild, run(0, "build", "--json", "--agent", filepath.Join(dir, "agent"), "--sandbox-io", filepath.Join(dir, "sio"),
		"--ca-bundle", filepath.Join(dir, "ca"), "--output", "tar,oci", "--epoch", "1",
		"--base-url", srv.URL, "--release", "t1", "-o", out), &built)
	var kinds []string
	for _, o := range built.Outputs {
		kinds = append(kinds, o.Kind)
	}
	assert.Subset(t, kinds, []string{"tar", "oci"})
	mf := filepath.Join(out, "manifest.json")

	var verified api.ImageVerifyReport
	valid(schema.ImageVerify, run(0, "manifest", "verify", mf, "--dir", out, "--json"), &verified)
	assert.True(t, verified.AllOK)
	assert.NotEmpty(t, verified.Artifacts)

	store := filepath.Join(dir, "store")
	var staged api.ImageStageReport
	valid(schema.ImageStage, run(0, "stage", "--json", "--quiet", "--store", store, "--manifest", mf), &staged)
	require.Len(t, staged.Staged, len(verified.Artifacts))
	assert.False(t, staged.Staged[0].Cached)
	assert.Equal(t, staged.Staged[0].Size, staged.Staged[0].Downloaded)
	valid(schema.ImageStage, run(0, "stage", "--json", "--quiet", "--store", store, "--manifest", mf), &staged)
	assert.True(t, staged.Staged[0].Cached, "staged already")

	require.NoError(t, os.WriteFile(filepath.Join(out, "rootfs.tar.gz"), []byte("damaged"), 0o644))
	verified = api.ImageVerifyReport{}
	valid(schema.ImageVerify, run(1, "manifest", "verify", "--json", mf, "--dir", out), &verified)
	assert.False(t, verified.AllOK)

	// A pin of other bytes than the (now 7-byte) file the URL serves.
	sum := sha256.Sum256([]byte("other"))
	staged = api.ImageStageReport{}
	valid(schema.ImageStage, run(1, "stage", "--json", "--quiet", "--store", store, "--url", srv.URL+"/rootfs.tar.gz", "--size", "7",
		"--sha256", hex.EncodeToString(sum[:]), "--name", "pinned"), &staged)
	require.NotNil(t, staged.Error)
	assert.Equal(t, "corrupt", staged.Error.Code)
	assert.Equal(t, "pinned", staged.Error.Name)

	ird := filepath.Join(dir, "initramfs.img")
	run(0, "initramfs", "--agent", filepath.Join(dir, "agent"), "-o", ird)
	var listed api.ImageListReport
	valid(schema.ImageList, run(0, "list", ird, "--json"), &listed)
	var paths []string
	for _, e := range listed.Entries {
		paths = append(paths, e.Path)
		if e.Path == "/dev/console" {
			assert.Equal(t, "5:1", e.Device)
		}
	}
	assert.Contains(t, paths, "/init")
	assert.Contains(t, paths, "/dev/console")
}
