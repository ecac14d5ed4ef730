package vz

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/provider/vmguest"
)

// Defaults and limits of a vz guest.
const (
	DefaultMemoryMiB = 512
	MinMemoryMiB     = 128
	MaxMemoryMiB     = 64 << 10
	DefaultCPUs      = 2
	// VsockPort is the host port the guest dials on the host's CID (2):
	// the agent's default (guest/agent.DefaultVsockPort).
	VsockPort uint32 = 1024
	// ShareTag is the virtio-fs tag of the optional workspace share; the
	// guest mounts it on /environment/workspace.
	ShareTag = vmguest.WorkspaceTag
	// maxTagLen is Virtualization.framework's limit on virtio-fs tags.
	maxTagLen = 36
	// DefaultConsoleLimit bounds forwarded console output.
	DefaultConsoleLimit = 1 << 20
)

// Disk is one virtio-blk disk image.
type Disk struct {
	Path     string
	ReadOnly bool
}

// Share is one virtio-fs shared directory.
type Share struct {
	Tag      string
	Path     string
	ReadOnly bool
}

// VMConfig is the whole virtual machine, decided by portable code; the
// darwin-only Hypervisor turns it into Virtualization.framework objects
// without making any decision of its own.
type VMConfig struct {
	// Linux boot loader.
	Kernel, Initramfs, CommandLine string
	CPUs                           uint
	MemoryBytes                    uint64
	Disks                          []Disk
	// VsockPort is where the host listens on the virtio socket device.
	VsockPort uint32
	// Console attaches a virtio console (hvc0) whose output goes to the
	// sandbox's diagnostics.
	Console bool
	Entropy bool
	Balloon bool
	Shares  []Share
}

// Settings are the provider's knobs that shape a VM.
type Settings struct {
	// Kernel and Initramfs are the boot images (the driver's default:
	// vmlinuz and initramfs.img beside oac-shim).
	Kernel    string `flag:"kernel,path" meta:"FILE" usage:"kernel image (default: vmlinuz beside oac-shim)"`
	Initramfs string `flag:"initramfs,path" meta:"FILE" usage:"initramfs with oac-guest as /init (default: initramfs.img beside oac-shim)"`
	// Disk is the image's root disk (oac-image build's disk.ext4 or
	// disk.erofs), attached as virtio-blk read-only unless DiskWritable;
	// the guest mounts it as its root (read-only either way). Without it
	// the guest runs from its initramfs.
	Disk         string `flag:"disk,path" meta:"FILE" usage:"the image's root disk, attached read-only: the guest boots from it"`
	DiskWritable bool
	// Kept is a kept sandbox's disk (package vmkeep), attached read-write
	// after Disk; Create sets it from provider.Spec.Keep.
	Kept string
	// Mkfs is mkfs.ext4, which makes a kept sandbox's disk; default: in
	// PATH or Homebrew's e2fsprogs (brew install e2fsprogs).
	Mkfs string
	// KeptDiskSize is the size in bytes of a kept sandbox's disk (a
	// sparse file); default vmkeep.DefaultDiskSize.
	KeptDiskSize int64
	// Share is an optional host directory shared as ShareTag and mounted
	// on /environment/workspace (read-write unless ShareReadOnly).
	Share         string `flag:"share,path" meta:"DIR" usage:"host directory shared over virtio-fs as the guest's workspace, /environment/workspace (tag workspace)"`
	ShareReadOnly bool
	// Volumes replace guest runtime directories with host directories
	// (provider.Spec.Volumes), each a virtio-fs share.
	Volumes map[string]string
	// HostArch is the architecture guests must have (the host's; empty:
	// not checked).
	HostArch  string
	MemoryMiB int `flag:"memory" meta:"MIB" usage:"guest memory in MiB (default 512)"`
	CPUs      int `flag:"cpus" meta:"N" usage:"virtual CPUs (default 2, at most the host's)"`
	// HostCPUs bounds CPUs (0: not checked).
	HostCPUs    int
	HostGrace   time.Duration `flag:"host-grace" meta:"DUR" usage:"the guest powers off after the host is gone this long (0: the guest's default, 30s)"`
	ExtraAppend string
	Debug       bool
}

// Assemble decides the VM for s: every path checked, sizes bounded, the
// kernel command line written. Errors wrap provider.ErrInvalidSpec.
func Assemble(s Settings) (VMConfig, error) {
	c := VMConfig{
		Kernel: s.Kernel, Initramfs: s.Initramfs, VsockPort: VsockPort,
		Console: true, Entropy: true, Balloon: true,
	}
	bad := func(format string, a ...any) (VMConfig, error) {
		return VMConfig{}, fmt.Errorf("%w: vz: %s", provider.ErrInvalidSpec, fmt.Sprintf(format, a...))
	}
	for _, f := range []struct{ what, path string }{{"kernel", s.Kernel}, {"initramfs", s.Initramfs}} {
		if f.path == "" {
			return bad("no %s given", f.what)
		}
		if err := regular(f.path); err != nil {
			return bad("%s %s: %v", f.what, f.path, err)
		}
	}
	mem := s.MemoryMiB
	if mem == 0 {
		mem = DefaultMemoryMiB
	}
	if mem < MinMemoryMiB || mem > MaxMemoryMiB {
		return bad("memory %d MiB is outside %d..%d MiB", mem, MinMemoryMiB, MaxMemoryMiB)
	}
	c.MemoryBytes = uint64(mem) << 20
	cpus := s.CPUs
	if cpus == 0 {
		cpus = DefaultCPUs
		if s.HostCPUs > 0 && cpus > s.HostCPUs {
			cpus = s.HostCPUs
		}
	}
	if cpus < 1 || (s.HostCPUs > 0 && cpus > s.HostCPUs) {
		return bad("%d CPUs requested; this host has %d", cpus, s.HostCPUs)
	}
	c.CPUs = uint(cpus)
	if s.Disk != "" {
		if err := regular(s.Disk); err != nil {
			return bad("disk %s: %v", s.Disk, err)
		}
		c.Disks = append(c.Disks, Disk{Path: s.Disk, ReadOnly: !s.DiskWritable})
	}
	if s.Kept != "" {
		if err := regular(s.Kept); err != nil {
			return bad("kept disk %s: %v", s.Kept, err)
		}
		// After the root disk: the guest finds it as the next device
		// (vmparams.KeepDevice).
		c.Disks = append(c.Disks, Disk{Path: s.Kept})
	}
	if s.HostArch != "" {
		arch, err := vmguest.KernelArch(s.Kernel)
		if err != nil {
			return bad("%v", err)
		}
		if arch != s.HostArch {
			return bad("kernel %s is for %s; this Mac runs %s guests only (make image ARCH=%s builds them)", s.Kernel, arch, s.HostArch, s.HostArch)
		}
	}
	shares, err := vmguest.Shares(s.Share, s.ShareReadOnly, s.Volumes)
	if err != nil {
		return VMConfig{}, fmt.Errorf("vz: %w", err)
	}
	for _, sh := range shares {
		if err := validTag(sh.Tag); err != nil {
			return bad("%v", err)
		}
		c.Shares = append(c.Shares, Share{Tag: sh.Tag, Path: sh.HostPath, ReadOnly: sh.ReadOnly})
	}
	if s.HostGrace < 0 || s.HostGrace > time.Hour {
		return bad("host grace %s is outside 0..1h", s.HostGrace)
	}
	if strings.ContainsAny(s.ExtraAppend, "\n\x00") {
		return bad("the extra kernel command line holds a newline or NUL")
	}
	c.CommandLine = kernelCmdline(c.VsockPort, s.HostGrace, s.Debug, vmguest.KernelParams(s.Disk != "", s.Kept != "", shares), s.ExtraAppend)
	return c, nil
}

// kernelCmdline returns the guest kernel's command line: console on the
// virtio console, reboot (and so stop) at once on panic, and the oac.*
// settings guest/vminit reads; the guest dials the host (CID 2) on port.
func kernelCmdline(port uint32, grace time.Duration, debug bool, guest []string, extra string) string {
	parts := []string{"console=hvc0", "panic=-1", "quiet", "loglevel=3", fmt.Sprintf("oac.transport=vsock:%d", port)}
	if grace > 0 {
		parts = append(parts, "oac.host_grace="+grace.String())
	}
	if debug {
		parts = append(parts, "oac.debug=1")
	}
	parts = append(parts, guest...)
	if extra != "" {
		parts = append(parts, extra)
	}
	return strings.Join(parts, " ")
}

func regular(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return errors.Unwrap(err)
	}
	if !st.Mode().IsRegular() {
		return errors.New("not a regular file")
	}
	return nil
}

func validTag(tag string) error {
	if tag == "" || len(tag) > maxTagLen {
		return fmt.Errorf("virtio-fs tag %q must be 1 to %d bytes", tag, maxTagLen)
	}
	for _, r := range tag {
		if r < 0x21 || r > 0x7e {
			return fmt.Errorf("virtio-fs tag %q must be printable ASCII without spaces", tag)
		}
	}
	return nil
}
