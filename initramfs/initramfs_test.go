package initramfs

import (
	"bytes"
	"compress/gzip"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/ulikunitz/xz"
)

func TestCpioRoundTripsEveryMemberType(t *testing.T) {
	in := []Entry{
		{Name: ".", Mode: fs.ModeDir | 0o755},
		{Name: "dev", Mode: fs.ModeDir | 0o755},
		{Name: "dev/console", Mode: fs.ModeDevice | fs.ModeCharDevice | 0o600, RdevMajor: 5, RdevMinor: 1},
		{Name: "dev/vda", Mode: fs.ModeDevice | 0o660, RdevMajor: 254, RdevMinor: 0},
		{Name: "init", Mode: 0o755, Data: []byte("\x7fELF binary")},
		{Name: "empty", Mode: 0o644},
		{Name: "odd", Mode: 0o600, UID: 1000, GID: 1000, Data: []byte("abc")},
		{Name: "bin", Mode: fs.ModeSymlink | 0o777, Data: []byte("usr/bin")},
		{Name: "tmp", Mode: fs.ModeDir | fs.ModeSticky | 0o777},
		{Name: "suid", Mode: fs.ModeSetuid | fs.ModeSetgid | 0o755, Data: []byte{1}},
		{Name: "fifo", Mode: fs.ModeNamedPipe | 0o644},
	}
	var buf bytes.Buffer
	w := NewCpioWriter(&buf)
	for _, e := range in {
		require.NoError(t, w.WriteEntry(e))
	}
	require.NoError(t, w.Close())
	assert.Zero(t, buf.Len()%4, "members are 4-byte aligned")
	out, err := ReadCpio(bytes.NewReader(buf.Bytes()), 1<<20)
	require.NoError(t, err)
	assert.Equal(t, in, out)
}

func TestCpioHeaderIsNewcWithFixedTimesAndInodes(t *testing.T) {
	var buf bytes.Buffer
	w := NewCpioWriter(&buf)
	require.NoError(t, w.WriteEntry(Entry{Name: "dev/console", Mode: fs.ModeDevice | fs.ModeCharDevice | 0o600, RdevMajor: 5, RdevMinor: 1}))
	require.NoError(t, w.Close())
	// magic, ino 1, mode 020600, uid, gid, nlink 1, mtime 0, size 0,
	// devmajor, devminor, rdevmajor 5, rdevminor 1, namesize 12, check 0.
	want := "070701" + "00000001" + "00002180" + "00000000" + "00000000" + "00000001" + "00000000" +
		"00000000" + "00000000" + "00000000" + "00000005" + "00000001" + "0000000c" + "00000000" +
		"dev/console\x00"
	require.GreaterOrEqual(t, buf.Len(), len(want))
	assert.Equal(t, want, buf.String()[:len(want)])
	assert.Contains(t, buf.String(), "TRAILER!!!\x00")
}

func TestCpioWriterRefusesBadNames(t *testing.T) {
	w := NewCpioWriter(&bytes.Buffer{})
	for _, name := range []string{"", "/abs", "a\x00b", "TRAILER!!!"} {
		assert.Error(t, w.WriteEntry(Entry{Name: name, Mode: 0o644}), "%q", name)
	}
	assert.Error(t, w.WriteEntry(Entry{Name: "d", Mode: fs.ModeDir | 0o755, Data: []byte("x")}), "directories carry no data")
	require.NoError(t, w.Close())
	assert.Error(t, w.WriteEntry(Entry{Name: "late", Mode: 0o644}))
}

func TestReadCpioRefusesOversizedAndTruncatedArchives(t *testing.T) {
	var buf bytes.Buffer
	w := NewCpioWriter(&buf)
	require.NoError(t, w.WriteEntry(Entry{Name: "big", Mode: 0o644, Data: bytes.Repeat([]byte("x"), 100)}))
	require.NoError(t, w.Close())
	_, err := ReadCpio(bytes.NewReader(buf.Bytes()), 99)
	assert.ErrorContains(t, err, "exceeds the limit")
	_, err = ReadCpio(bytes.NewReader(buf.Bytes()[:150]), 1<<20)
	assert.ErrorContains(t, err, "unexpected EOF")
	_, err = ReadCpio(strings.NewReader("070707"+strings.Repeat("0", 200)), 1<<20)
	assert.ErrorContains(t, err, "only newc")
}

// fakeKernel writes a modules directory with a dependency graph shaped like
// the Debian cloud kernel's virtio modules.
func fakeKernel(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "6.1.0-test")
	dep := `kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_pci_modern_dev.ko:
kernel/drivers/virtio/virtio_pci_legacy_dev.ko:
kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio_pci_legacy_dev.ko kernel/drivers/virtio/virtio_pci_modern_dev.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/char/virtio_console.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/net/vmw_vsock/vsock.ko:
kernel/net/vmw_vsock/vmw_vsock_virtio_transport_common.ko: kernel/net/vmw_vsock/vsock.ko
kernel/net/vmw_vsock/vmw_vsock_virtio_transport.ko.xz: kernel/net/vmw_vsock/vmw_vsock_virtio_transport_common.ko kernel/net/vmw_vsock/vsock.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/block/virtio_blk.ko.zst: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/arch/x86/events/intel/intel-uncore.ko.gz:
`
	write := func(rel string, data []byte) {
		p := filepath.Join(dir, filepath.FromSlash(rel))
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, data, 0o644))
	}
	write("modules.dep", []byte(dep))
	write("modules.builtin", []byte("kernel/fs/ext4/ext4.ko\nkernel/fs/mbcache.ko\n"))
	for _, line := range strings.Split(strings.TrimSpace(dep), "\n") {
		file, _, _ := strings.Cut(line, ":")
		content := []byte("module " + ModuleName(file))
		var buf bytes.Buffer
		switch {
		case strings.HasSuffix(file, ".xz"):
			xw, err := xz.NewWriter(&buf)
			require.NoError(t, err)
			_, _ = xw.Write(content)
			require.NoError(t, xw.Close())
			content = buf.Bytes()
		case strings.HasSuffix(file, ".zst"):
			zw, err := zstd.NewWriter(&buf)
			require.NoError(t, err)
			_, _ = zw.Write(content)
			require.NoError(t, zw.Close())
			content = buf.Bytes()
		case strings.HasSuffix(file, ".gz"):
			gw := gzip.NewWriter(&buf)
			_, _ = gw.Write(content)
			require.NoError(t, gw.Close())
			content = buf.Bytes()
		}
		write(file, content)
	}
	return dir
}

func TestResolveOrdersModulesAfterTheirDependencies(t *testing.T) {
	md, builtin, err := LoadModuleTree(fakeKernel(t))
	require.NoError(t, err)
	files, err := md.Resolve([]string{"virtio_pci", "virtio_console", "vmw_vsock_virtio_transport", "ext4"}, builtin)
	require.NoError(t, err)
	names := make([]string, len(files))
	for i, f := range files {
		names[i] = ModuleName(f)
	}
	// The load order measured for PCI (docs/images.md), each module once,
	// ext4 skipped because it is built in.
	assert.Equal(t, []string{
		"virtio_ring", "virtio", "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio_pci",
		"virtio_console",
		"vsock", "vmw_vsock_virtio_transport_common", "vmw_vsock_virtio_transport",
	}, names)
}

func TestResolveTreatsDashesAndUnderscoresAlikeAndNamesUnknownModules(t *testing.T) {
	md, builtin, err := LoadModuleTree(fakeKernel(t))
	require.NoError(t, err)
	files, err := md.Resolve([]string{"intel_uncore", "intel-uncore"}, builtin)
	require.NoError(t, err)
	assert.Equal(t, []string{"kernel/arch/x86/events/intel/intel-uncore.ko.gz"}, files)
	_, err = md.Resolve([]string{"no_such_mod"}, builtin)
	assert.ErrorContains(t, err, `module "no_such_mod" is neither in modules.dep nor built into the kernel`)
}

func TestResolveReportsCyclesAndDanglingDependencies(t *testing.T) {
	md, err := ParseModulesDep(strings.NewReader("a.ko: b.ko\nb.ko: a.ko\nc.ko: missing.ko\n"))
	require.NoError(t, err)
	_, err = md.Resolve([]string{"a"}, nil)
	assert.ErrorContains(t, err, "dependency cycle: a -> b -> a")
	_, err = md.Resolve([]string{"c"}, nil)
	assert.ErrorContains(t, err, "does not list it")
}

func TestParseModulesDepRefusesPathsLeavingTheTree(t *testing.T) {
	for _, doc := range []string{
		"../evil.ko:\n", "/abs.ko:\n", "a.ko: ../../etc/shadow\n", "a.ko: b.txt\n", "no colon here\n", "a.ko:\na.ko:\n",
	} {
		_, err := ParseModulesDep(strings.NewReader(doc))
		assert.Error(t, err, "%q", doc)
	}
}

func TestReadModuleDecompresses(t *testing.T) {
	dir := fakeKernel(t)
	for file, want := range map[string]string{
		"kernel/net/vmw_vsock/vmw_vsock_virtio_transport.ko.xz": "kernel/net/vmw_vsock/vmw_vsock_virtio_transport.ko",
		"kernel/drivers/block/virtio_blk.ko.zst":                "kernel/drivers/block/virtio_blk.ko",
		"kernel/arch/x86/events/intel/intel-uncore.ko.gz":       "kernel/arch/x86/events/intel/intel-uncore.ko",
		"kernel/drivers/virtio/virtio.ko":                       "kernel/drivers/virtio/virtio.ko",
	} {
		data, name, err := ReadModule(dir, file)
		require.NoError(t, err, file)
		assert.Equal(t, want, name)
		assert.Equal(t, "module "+ModuleName(file), string(data))
	}
	_, _, err := ReadModule(dir, "../x.ko")
	assert.Error(t, err)
}

func testSpec(t *testing.T) Spec {
	t.Helper()
	dir := t.TempDir()
	agent := filepath.Join(dir, "oac-guest")
	require.NoError(t, os.WriteFile(agent, []byte("\x7fELF agent"), 0o755))
	daemon := filepath.Join(dir, "daemon")
	require.NoError(t, os.WriteFile(daemon, []byte("#!daemon"), 0o700))
	ca := filepath.Join(dir, "ca.pem")
	require.NoError(t, os.WriteFile(ca, []byte("-----BEGIN CERTIFICATE-----"), 0o600))
	return Spec{
		Agent:      agent,
		ModulesDir: fakeKernel(t),
		Modules:    []string{"virtio_console", "virtio_pci"},
		Files: []File{
			{Src: daemon, Dst: "/usr/local/bin/daemon"},
			{Src: ca, Dst: "/etc/ssl/certs/ca-certificates.crt"},
		},
	}
}

func build(t *testing.T, spec Spec) []byte {
	t.Helper()
	var buf bytes.Buffer
	_, err := Build(spec, &buf)
	require.NoError(t, err)
	return buf.Bytes()
}

func TestBuildIsByteForByteReproducible(t *testing.T) {
	spec := testSpec(t)
	first := build(t, spec)
	// Different mtimes and permission bits on the build host change nothing.
	later := time.Now().Add(time.Hour)
	require.NoError(t, os.Chtimes(spec.Agent, later, later))
	require.NoError(t, os.Chmod(spec.Files[0].Src, 0o755))
	again := build(t, spec)
	assert.Equal(t, first, again)
	// gzip header: magic, deflate, no flags (no name), mtime 0.
	assert.Equal(t, []byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0}, first[:8])

	spec.Files = spec.Files[:1]
	assert.NotEqual(t, first, build(t, spec), "different inputs give different bytes")
}

func TestBuildLaysOutWhatTheGuestNeeds(t *testing.T) {
	spec := testSpec(t)
	zr, err := gzip.NewReader(bytes.NewReader(build(t, spec)))
	require.NoError(t, err)
	entries, err := ReadCpio(zr, 1<<30)
	require.NoError(t, err)
	byName := map[string]Entry{}
	var names []string
	for _, e := range entries {
		byName[e.Name] = e
		names = append(names, e.Name)
	}
	assert.Equal(t, ".", entries[0].Name, "the root comes first")
	assert.Equal(t, fs.ModeDir|0o755, entries[0].Mode, "root is 0755 so uid 1000 can exec below it")
	for i, n := range names[1:] {
		assert.Less(t, names[i], n, "sorted, parents before children")
	}
	assert.Equal(t, fs.ModeDevice|fs.ModeCharDevice|0o600, byName["dev/console"].Mode)
	assert.Equal(t, [2]int{5, 1}, [2]int{byName["dev/console"].RdevMajor, byName["dev/console"].RdevMinor})
	assert.Equal(t, fs.FileMode(0o755), byName["init"].Mode)
	assert.Equal(t, "\x7fELF agent", string(byName["init"].Data))
	home := byName["home/runtime"]
	assert.Equal(t, [3]any{fs.ModeDir | 0o700, 1000, 1000}, [3]any{home.Mode, home.UID, home.GID})
	assert.Contains(t, string(byName["etc/passwd"].Data), "runtime:x:1000:1000:runtime:/home/runtime:")
	assert.Contains(t, string(byName["etc/group"].Data), "runtime:x:1000:\n")
	assert.Equal(t, fs.ModeDir|fs.ModeSticky|0o777, byName["tmp"].Mode)
	assert.Equal(t, fs.FileMode(0o755), byName["usr/local/bin/daemon"].Mode, "executable sources become 0755")
	assert.Equal(t, fs.FileMode(0o644), byName["etc/ssl/certs/ca-certificates.crt"].Mode, "others 0644")
	assert.Equal(t, fs.ModeDir|0o755, byName["usr/local"].Mode, "parents are created")
	assert.Equal(t, "/lib/modules/6.1.0-test/kernel/drivers/virtio/virtio_ring.ko\n"+
		"/lib/modules/6.1.0-test/kernel/drivers/virtio/virtio.ko\n"+
		"/lib/modules/6.1.0-test/kernel/drivers/char/virtio_console.ko\n"+
		"/lib/modules/6.1.0-test/kernel/drivers/virtio/virtio_pci_modern_dev.ko\n"+
		"/lib/modules/6.1.0-test/kernel/drivers/virtio/virtio_pci_legacy_dev.ko\n"+
		"/lib/modules/6.1.0-test/kernel/drivers/virtio/virtio_pci.ko\n",
		string(byName["etc/oac/modules"].Data))
	assert.Equal(t, "module virtio_pci", string(byName["lib/modules/6.1.0-test/kernel/drivers/virtio/virtio_pci.ko"].Data))
	for _, e := range entries {
		if e.Name != "home/runtime" {
			assert.Equal(t, [2]int{0, 0}, [2]int{e.UID, e.GID}, "%s is root-owned", e.Name)
		}
	}
}

func TestBuildRefusesConflictsAndMissingInputs(t *testing.T) {
	spec := testSpec(t)
	spec.Files = append(spec.Files, File{Src: spec.Agent, Dst: "/init"})
	_, err := Build(spec, &bytes.Buffer{})
	assert.ErrorContains(t, err, "/init is already a file in the image")

	spec = testSpec(t)
	spec.Files = append(spec.Files, File{Src: spec.Agent, Dst: "/init/below"})
	_, err = Build(spec, &bytes.Buffer{})
	assert.ErrorContains(t, err, "/init is a file in the image")

	spec = testSpec(t)
	spec.Files = append(spec.Files, File{Src: spec.Agent, Dst: "relative"})
	_, err = Build(spec, &bytes.Buffer{})
	assert.ErrorContains(t, err, "absolute clean path")

	spec = testSpec(t)
	spec.ModulesDir = ""
	_, err = Build(spec, &bytes.Buffer{})
	assert.ErrorContains(t, err, "no kernel modules directory")

	spec = testSpec(t)
	spec.Agent = filepath.Join(t.TempDir(), "missing")
	_, err = Build(spec, &bytes.Buffer{})
	assert.ErrorContains(t, err, "read agent")
}
