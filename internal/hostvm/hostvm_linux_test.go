package hostvm

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/initramfs"
)

// staticELF writes the smallest ELF file debug/elf reads: a header with
// no program headers, as a static binary has no PT_INTERP.
func staticELF(t *testing.T) string {
	t.Helper()
	h := make([]byte, 64)
	copy(h, "\x7fELF")
	h[4], h[5], h[6] = 2, 1, 1                  // 64-bit, little endian, version 1
	binary.LittleEndian.PutUint16(h[16:], 2)    // ET_EXEC
	binary.LittleEndian.PutUint16(h[18:], 0x3e) // x86-64
	binary.LittleEndian.PutUint32(h[20:], 1)
	binary.LittleEndian.PutUint16(h[52:], 64) // header size
	p := filepath.Join(t.TempDir(), "busybox")
	require.NoError(t, os.WriteFile(p, h, 0o755))
	return p
}

// fakeKernel is a kernel file and a modules directory with the modules
// stage 1 loads (empty files: nothing boots them here).
func fakeKernel(t *testing.T) (kernel, modules string) {
	t.Helper()
	dir := t.TempDir()
	kernel = filepath.Join(dir, "vmlinuz")
	require.NoError(t, os.WriteFile(kernel, []byte("bzImage"), 0o644))
	modules = filepath.Join(dir, "lib", "modules", "6.1.0-test")
	dep := ""
	for _, m := range []string{"virtio_pci", "virtiofs", "overlay", "fuse"} {
		rel := "kernel/" + m + ".ko"
		require.NoError(t, os.MkdirAll(filepath.Join(modules, "kernel"), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(modules, rel), []byte("module "+m), 0o644))
		deps := ""
		if m == "virtiofs" {
			deps = " kernel/fuse.ko"
		}
		dep += rel + ":" + deps + "\n"
	}
	require.NoError(t, os.WriteFile(filepath.Join(modules, "modules.dep"), []byte(dep), 0o644))
	return kernel, modules
}

func validConfig(t *testing.T) Config {
	kernel, modules := fakeKernel(t)
	return Config{Kernel: kernel, Modules: modules, Work: t.TempDir(), Script: "echo hi", Busybox: staticELF(t)}
}

func TestConfigFillsInTheDefaults(t *testing.T) {
	c, err := validConfig(t).withDefaults()
	require.NoError(t, err)
	assert.Equal(t, DefaultMemoryMiB, c.MemoryMiB)
	assert.Equal(t, DefaultCPUs, c.CPUs)
	assert.Equal(t, DefaultTimeout, c.Timeout)
}

func TestConfigRefusesWhatTheVMCannotUse(t *testing.T) {
	for name, tc := range map[string]struct {
		edit func(c *Config)
		want string
	}{
		"relative work":         {func(c *Config) { c.Work = "work" }, "clean absolute path"},
		"quote in a path":       {func(c *Config) { c.Work = "/tmp/it's" }, "without quotes"},
		"newline in a path":     {func(c *Config) { c.Kernel = "/boot/a\nb" }, "without quotes or newlines"},
		"the host's root":       {func(c *Config) { c.Work = "/" }, "a directory of its own"},
		"work under HostRoot":   {func(c *Config) { c.Work = HostRoot + "/x" }, "a directory of its own"},
		"missing work":          {func(c *Config) { c.Work = "/nonexistent/work" }, "create it first"},
		"missing kernel":        {func(c *Config) { c.Kernel = "/nonexistent/vmlinuz" }, "make kernel"},
		"modules without a dep": {func(c *Config) { c.Modules = t.TempDir() }, "modules.dep"},
		"too little memory":     {func(c *Config) { c.MemoryMiB = 64 }, "at least 256 MiB"},
		"a dynamic busybox":     {func(c *Config) { c.Busybox = "/nonexistent/busybox" }, "apt-get install busybox-static"},
	} {
		t.Run(name, func(t *testing.T) {
			c := validConfig(t)
			tc.edit(&c)
			_, err := c.withDefaults()
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestABusyboxLinkedAgainstALibcIsRefused(t *testing.T) {
	// This test binary is linked dynamically when built with -race (cgo);
	// any dynamic executable of the host does.
	for _, p := range []string{"/bin/sh", "/usr/bin/env"} {
		if err := checkStatic(p); err != nil {
			assert.Contains(t, err.Error(), "dynamically linked")
			assert.Contains(t, err.Error(), "apt-get install busybox-static")
			return
		}
	}
	t.Fatal("no dynamically linked executable found to test with")
}

func TestAStaticBusyboxIsAccepted(t *testing.T) {
	assert.NoError(t, checkStatic(staticELF(t)))
}

func TestMissingNamesWhatToInstallInTurn(t *testing.T) {
	bin := t.TempDir()
	t.Setenv("PATH", bin)
	fake := func(name string) {
		require.NoError(t, os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"), 0o755))
	}
	assert.Contains(t, missing(staticELF(t), "/nonexistent/virtiofsd"), "qemu-system-x86_64 is not installed: apt-get install qemu-system-x86")
	fake("qemu-system-x86_64")
	assert.Contains(t, missing(staticELF(t), "/nonexistent/virtiofsd"), "virtiofsd is not installed")
	fake("virtiofsd")
	assert.Contains(t, missing("/nonexistent/busybox", "/nonexistent/virtiofsd"), "apt-get install busybox-static")
	want := ""
	if os.Geteuid() != 0 {
		want = "virtiofsd shares the host's root and needs root: run as root"
	}
	assert.Equal(t, want, missing(staticELF(t), "/nonexistent/virtiofsd"))
}

func TestGuestPathReachesTheHostsTmpAndRunThroughHostRoot(t *testing.T) {
	c := Config{Work: "/tmp/e2e/work"}
	assert.Equal(t, "/tmp/e2e/work", c.GuestPath("/tmp/e2e/work"), "the work share keeps its path")
	assert.Equal(t, "/tmp/e2e/work/e2e.log", c.GuestPath("/tmp/e2e/work/e2e.log"))
	assert.Equal(t, HostRoot+"/tmp/e2e/bins", c.GuestPath("/tmp/e2e/bins"), "the VM's /tmp is its own")
	assert.Equal(t, HostRoot+"/run/oac", c.GuestPath("/run/oac/"))
	assert.Equal(t, "/tmpfoo/x", c.GuestPath("/tmpfoo/x"))
	assert.Equal(t, "/work/main/e2e", c.GuestPath("/work/main/e2e"), "the rest of the host's root keeps its path")
}

func TestStage1MountsTheHostReadOnlyUnderAnOverlayAndTheWorkShareAtItsPath(t *testing.T) {
	s := stage1("/tmp/e2e/work")
	for _, want := range []string{
		"mount -t virtiofs -o ro hostroot /lower",
		"lowerdir=/lower,upperdir=/upper/upper,workdir=/upper/work overlay /newroot",
		"mount -t tmpfs -o mode=1777 tmpfs /newroot/tmp",
		"mount --move /lower /newroot" + HostRoot,
		"mount -t virtiofs work '/newroot/tmp/e2e/work'",
		"exec switch_root /newroot /bin/sh /run/hostvm/stage2.sh",
	} {
		assert.Contains(t, s, want)
	}
	// The work share is mounted after the fresh /tmp it may be under.
	assert.Less(t, strings.Index(s, "tmpfs /newroot/tmp"), strings.Index(s, "mount -t virtiofs work"))
}

func TestStage2RunsTheScriptAndReportsItsStatusBeforePoweringOff(t *testing.T) {
	s := stage2("/work/.cache/kernel/lib/modules/6.1.0-test")
	assert.Contains(t, s, "mount --bind '"+HostRoot+"/work/.cache/kernel/lib/modules/6.1.0-test' \"/lib/modules/$v\"")
	assert.Contains(t, s, "mount -t securityfs securityfs /sys/kernel/security")
	run := strings.Index(s, "/bin/sh /run/hostvm/script.sh </dev/null >/dev/ttyS1 2>&1")
	status := strings.Index(s, `echo "`+exitMarker+`$?" >/dev/console`)
	require.Positive(t, run)
	assert.Equal(t, strings.Index(s[run:], "\n")+run+1, status, "the status is the script's, the line after it")
	assert.True(t, strings.HasSuffix(s, "off\n"), "it powers off last")
}

func TestQemuArgsBoundMemoryAndShareItWithVirtiofsd(t *testing.T) {
	c := Config{Kernel: "/k/vmlinuz", MemoryMiB: 3072, CPUs: 2}
	a := strings.Join(qemuArgs(c, "hostvm-1", "/d/initramfs.img", "/d/output", [2]string{"/d/fs0.sock", "/d/fs1.sock"}), " ")
	for _, want := range []string{
		"-nodefaults", "-no-reboot", "-accel tcg", "-m 3072", "-smp 2",
		"memory-backend-memfd,id=mem,size=3072M,share=on", "-machine q35,memory-backend=mem",
		"-kernel /k/vmlinuz -initrd /d/initramfs.img", "console=ttyS0", "panic=-1",
		"-chardev file,id=out,path=/d/output",
		"-chardev socket,id=fs0,path=/d/fs0.sock -device vhost-user-fs-pci,chardev=fs0,tag=hostroot",
		"-chardev socket,id=fs1,path=/d/fs1.sock -device vhost-user-fs-pci,chardev=fs1,tag=work",
	} {
		assert.Contains(t, a, want)
	}
	assert.Less(t, strings.Index(a, "chardev:con"), strings.Index(a, "chardev:out"), "the console is ttyS0, the output ttyS1")
}

func TestScriptExitIsTheLastStatusOnTheConsole(t *testing.T) {
	code, ok := scriptExit([]byte("boot\r\nhostvm: running the script\r\n" + exitMarker + "3\r\n[ 4.1] reboot: Power down\r\n"))
	assert.True(t, ok)
	assert.Equal(t, 3, code)
	_, ok = scriptExit([]byte("hostvm: stage 1: mount the host's root (virtio-fs tag hostroot)\n"))
	assert.False(t, ok, "no status: the script never ran")
	_, ok = scriptExit([]byte(exitMarker))
	assert.False(t, ok, "a line cut short is no status")
}

func TestTheInitramfsHoldsTheStagesTheScriptBusyboxAndTheBootModules(t *testing.T) {
	c, err := validConfig(t).withDefaults()
	require.NoError(t, err)
	dir := t.TempDir()
	out := filepath.Join(dir, "initramfs.img")
	require.NoError(t, buildInitramfs(c, dir, out))
	f, err := os.Open(out)
	require.NoError(t, err)
	defer f.Close()
	zr, err := gzip.NewReader(f)
	require.NoError(t, err)
	raw, err := io.ReadAll(zr)
	require.NoError(t, err)
	entries, err := initramfs.ReadCpio(bytes.NewReader(raw), 1<<30)
	require.NoError(t, err)
	got := map[string]string{}
	for _, e := range entries {
		got[e.Name] = string(e.Data)
	}
	assert.Equal(t, stage1(c.Work), got["init"])
	assert.Equal(t, stage2(c.Modules), got["hostvm/stage2.sh"])
	assert.Equal(t, "echo hi", got["hostvm/script.sh"])
	assert.Contains(t, got, "bin/busybox")
	assert.Equal(t, "/lib/modules/6.1.0-test/kernel/virtio_pci.ko\n/lib/modules/6.1.0-test/kernel/fuse.ko\n"+
		"/lib/modules/6.1.0-test/kernel/virtiofs.ko\n/lib/modules/6.1.0-test/kernel/overlay.ko\n", got["etc/oac/modules"])
}

func TestRunRefusesABadConfigBeforeStartingAnything(t *testing.T) {
	c := validConfig(t)
	c.Work = "relative"
	r, err := Run(context.Background(), c)
	assert.Nil(t, r)
	assert.ErrorContains(t, err, "clean absolute path")
}

func TestTailBufferKeepsTheLastBytes(t *testing.T) {
	b := &tailBuffer{limit: 5}
	_, _ = b.Write([]byte("abc"))
	_, _ = b.Write([]byte("defg"))
	assert.Equal(t, "cdefg", b.String())
}

func TestReadTailReadsTheEndOfALargeFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "out")
	require.NoError(t, os.WriteFile(p, []byte("0123456789"), 0o644))
	b, err := readTail(p, 4)
	require.NoError(t, err)
	assert.Equal(t, "6789", string(b))
	b, err = readTail(filepath.Join(t.TempDir(), "none"), 4)
	assert.NoError(t, err, "no output file: the VM never wrote to it")
	assert.Empty(t, b)
}

func TestStopKillsAndWaitsForARunningProcess(t *testing.T) {
	p, err := start(exec.Command("sleep", "60"))
	require.NoError(t, err)
	pid := p.cmd.Process.Pid
	p.stop()
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		t.Fatal("stop returned before the process was waited for")
	}
	_, err = os.Stat("/proc/" + strconv.Itoa(pid))
	assert.ErrorIs(t, err, os.ErrNotExist, "the process is gone, reaped")
	p.stop() // twice is fine
}
