//go:build linux

package qemu

import (
	"bytes"
	"compress/gzip"
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/initramfs"
)

// fakeProvider returns a provider whose "qemu" is a shell script.
func fakeProvider(t *testing.T, script string) *Provider {
	t.Helper()
	dir, err := os.MkdirTemp("", "oacq") // short: unix socket paths are limited
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	q := filepath.Join(dir, "qemu")
	require.NoError(t, os.WriteFile(q, []byte("#!/bin/sh\n"+script+"\n"), 0o755))
	k := filepath.Join(dir, "vmlinuz")
	i := filepath.Join(dir, "initramfs.img")
	require.NoError(t, os.WriteFile(k, fakeBzImage(), 0o644))
	require.NoError(t, os.WriteFile(i, []byte("i"), 0o644))
	return &Provider{Qemu: q, Kernel: k, Initramfs: i, Accel: AccelTCG, StateRoot: filepath.Join(dir, "state")}
}

// fakeBzImage has the x86 boot header's magic where the kernel has it.
func fakeBzImage() []byte {
	b := make([]byte, 0x400)
	copy(b[0x202:], "HdrS")
	return b
}

func TestCreateRefusesWhatItCannotBoot(t *testing.T) {
	p := fakeProvider(t, "exit 0")
	ctx := context.Background()
	_, err := p.Create(ctx, provider.Spec{Name: "x", AgentPath: "/a", Rootfs: "/some/dir"})
	assert.ErrorIs(t, err, provider.ErrInvalidSpec)
	assert.ErrorContains(t, err, "pass --disk DISK")

	missing := *p
	missing.Initramfs = filepath.Join(t.TempDir(), "nope.img")
	_, err = missing.Create(ctx, provider.Spec{Name: "x", AgentPath: "/a"})
	assert.ErrorIs(t, err, provider.ErrUnavailable)
	assert.ErrorContains(t, err, "make initramfs builds it")

	bad := *p
	bad.Accel = "fast"
	assert.ErrorIs(t, bad.Check(ctx), provider.ErrInvalidSpec)
	bad = *p
	bad.Transport = "tcp"
	assert.ErrorIs(t, bad.Check(ctx), provider.ErrInvalidSpec)
	if _, err := os.Stat(devVhostVsock); err != nil {
		bad.Transport = TransportVsock
		err := bad.Check(ctx)
		assert.ErrorIs(t, err, provider.ErrUnavailable)
		assert.ErrorContains(t, err, "/dev/vhost-vsock")
	}
	_, err = os.Stat(filepath.Join(p.StateRoot, "sandboxes", "x"))
	assert.True(t, os.IsNotExist(err), "nothing left behind")
}

func TestInstanceCapturesTheConsoleAndReportsPowerOff(t *testing.T) {
	p := fakeProvider(t, `printf 'Linux version\r\n'; echo "$@" >&2; exit 0`)
	var diag syncBuffer
	in, err := p.Create(context.Background(), provider.Spec{Name: "con", AgentPath: "/a", Stderr: &diag})
	require.NoError(t, err)
	defer in.Destroy()
	sock := filepath.Join(p.StateRoot, "sandboxes", "con", "agent.sock")
	st, err := os.Stat(sock)
	require.NoError(t, err)
	assert.NotZero(t, st.Mode()&os.ModeSocket, "the shim listens before qemu starts")

	require.NoError(t, in.Start(context.Background()))
	select {
	case <-in.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("fake qemu did not exit")
	}
	assert.EqualError(t, in.Err(), "virtual machine powered off")
	assert.Contains(t, diag.String(), "Linux version\n")
	assert.Contains(t, diag.String(), "server=off,path="+sock)
	_, err = in.Accept(context.Background())
	assert.EqualError(t, err, "virtual machine powered off", "Accept gives up when qemu is gone")

	require.NoError(t, in.Destroy())
	_, err = os.Stat(filepath.Dir(sock))
	assert.True(t, os.IsNotExist(err), "Destroy removes the state directory")
}

func TestKillStopsQemuAndTheNameIsFreeAgain(t *testing.T) {
	p := fakeProvider(t, "exec sleep 1000")
	in, err := p.Create(context.Background(), provider.Spec{Name: "k", AgentPath: "/a"})
	require.NoError(t, err)
	_, err = p.Create(context.Background(), provider.Spec{Name: "k", AgentPath: "/a"})
	assert.ErrorIs(t, err, provider.ErrExists)
	require.NoError(t, in.Start(context.Background()))
	assert.NotZero(t, in.(*Instance).HostPID())
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err = in.Accept(ctx)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	require.NoError(t, in.Kill())
	assert.ErrorContains(t, in.Err(), "qemu exited: signal: killed")
	require.NoError(t, in.Destroy())
	again, err := p.Create(context.Background(), provider.Spec{Name: "k", AgentPath: "/a"})
	require.NoError(t, err)
	require.NoError(t, again.Destroy())
}

func TestIDMapGivesUID1000ToTheShareOwner(t *testing.T) {
	const base = 1_000_065_536
	assert.Equal(t, []syscall.SysProcIDMap{{ContainerID: 0, HostID: base, Size: 65536}}, idMap(base, 0),
		"a share owned by root: the sandbox's own range, guest root is never host root")
	assert.Equal(t, []syscall.SysProcIDMap{{ContainerID: 0, HostID: base, Size: 65536}}, idMap(base, base+1000),
		"an owner in the range already maps")
	assert.Equal(t, []syscall.SysProcIDMap{
		{ContainerID: 0, HostID: base, Size: 1000},
		{ContainerID: 1000, HostID: 501, Size: 1},
		{ContainerID: 1001, HostID: base + 1001, Size: 64535},
	}, idMap(base, 501), "uid 1000 writes as the owner, as on macOS")
}

func TestSharesAndVolumesRunVirtiofsdInThePrivateIDRange(t *testing.T) {
	p := fakeProvider(t, `echo "qemu $*" >&2; exit 0`)
	vfs := filepath.Join(filepath.Dir(p.Qemu), "virtiofsd")
	require.NoError(t, os.WriteFile(vfs, []byte("#!/bin/sh\necho \"$* uid_map=$(tr -s ' ' < /proc/self/uid_map | tr '\\n' ';')\" >&2\n"), 0o755))
	p.Virtiofsd = vfs
	p.IDBase = 2_000_000_000
	// virtiofsd runs as a host id of the range: every parent must be
	// searchable by others.
	parent, err := os.MkdirTemp("", "oacq-shares")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(parent) })
	work, home := filepath.Join(parent, "work"), filepath.Join(parent, "home")
	require.NoError(t, os.Mkdir(work, 0o755))
	require.NoError(t, os.Mkdir(home, 0o777))
	_, err = p.Create(context.Background(), provider.Spec{Name: "fs", AgentPath: "/a", Volumes: map[string]string{"/home": home}})
	assert.ErrorContains(t, err, "share "+home+": "+parent+" is not searchable by others (mode 0700)")
	for _, d := range []string{filepath.Dir(p.Qemu), parent} {
		require.NoError(t, os.Chmod(d, 0o755))
	}
	require.NoError(t, os.Chown(work, 501, 20))
	p.Share = work
	var diag syncBuffer
	in, err := p.Create(context.Background(), provider.Spec{Name: "fs", AgentPath: "/a", Stderr: &diag, Volumes: map[string]string{"/home": home}})
	require.NoError(t, err)
	defer in.Destroy()
	state := filepath.Join(p.StateRoot, "sandboxes", "fs")
	for _, sock := range []string{"fs0.sock", "fs1.sock"} {
		st, err := os.Stat(filepath.Join(state, sock))
		require.NoError(t, err, sock)
		assert.NotZero(t, st.Mode()&os.ModeSocket, "%s exists before virtiofsd and qemu start", sock)
	}
	require.NoError(t, in.Start(context.Background()))
	<-in.Done()
	require.Eventually(t, func() bool { return strings.Count(diag.String(), "uid_map=") == 2 }, 10*time.Second, 10*time.Millisecond)
	out := diag.String()
	assert.Contains(t, out, "oac.shares=workspace:/environment/workspace,home:/home")
	assert.Contains(t, out, "vhost-user-fs-pci,chardev=fs1,tag=home")
	assert.Contains(t, out, "memory-backend-memfd,id=mem,size=256M,share=on")
	assert.Regexp(t, `virtiofsd\[home\]: --fd=3 -o source=`+home+` .* uid_map= 0 2000000000 65536;`, out,
		"a root-owned volume: the guest's ids are the sandbox's range")
	assert.Regexp(t, `virtiofsd\[workspace\]: --fd=3 -o source=`+work+` .* uid_map= 0 2000000000 1000; 1000 501 1; 1001 2000001001 64535;`, out,
		"the workspace's owner is guest uid 1000")
}

func TestInstallsAreAppendedToTheInitramfs(t *testing.T) {
	p := fakeProvider(t, "exit 0")
	bin := filepath.Join(t.TempDir(), "tool")
	require.NoError(t, os.WriteFile(bin, []byte("#!tool"), 0o700))
	in, err := p.Create(context.Background(), provider.Spec{Name: "inst", AgentPath: "/a", SandboxIOPath: bin, Install: map[string]string{"helper": bin}})
	require.NoError(t, err)
	defer in.Destroy()
	args := argString(in.(*Instance).Args())
	composed := filepath.Join(p.StateRoot, "sandboxes", "inst", "initramfs.img")
	assert.Contains(t, args, "-initrd "+composed)
	b, err := os.ReadFile(composed)
	require.NoError(t, err)
	assert.Equal(t, "i\x00\x00\x00", string(b[:4]), "the base, padded to 4 bytes")
	zr, err := gzip.NewReader(bytes.NewReader(b[4:]))
	require.NoError(t, err)
	entries, err := initramfs.ReadCpio(zr, 1<<20)
	require.NoError(t, err)
	got := map[string]string{}
	for _, e := range entries {
		got[e.Name] = e.Mode.String()
	}
	assert.Equal(t, map[string]string{
		"usr": "drwxr-xr-x", "usr/local": "drwxr-xr-x", "usr/local/bin": "drwxr-xr-x",
		"usr/local/bin/helper": "-rwxr-xr-x", "usr/local/bin/oac-sandbox-io": "-rwxr-xr-x",
	}, got)
}

func TestCreateRefusesMissingSharesAndInstallsBeforeCreatingAnything(t *testing.T) {
	p := fakeProvider(t, "exit 0")
	ctx := context.Background()
	missing := filepath.Join(t.TempDir(), "missing")
	p.Share = missing
	_, err := p.Create(ctx, provider.Spec{Name: "x", AgentPath: "/a"})
	assert.ErrorIs(t, err, provider.ErrInvalidSpec)
	assert.ErrorContains(t, err, "shared directory: "+missing+" is not a directory")
	p.Share = ""
	_, err = p.Create(ctx, provider.Spec{Name: "x", AgentPath: "/a", Volumes: map[string]string{"/environment": missing}})
	assert.ErrorContains(t, err, "volume /environment: "+missing+" is not a directory")
	_, err = p.Create(ctx, provider.Spec{Name: "x", AgentPath: "/a", SandboxIOPath: missing})
	assert.ErrorIs(t, err, provider.ErrInvalidSpec)
	assert.ErrorContains(t, err, "install oac-sandbox-io: "+missing+" is not a readable file")
	_, err = os.Stat(filepath.Join(p.StateRoot, "sandboxes", "x"))
	assert.True(t, os.IsNotExist(err), "nothing left behind")
}

func TestDetailSaysHowTheVMWouldRun(t *testing.T) {
	p := fakeProvider(t, "exit 0")
	d := p.Detail(context.Background())
	assert.Contains(t, d, "amd64 q35 under TCG software emulation")
	if _, err := os.Stat(devVhostVsock); err != nil {
		assert.Contains(t, d, "virtio-serial transport (vsock needs /dev/vhost-vsock, which this host lacks)")
	}
	assert.Contains(t, d, "initramfs only")
	assert.Contains(t, d, "state in "+p.StateRoot)
}

func TestAKeptSandboxKeepsItsDisksAcrossInstancesUntilDiscard(t *testing.T) {
	p := fakeProvider(t, "exit 0")
	mkfs := filepath.Join(t.TempDir(), "mkfs.ext4")
	require.NoError(t, os.WriteFile(mkfs, []byte("#!/bin/sh\nexit 0\n"), 0o755))
	p.Mkfs = mkfs
	p.Disk = filepath.Join(t.TempDir(), "disk.erofs")
	require.NoError(t, os.WriteFile(p.Disk, []byte("image"), 0o644))
	dir := t.TempDir()
	spec := provider.Spec{Name: "kept", AgentPath: "x", Keep: &provider.Keep{Dir: dir}}

	in, err := p.Create(context.Background(), spec)
	require.NoError(t, err)
	args := argString(in.(*Instance).Args())
	assert.Contains(t, args, "file="+filepath.Join(dir, "image.disk"), "the kept sandbox boots its copy of the image")
	assert.Contains(t, args, "file="+filepath.Join(dir, "kept.ext4"))
	assert.Empty(t, in.(provider.ImageChecker).ImageChanged())
	require.NoError(t, in.Destroy())
	_, err = os.Stat(filepath.Join(dir, "kept.ext4"))
	require.NoError(t, err, "Destroy leaves the kept state")
	_, err = os.Stat(filepath.Join(p.StateRoot, "sandboxes", "kept"))
	assert.True(t, os.IsNotExist(err), "and removes the run's state")

	require.NoError(t, os.WriteFile(p.Disk, []byte("another image"), 0o644))
	in, err = p.Create(context.Background(), spec)
	require.NoError(t, err)
	assert.Contains(t, in.(provider.ImageChecker).ImageChanged(), "until reset")
	require.NoError(t, in.Destroy())

	var k provider.Keeper = p
	require.NoError(t, k.Discard(context.Background(), "kept", dir))
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, ents, "Discard leaves nothing in the directory")
	require.NoError(t, k.Discard(context.Background(), "kept", dir), "twice is fine")
}
