package imagebuild

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/manifest"
)

// testBase writes a small base rootfs: a merged /usr, a passwd with a
// user at uid 1000 to be replaced, a hard link, a long name.
func testBase(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "base")
	w := func(p, content string, mode fs.FileMode) {
		hp := filepath.Join(dir, p)
		require.NoError(t, os.MkdirAll(filepath.Dir(hp), 0o755))
		require.NoError(t, os.WriteFile(hp, []byte(content), mode))
	}
	w("usr/bin/hello", "#!/bin/sh\necho hello\n", 0o755)
	w("usr/sbin/.keep", "", 0o644)
	w("etc/passwd", "root:x:0:0:root:/root:/bin/bash\nubuntu:x:1000:1000::/home/ubuntu:/bin/bash\n", 0o644)
	w("etc/group", "root:x:0:\nubuntu:x:1000:\n", 0o644)
	w("etc/shadow", "root:*:1::::::\nubuntu:!:1::::::\n", 0o640)
	w("usr/share/"+strings.Repeat("long-name/", 12)+"file", "deep", 0o644)
	require.NoError(t, os.Link(filepath.Join(dir, "usr/bin/hello"), filepath.Join(dir, "usr/bin/hello-again")))
	require.NoError(t, os.Symlink("usr/bin", filepath.Join(dir, "bin")))
	require.NoError(t, os.Symlink("usr/sbin", filepath.Join(dir, "sbin")))
	return dir
}

func testInjection(t *testing.T) Injection {
	t.Helper()
	d := t.TempDir()
	for _, n := range []string{"agent", "sio", "ca.pem"} {
		require.NoError(t, os.WriteFile(filepath.Join(d, n), []byte("content of "+n), 0o755))
	}
	return Injection{Agent: filepath.Join(d, "agent"), SandboxIO: filepath.Join(d, "sio"), CABundle: filepath.Join(d, "ca.pem")}
}

func TestInjectFollowsMergedUsrAndMergesUsers(t *testing.T) {
	tree, err := LoadDir(testBase(t))
	require.NoError(t, err)
	require.NoError(t, Inject(tree, testInjection(t)))
	agent := tree.Get("usr/sbin/oac-guest")
	require.NotNil(t, agent, "/sbin is a symlink to usr/sbin: the agent lands there")
	assert.Equal(t, fs.FileMode(0o755), agent.Mode)
	assert.Equal(t, "bin", tree.Get("bin").Path)
	assert.Equal(t, fs.ModeSymlink, tree.Get("sbin").Mode.Type())
	home := tree.Get("home/runtime")
	require.NotNil(t, home)
	assert.Equal(t, fs.ModeDir|0o700, home.Mode)
	assert.Equal(t, [2]int{1000, 1000}, [2]int{home.UID, home.GID})
	ws := tree.Get("environment/workspace")
	require.NotNil(t, ws)
	assert.Equal(t, 1000, ws.UID)
	for _, p := range []string{"proc", "sys", "dev", "run", "tmp"} {
		require.NotNil(t, tree.Get(p), p)
		assert.True(t, tree.Get(p).Mode.IsDir())
	}
	assert.Equal(t, fs.ModeDir|fs.ModeSticky|0o777, tree.Get("tmp").Mode)
	passwd, err := readNode(tree, tree.Get("etc/passwd"), 1<<20)
	require.NoError(t, err)
	assert.Equal(t, "root:x:0:0:root:/root:/bin/bash\nruntime:x:1000:1000:runtime:/home/runtime:/bin/sh\n", string(passwd))
	shadow, err := readNode(tree, tree.Get("etc/shadow"), 1<<20)
	require.NoError(t, err)
	assert.Equal(t, "root:*:1::::::\nruntime:!:1::::::\n", string(shadow))
	assert.Equal(t, fs.FileMode(0o640), tree.Get("etc/shadow").Mode, "the base's mode is kept")
	require.NotNil(t, tree.Get("usr/local/bin/oac-sandbox-io"))
	require.NotNil(t, tree.Get("etc/ssl/certs/ca-certificates.crt"))
	wslConf, err := readNode(tree, tree.Get("etc/wsl.conf"), 1<<20)
	require.NoError(t, err)
	for _, line := range []string{"[automount]\nenabled=false\nmountFsTab=false\n", "[interop]\nenabled=false\nappendWindowsPath=false\n", "[gpu]\nenabled=false\n"} {
		assert.Contains(t, string(wslConf), line, "a WSL distribution of the image opens no door to Windows")
	}
}

func TestMergeIDs(t *testing.T) {
	out, removed := MergePasswd("")
	assert.Equal(t, "root:x:0:0:root:/root:/bin/sh\nruntime:x:1000:1000:runtime:/home/runtime:/bin/sh\n", out)
	assert.Empty(t, removed)
	out, removed = MergeGroup("root:x:0:\nruntime:x:5:\nstaff:x:1000:\n\nusers:x:100:\n")
	assert.Equal(t, "root:x:0:\nusers:x:100:\nruntime:x:1000:\n", out)
	assert.Equal(t, []string{"staff"}, removed)
}

func TestResolveRefusesLoopsAndStaysInside(t *testing.T) {
	tree := NewTree()
	_, err := tree.Put(Node{Path: "a", Mode: fs.ModeSymlink | 0o777, Target: "b"})
	require.NoError(t, err)
	_, err = tree.Put(Node{Path: "b", Mode: fs.ModeSymlink | 0o777, Target: "/a"})
	require.NoError(t, err)
	_, err = tree.Resolve("a/x", true)
	assert.ErrorContains(t, err, "too many levels")
	_, err = tree.Put(Node{Path: "up", Mode: fs.ModeSymlink | 0o777, Target: "../../../etc"})
	require.NoError(t, err)
	r, err := tree.Resolve("up/passwd", true)
	require.NoError(t, err)
	assert.Equal(t, "etc/passwd", r, "a symlink cannot climb above the root")
	_, err = cleanRel("../x")
	assert.Error(t, err)
}

func TestLessPathPutsDirectoriesBeforeTheirContents(t *testing.T) {
	ps := []string{"a-c", "a/b", "a", ".", "a/b/c", "b"}
	sort.Slice(ps, func(i, j int) bool { return lessPath(ps[i], ps[j]) })
	assert.Equal(t, []string{".", "a", "a/b", "a/b/c", "a-c", "b"}, ps)
}

func needRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("materializing owners 1000 and 0 needs root")
	}
}

func build(t *testing.T, base string, inj Injection, outputs ...string) *Result {
	t.Helper()
	res, err := Build(Spec{Base: base, Injection: inj, Epoch: 1700000000, Arch: "amd64", Outputs: outputs,
		Out: filepath.Join(t.TempDir(), "out"), BaseURL: "https://images.example.com/oac/1", Release: "test-1"})
	require.NoError(t, err)
	return res
}

func digests(r *Result) map[string]string {
	m := map[string]string{}
	for _, o := range r.Outputs {
		m[o.Kind] = o.SHA256
	}
	return m
}

func TestBuildIsReproducibleAndADirAndItsTarGiveTheSameImage(t *testing.T) {
	needRoot(t)
	base := testBase(t)
	inj := testInjection(t)
	outs := []string{OutDir, OutTar, OutOCI}
	if _, err := exec.LookPath("mkfs.ext4"); err == nil {
		outs = append(outs, OutExt4)
	}
	if _, err := exec.LookPath("mkfs.erofs"); err == nil {
		outs = append(outs, OutErofs)
	}
	a := build(t, base, inj, outs...)
	// Touch the base: times of the build host must not matter.
	require.NoError(t, os.Chtimes(filepath.Join(base, "usr/bin/hello"), time1(), time1()))
	b := build(t, base, inj, outs...)
	assert.Equal(t, digests(a), digests(b))
	assert.Len(t, a.Outputs, len(outs))

	// The tar output as a base gives the same image again.
	var tarPath string
	for _, o := range a.Outputs {
		if o.Kind == OutTar {
			tarPath = o.Path
		}
	}
	c := build(t, tarPath, inj, outs...)
	assert.Equal(t, digests(a), digests(c), "a base read from the built tar gives the same bytes")

	for _, o := range a.Outputs {
		switch o.Kind {
		case OutOCI:
			img, err := ReadOCILayout(o.Path)
			require.NoError(t, err)
			assert.Equal(t, "latest", img.Ref)
			assert.Equal(t, []string{"/sbin/oac-guest"}, img.Entrypoint)
			assert.Len(t, img.Layers, 1)
		case OutExt4:
			out, err := exec.Command("e2fsck", "-fn", o.Path).CombinedOutput()
			require.NoError(t, err, "%s", out)
		case OutErofs:
			out, err := exec.Command("fsck.erofs", o.Path).CombinedOutput()
			require.NoError(t, err, "%s", out)
		}
	}
	check := exec.Command("sha256sum", "--strict", "-c", SumsName)
	check.Dir = filepath.Dir(tarPath)
	out, err := check.CombinedOutput()
	require.NoError(t, err, "sha256sum -c SHA256SUMS: %s", out)
	assert.Contains(t, string(out), "oci/index.json: OK", "the OCI layout's files are listed one by one")
	assert.NotContains(t, string(out), "rootfs/", "directories are not")
	mf, err := os.Open(filepath.Join(filepath.Dir(tarPath), ManifestName))
	require.NoError(t, err)
	defer mf.Close()
	m, err := manifest.Decode(mf)
	require.NoError(t, err)
	for _, art := range m.Artifacts {
		require.NoError(t, manifest.VerifyFile(art, filepath.Join(filepath.Dir(tarPath), art.FileName())))
	}
}

func TestTarOutputIsNormalized(t *testing.T) {
	base := testBase(t)
	res := build(t, base, testInjection(t), OutTar)
	f, err := os.Open(res.Outputs[0].Path)
	require.NoError(t, err)
	defer f.Close()
	zr, err := gzip.NewReader(f)
	require.NoError(t, err)
	assert.Empty(t, zr.Name)
	assert.True(t, zr.ModTime.IsZero())
	tr := tar.NewReader(zr)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		names = append(names, h.Name)
		assert.Equal(t, int64(1700000000), h.ModTime.Unix(), h.Name)
		assert.Empty(t, h.Uname)
		assert.Empty(t, h.Gname)
		if h.Name == "usr/bin/hello-again" {
			assert.Equal(t, byte(tar.TypeLink), h.Typeflag)
			assert.Equal(t, "usr/bin/hello", h.Linkname)
		}
		if h.Name == "home/runtime/" {
			assert.Equal(t, 1000, h.Uid)
			assert.Equal(t, int64(0o700), h.Mode)
		}
	}
	assert.Contains(t, names, "usr/sbin/oac-guest")
	assert.True(t, sort.SliceIsSorted(names, func(i, j int) bool {
		return lessPath(strings.TrimSuffix(names[i], "/"), strings.TrimSuffix(names[j], "/"))
	}))
}

func time1() time.Time { return time.Unix(1800000000, 0) }

func TestTheWSLInstallerIsCopiedListedAndPinned(t *testing.T) {
	msi := filepath.Join(t.TempDir(), "wsl.2.6.1.0.x64.msi")
	require.NoError(t, os.WriteFile(msi, []byte("MSI bytes"), 0o644))
	out := filepath.Join(t.TempDir(), "out")
	_, err := Build(Spec{Injection: testInjection(t), Arch: "amd64", Outputs: []string{OutTar}, Out: out,
		BaseURL: "https://images.example.com/oac/1", Release: "test-1", WSLInstaller: msi})
	require.NoError(t, err)
	b, err := os.ReadFile(filepath.Join(out, "wsl.2.6.1.0.x64.msi"))
	require.NoError(t, err)
	assert.Equal(t, "MSI bytes", string(b))
	sums, err := os.ReadFile(filepath.Join(out, SumsName))
	require.NoError(t, err)
	assert.Contains(t, string(sums), "  wsl.2.6.1.0.x64.msi\n")
	f, err := os.Open(filepath.Join(out, ManifestName))
	require.NoError(t, err)
	defer f.Close()
	m, err := manifest.Decode(f)
	require.NoError(t, err)
	arts := m.Find("", manifest.KindWSLInstaller, "windows", "amd64")
	require.Len(t, arts, 1)
	assert.Equal(t, "https://images.example.com/oac/1/wsl.2.6.1.0.x64.msi", arts[0].URL)
	assert.NoError(t, manifest.VerifyFile(arts[0], filepath.Join(out, arts[0].FileName())))

	_, err = Build(Spec{Injection: testInjection(t), Outputs: []string{OutTar}, Out: filepath.Join(t.TempDir(), "o"), WSLInstaller: filepath.Join(t.TempDir(), "none.msi")})
	assert.ErrorContains(t, err, "is not a readable file")
}

func TestBuildRefusesBinariesAndKernelsOfAnotherArchitecture(t *testing.T) {
	exe, err := os.Executable() // an ELF binary of this host's architecture
	require.NoError(t, err)
	other := map[string]string{"amd64": "arm64", "arm64": "amd64"}[runtime.GOARCH]
	inj := testInjection(t)
	inj.Agent = exe
	_, err = Build(Spec{Injection: inj, Arch: other, Outputs: []string{OutTar}, Out: filepath.Join(t.TempDir(), "o")})
	assert.ErrorContains(t, err, "is an "+runtime.GOARCH+" binary but the image is for "+other)
	assert.ErrorContains(t, err, "make image ARCH="+other+" cross-builds it")

	kernel := filepath.Join(t.TempDir(), "vmlinuz")
	k := make([]byte, 0x400)
	copy(k[0x202:], "HdrS")
	require.NoError(t, os.WriteFile(kernel, k, 0o644))
	_, err = Build(Spec{Injection: testInjection(t), Arch: "arm64", Outputs: []string{OutVM}, Kernel: kernel, ModulesDir: t.TempDir(),
		Out: filepath.Join(t.TempDir(), "o")})
	assert.ErrorContains(t, err, "is for amd64 but the image is for arm64 (make kernel ARCH=arm64 fetches Debian's)")
}

func TestE2BOutputIsTheTarOutputAndAFixedDockerfile(t *testing.T) {
	base := testBase(t)
	inj := testInjection(t)
	a := build(t, base, inj, OutTar, OutE2B)
	out := filepath.Dir(a.Outputs[0].Path)
	require.Len(t, a.Outputs, 2)
	assert.Equal(t, OutE2B, a.Outputs[1].Kind)
	assert.Equal(t, filepath.Join(out, E2BName), a.Outputs[1].Path)
	tarGz, err := os.ReadFile(filepath.Join(out, TarName))
	require.NoError(t, err)
	e2bTarGz, err := os.ReadFile(filepath.Join(out, E2BName, TarName))
	require.NoError(t, err)
	assert.True(t, bytes.Equal(tarGz, e2bTarGz), "e2b/rootfs.tar.gz is the tar output's bytes")

	df, err := os.ReadFile(filepath.Join(out, E2BName, E2BDockerfileName))
	require.NoError(t, err)
	assert.Equal(t, E2BDockerfile, string(df))
	var instructions []string
	for _, line := range strings.Split(string(df), "\n") {
		if f := strings.Fields(line); len(f) > 0 && !strings.HasPrefix(f[0], "#") {
			instructions = append(instructions, strings.ToUpper(f[0]))
		}
	}
	assert.Equal(t, []string{"FROM", "ADD", "USER", "WORKDIR"}, instructions, "no CMD or ENTRYPOINT: Core starts the helper through envd")
	assert.Contains(t, string(df), "\nADD rootfs.tar.gz /\n")
	assert.Contains(t, string(df), "--file SRC:/etc/oac/egress-policy.json:0644", "it says where the egress policy goes")
	assert.Contains(t, string(df), "/usr/sbin/oac-guest", "it says where a merged-/usr base puts the agent")

	sums, err := os.ReadFile(filepath.Join(out, SumsName))
	require.NoError(t, err)
	for _, name := range []string{TarName, E2BName + "/" + E2BDockerfileName, E2BName + "/" + TarName} {
		sum, err := fileDigest(filepath.Join(out, name))
		require.NoError(t, err)
		assert.Contains(t, string(sums), sum+"  "+name+"\n")
	}

	mf, err := os.Open(filepath.Join(out, ManifestName))
	require.NoError(t, err)
	defer mf.Close()
	m, err := manifest.Decode(mf)
	require.NoError(t, err)
	require.Len(t, m.Artifacts, 1, "the e2b files are not pinned: only the rootfs tar is")
	assert.Equal(t, manifest.KindRootfsTar, m.Artifacts[0].Kind)

	// Another build of the same inputs, and one without the tar output,
	// give the same bytes.
	b := build(t, base, inj, OutTar, OutE2B)
	assert.Equal(t, digests(a), digests(b))
	sumsB, err := os.ReadFile(filepath.Join(filepath.Dir(b.Outputs[0].Path), SumsName))
	require.NoError(t, err)
	assert.Equal(t, string(sums), string(sumsB))
	_, err = Build(Spec{Base: base, Injection: inj, Outputs: []string{OutE2B}, Out: filepath.Join(t.TempDir(), "o"),
		BaseURL: "https://images.example.com/oac/1", Release: "test-1"})
	assert.ErrorContains(t, err, "none is built (oci and e2b are not pinned)")
	c, err := Build(Spec{Base: base, Injection: inj, Epoch: 1700000000, Arch: "amd64", Outputs: []string{OutE2B}, Out: filepath.Join(t.TempDir(), "out")})
	require.NoError(t, err)
	require.Len(t, c.Outputs, 1)
	assert.Equal(t, digests(a)[OutE2B], c.Outputs[0].SHA256, "the e2b directory is the same without the tar output")
	alone, err := os.ReadFile(filepath.Join(c.Outputs[0].Path, TarName))
	require.NoError(t, err)
	assert.True(t, bytes.Equal(tarGz, alone))
}
