package vz

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/host/provider"
)

func images(t *testing.T) (kernel, initramfs string) {
	t.Helper()
	dir := t.TempDir()
	kernel, initramfs = filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "initramfs.img")
	require.NoError(t, os.WriteFile(kernel, kernelFor(runtime.GOARCH), 0o644))
	require.NoError(t, os.WriteFile(initramfs, []byte("i"), 0o644))
	return
}

// kernelFor returns the start of a kernel image of arch: the boot header's
// magic where the kernel has it.
func kernelFor(arch string) []byte {
	b := make([]byte, 0x400)
	if arch == "arm64" {
		copy(b[0x38:], "ARM\x64")
	} else {
		copy(b[0x202:], "HdrS")
	}
	return b
}

func TestAssembleDefaults(t *testing.T) {
	k, i := images(t)
	c, err := Assemble(Settings{Kernel: k, Initramfs: i, HostCPUs: 8})
	require.NoError(t, err)
	assert.Equal(t, VMConfig{
		Kernel: k, Initramfs: i,
		CommandLine: "console=hvc0 panic=-1 quiet loglevel=3 oac.transport=vsock:1024",
		CPUs:        2, MemoryBytes: 512 << 20, VsockPort: 1024,
		Console: true, Entropy: true, Balloon: true,
	}, c)
}

func TestAssembleEverything(t *testing.T) {
	k, i := images(t)
	disk := filepath.Join(t.TempDir(), "disk.img")
	require.NoError(t, os.WriteFile(disk, nil, 0o644))
	share := t.TempDir()
	c, err := Assemble(Settings{Kernel: k, Initramfs: i, Disk: disk, Share: share, MemoryMiB: 1024, CPUs: 4, HostCPUs: 8,
		HostGrace: 45 * time.Second, Debug: true, ExtraAppend: "foo=bar"})
	require.NoError(t, err)
	assert.Equal(t, []Disk{{Path: disk, ReadOnly: true}}, c.Disks)
	assert.Equal(t, []Share{{Tag: "workspace", Path: share}}, c.Shares)
	assert.Equal(t, uint(4), c.CPUs)
	assert.Equal(t, uint64(1<<30), c.MemoryBytes)
	assert.Equal(t, "console=hvc0 panic=-1 quiet loglevel=3 oac.transport=vsock:1024 oac.host_grace=45s oac.debug=1 "+
		"oac.root=vda oac.shares=workspace:/environment/workspace foo=bar", c.CommandLine, "the guest boots the disk and mounts the workspace")

	home := t.TempDir()
	c, err = Assemble(Settings{Kernel: k, Initramfs: i, Disk: disk, DiskWritable: true, Share: share, ShareReadOnly: true,
		Volumes: map[string]string{"/home": home}})
	require.NoError(t, err)
	assert.False(t, c.Disks[0].ReadOnly)
	assert.Equal(t, []Share{{Tag: "workspace", Path: share, ReadOnly: true}, {Tag: "home", Path: home}}, c.Shares, "volumes are shares too")
	assert.Contains(t, c.CommandLine, "oac.shares=workspace:/environment/workspace:ro,home:/home")
}

func TestAssembleRefusesAKernelOfAnotherArchitecture(t *testing.T) {
	_, i := images(t)
	k := filepath.Join(t.TempDir(), "vmlinuz")
	require.NoError(t, os.WriteFile(k, kernelFor("amd64"), 0o644))
	_, err := Assemble(Settings{Kernel: k, Initramfs: i, HostArch: "arm64"})
	assert.ErrorIs(t, err, provider.ErrInvalidSpec)
	assert.ErrorContains(t, err, "is for amd64; this Mac runs arm64 guests only (make image ARCH=arm64 builds them)")
}

func TestCreateAppendsInstallsToACopyOfTheInitramfsAndDestroyRemovesIt(t *testing.T) {
	hv := &fakeHV{}
	p := newTestProvider(t, hv)
	bin := filepath.Join(t.TempDir(), "tool")
	require.NoError(t, os.WriteFile(bin, []byte("#!tool"), 0o755))
	inst, err := p.Create(context.Background(), provider.Spec{Name: "mac", AgentPath: "x", SandboxIOPath: bin})
	require.NoError(t, err)
	composed := hv.cfg.Initramfs
	assert.NotEqual(t, p.Initramfs, composed)
	b, err := os.ReadFile(composed)
	require.NoError(t, err)
	assert.True(t, bytes.HasPrefix(b, []byte("i\x00\x00\x00\x1f\x8b")), "the base, padded, then a gzip archive")
	require.NoError(t, inst.Destroy())
	_, err = os.Stat(composed)
	assert.True(t, os.IsNotExist(err), "Destroy removes the copy")

	_, err = p.Create(context.Background(), provider.Spec{Name: "mac", AgentPath: "x", Install: map[string]string{"x": filepath.Join(t.TempDir(), "missing")}})
	assert.ErrorIs(t, err, provider.ErrInvalidSpec)
	assert.ErrorContains(t, err, "install x:")
}

func TestAssembleDefaultCPUsFitTheHost(t *testing.T) {
	k, i := images(t)
	c, err := Assemble(Settings{Kernel: k, Initramfs: i, HostCPUs: 1})
	require.NoError(t, err)
	assert.Equal(t, uint(1), c.CPUs)
}

func TestAssembleRefuses(t *testing.T) {
	k, i := images(t)
	missing := filepath.Join(t.TempDir(), "missing")
	tests := map[string]struct {
		s    Settings
		want string
	}{
		"no kernel":          {Settings{Initramfs: i}, "no kernel given"},
		"missing initramfs":  {Settings{Kernel: k, Initramfs: missing}, "initramfs " + missing},
		"kernel a directory": {Settings{Kernel: t.TempDir(), Initramfs: i}, "not a regular file"},
		"too little memory":  {Settings{Kernel: k, Initramfs: i, MemoryMiB: 64}, "memory 64 MiB is outside 128..65536 MiB"},
		"too many cpus":      {Settings{Kernel: k, Initramfs: i, CPUs: 16, HostCPUs: 8}, "16 CPUs requested; this host has 8"},
		"missing disk":       {Settings{Kernel: k, Initramfs: i, Disk: missing}, "disk " + missing},
		"share not a dir":    {Settings{Kernel: k, Initramfs: i, Share: k}, "is not a directory"},
		"grace too long":     {Settings{Kernel: k, Initramfs: i, HostGrace: 2 * time.Hour}, "host grace"},
		"newline in append":  {Settings{Kernel: k, Initramfs: i, ExtraAppend: "a\nb"}, "newline"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := Assemble(tt.s)
			assert.ErrorIs(t, err, provider.ErrInvalidSpec)
			assert.ErrorContains(t, err, tt.want)
		})
	}
}

func TestValidTag(t *testing.T) {
	assert.NoError(t, validTag("workspace"))
	assert.Error(t, validTag(""))
	assert.Error(t, validTag(string(bytes.Repeat([]byte("a"), 37))))
	assert.Error(t, validTag("with space"))
}

func TestStates(t *testing.T) {
	for _, s := range []State{StateRunning, StatePaused, StateStarting, StatePausing, StateResuming, StateStopping, StateSaving, StateRestoring} {
		end, err := ended(s)
		assert.False(t, end, s.String())
		assert.NoError(t, err)
	}
	end, err := ended(StateStopped)
	assert.True(t, end)
	assert.EqualError(t, err, "virtual machine stopped")
	end, err = ended(StateError)
	assert.True(t, end)
	assert.ErrorContains(t, err, "internal error")
	end, _ = ended(State(42))
	assert.True(t, end)
	assert.Equal(t, "state(42)", State(42).String())
	assert.Equal(t, "stopping", StateStopping.String())
}

func TestMapError(t *testing.T) {
	hv := func(code int, desc string) error {
		return &HVError{Domain: "VZErrorDomain", Code: code, Description: desc}
	}
	tests := []struct {
		err  error
		want error
		text string
	}{
		{hv(2, "Invalid virtual machine configuration. The storage device attachment is invalid."), provider.ErrInvalidSpec, "VZErrorDomain code 2"},
		{hv(5, "The disk image is invalid."), provider.ErrInvalidSpec, ""},
		{hv(6, "The maximum number of virtual machines is exceeded."), provider.ErrUnavailable, "stop some sandboxes"},
		{hv(10, "Not supported."), provider.ErrUnavailable, ""},
		{hv(1, "The process doesn’t have the “com.apple.security.virtualization” entitlement."), provider.ErrUnavailable, "must be signed"},
		{hv(3, "Invalid virtual machine state."), provider.ErrNotStarted, ""},
		{ErrUnsupportedOS, provider.ErrUnavailable, "macOS 12 or newer"},
	}
	for _, tt := range tests {
		err := mapError("start virtual machine", tt.err)
		assert.ErrorIs(t, err, tt.want, tt.err.Error())
		assert.Contains(t, err.Error(), "vz: start virtual machine: ")
		assert.Contains(t, err.Error(), tt.text)
	}
	internal := hv(1, "The virtual machine stopped unexpectedly.")
	err := mapError("start", internal)
	assert.ErrorIs(t, err, internal)
	assert.False(t, errors.Is(err, provider.ErrUnavailable))
	assert.Nil(t, mapError("x", nil))
	plain := errors.New("boom")
	assert.ErrorIs(t, mapError("x", plain), plain)
}

// fakeHV is an in-memory hypervisor whose guest connects through a pipe.
func newTestProvider(t *testing.T, hv *fakeHV) *Provider {
	k, i := images(t)
	return &Provider{Settings: Settings{Kernel: k, Initramfs: i, HostCPUs: 4}, Hypervisor: hv}
}

func TestLifecycleOverAFakeHypervisor(t *testing.T) {
	hv := &fakeHV{}
	p := newTestProvider(t, hv)
	require.NoError(t, p.Check(context.Background()))
	var diag bytes.Buffer
	inst, err := p.Create(context.Background(), provider.Spec{Name: "mac", AgentPath: "unused", Stderr: &diag})
	require.NoError(t, err)
	in := inst.(*Instance)
	assert.Equal(t, uint32(1024), hv.m.port, "the host listens where the guest dials")
	assert.Equal(t, hv.cfg, in.Config())
	_, err = in.Accept(context.Background())
	assert.ErrorIs(t, err, provider.ErrNotStarted)

	require.NoError(t, in.Start(context.Background()))
	assert.Error(t, in.Start(context.Background()), "one start")
	guest := hv.m.guestDial()
	defer guest.Close()
	c, err := in.Accept(context.Background())
	require.NoError(t, err)
	defer c.Close()
	go func() { _, _ = guest.Write([]byte("hi")) }()
	b := make([]byte, 2)
	_, err = io.ReadFull(c, b)
	require.NoError(t, err)
	assert.Equal(t, "hi", string(b))
	assert.Equal(t, "Linux version 6.1\n", diag.String(), "the console reaches the diagnostics without CRs")

	require.NoError(t, in.Destroy())
	<-in.Done()
	assert.EqualError(t, in.Err(), "virtual machine stopped")
	require.NoError(t, in.Destroy(), "safe twice")
}

func TestGuestPowerOffEndsTheInstance(t *testing.T) {
	hv := &fakeHV{}
	p := newTestProvider(t, hv)
	inst, err := p.Create(context.Background(), provider.Spec{Name: "mac", AgentPath: "x"})
	require.NoError(t, err)
	require.NoError(t, inst.Start(context.Background()))
	hv.m.set(StateStopping)
	hv.m.set(StateError)
	select {
	case <-inst.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("an error state ends the instance")
	}
	assert.ErrorContains(t, inst.Err(), "internal error")
	_, err = inst.Accept(context.Background())
	assert.ErrorContains(t, err, "internal error", "Accept reports why the machine ended")
	require.NoError(t, inst.Destroy())
}

func TestAcceptGivesUpWithTheContext(t *testing.T) {
	hv := &fakeHV{}
	inst, err := newTestProvider(t, hv).Create(context.Background(), provider.Spec{Name: "mac", AgentPath: "x"})
	require.NoError(t, err)
	defer inst.Destroy()
	require.NoError(t, inst.Start(context.Background()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	_, err = inst.Accept(ctx)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestStartFailureIsMapped(t *testing.T) {
	hv := &fakeHV{}
	inst, err := newTestProvider(t, hv).Create(context.Background(), provider.Spec{Name: "mac", AgentPath: "x"})
	require.NoError(t, err)
	hv.m.startErr = &HVError{Domain: "VZErrorDomain", Code: 6, Description: "limit"}
	err = inst.Start(context.Background())
	assert.ErrorIs(t, err, provider.ErrUnavailable)
	<-inst.Done()
	require.NoError(t, inst.Destroy())
}

func TestCheckRefusesMissingImages(t *testing.T) {
	hv := &fakeHV{}
	p := newTestProvider(t, hv)
	p.Kernel = filepath.Join(t.TempDir(), "missing")
	err := p.Check(context.Background())
	assert.ErrorIs(t, err, provider.ErrUnavailable)
	assert.ErrorContains(t, err, "make initramfs")
	_, err = p.Create(context.Background(), provider.Spec{Name: "mac", AgentPath: "x"})
	assert.ErrorIs(t, err, provider.ErrUnavailable)
	assert.Nil(t, hv.m, "nothing created")

	hv.unavailable = ErrUnsupportedOS
	assert.ErrorIs(t, p.Check(context.Background()), provider.ErrUnavailable)
}

func TestCreateRefusesRootfsAndMapsHypervisorErrors(t *testing.T) {
	hv := &fakeHV{}
	p := newTestProvider(t, hv)
	_, err := p.Create(context.Background(), provider.Spec{Name: "mac", AgentPath: "x", Rootfs: "/img"})
	assert.ErrorIs(t, err, provider.ErrInvalidSpec)
	hv.newErr = &HVError{Domain: "VZErrorDomain", Code: 2, Description: "Invalid virtual machine configuration."}
	_, err = p.Create(context.Background(), provider.Spec{Name: "mac", AgentPath: "x"})
	assert.ErrorIs(t, err, provider.ErrInvalidSpec)
	assert.ErrorContains(t, err, "create virtual machine")
}

func TestPlatformHypervisorOffMacOS(t *testing.T) {
	err := platformHypervisor().Available()
	if err == nil {
		return // a cgo build on macOS
	}
	assert.ErrorIs(t, err, provider.ErrUnavailable)
	p := &Provider{}
	assert.ErrorIs(t, p.Check(context.Background()), provider.ErrUnavailable)
}

// fakeMkfs is a mkfs.ext4 stand-in that only succeeds.
func fakeMkfs(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "mkfs.ext4")
	require.NoError(t, os.WriteFile(p, []byte("#!/bin/sh\nexit 0\n"), 0o755))
	return p
}

func TestAKeptSandboxBootsAClonedImageAndAKeptDiskThatDiscardRemoves(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("the stand-in mkfs.ext4 is a shell script")
	}
	hv := &fakeHV{}
	p := newTestProvider(t, hv)
	p.Mkfs = fakeMkfs(t)
	p.Disk = filepath.Join(t.TempDir(), "disk.ext4")
	require.NoError(t, os.WriteFile(p.Disk, []byte("image"), 0o644))
	dir := t.TempDir()
	spec := provider.Spec{Name: "kept", AgentPath: "x", Keep: &provider.Keep{Dir: dir}}

	in, err := p.Create(context.Background(), spec)
	require.NoError(t, err)
	assert.Equal(t, []Disk{{Path: filepath.Join(dir, "image.disk"), ReadOnly: true}, {Path: filepath.Join(dir, "kept.ext4")}}, hv.cfg.Disks,
		"the image's copy read-only, then the kept disk read-write")
	assert.Contains(t, hv.cfg.CommandLine, "oac.root=vda oac.keep=vdb")
	assert.Empty(t, in.(provider.ImageChecker).ImageChanged())
	require.NoError(t, in.Destroy())
	_, err = os.Stat(filepath.Join(dir, "kept.ext4"))
	require.NoError(t, err, "Destroy keeps the kept disk")

	require.NoError(t, os.WriteFile(p.Disk, []byte("rebuilt image"), 0o644))
	in, err = p.Create(context.Background(), spec)
	require.NoError(t, err)
	assert.Contains(t, in.(provider.ImageChecker).ImageChanged(), "until reset", "a changed image is told")
	b, err := os.ReadFile(filepath.Join(dir, "image.disk"))
	require.NoError(t, err)
	assert.Equal(t, "image", string(b), "and the old one kept")
	require.NoError(t, in.Destroy())

	var k provider.Keeper = p
	require.NoError(t, k.Discard(context.Background(), "kept", dir))
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, ents, "Discard leaves nothing")
	require.NoError(t, k.Discard(context.Background(), "kept", dir), "twice is fine")

	p.Disk = ""
	_, err = p.Create(context.Background(), spec)
	require.NoError(t, err)
	assert.Equal(t, []Disk{{Path: filepath.Join(dir, "kept.ext4")}}, hv.cfg.Disks, "without a root disk, only the kept disk")
	assert.Contains(t, hv.cfg.CommandLine, "oac.keep=vda")
}
