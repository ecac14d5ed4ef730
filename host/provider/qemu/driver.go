package qemu

import (
	"time"

	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/provider/kit"
)

// Provider boots guests as qemu virtual machines from a kernel and an
// initramfs that has oac-guest as /init (see package initramfs) and, with
// a disk, from the image's root disk. It runs only on Linux; elsewhere the
// registered driver is unavailable.
type Provider struct {
	// Qemu is the qemu-system binary; default: qemu-system-x86_64 or
	// qemu-system-aarch64 (by the guest's architecture) found in PATH.
	Qemu string
	// Kernel and Initramfs are the boot images (required; the driver's
	// default: vmlinuz and initramfs.img beside oac-shim).
	Kernel    string `flag:"kernel,path" meta:"FILE" usage:"kernel image (default: vmlinuz beside oac-shim; make initramfs puts it there)"`
	Initramfs string `flag:"initramfs,path" meta:"FILE" usage:"initramfs with oac-guest as /init (default: initramfs.img beside oac-shim)"`
	// Disk is the image's root disk (oac-image build's disk.ext4 or
	// disk.erofs), attached read-only as virtio-blk: the guest mounts it
	// as its root. Without it the guest runs from its initramfs.
	Disk string `flag:"disk,path" meta:"FILE" usage:"the image's root disk (oac-image build's disk.ext4 or disk.erofs), attached read-only: the guest boots from it (without it, from its initramfs)"`
	// Share is a host directory mounted over virtio-fs as the guest's
	// workspace (/environment/workspace).
	Share string `flag:"share,path" meta:"DIR" usage:"host directory mounted over virtio-fs as the guest's workspace, /environment/workspace (tag workspace; needs root)"`
	// Arch is the guest's architecture, amd64 or arm64; default: the
	// kernel image's.
	Arch string `flag:"arch" meta:"amd64|arm64" usage:"guest architecture (default: the kernel image's)"`
	// Firmware is UEFI firmware to boot the kernel through; default for
	// arm64: DefaultARM64Firmware when installed (else the kernel is
	// loaded directly), none for amd64.
	Firmware string `flag:"firmware,path" meta:"FILE" usage:"UEFI firmware to boot the kernel through (default for arm64: Debian's qemu-efi-aarch64 when installed)"`
	// Virtiofsd is the virtio-fs daemon for shares and volumes; default
	// DefaultVirtiofsd, else virtiofsd in PATH.
	Virtiofsd string
	// Accel is AccelAuto (default), AccelKVM or AccelTCG.
	Accel string `flag:"accel" meta:"auto|kvm|tcg" usage:"accelerator: auto (kvm when it can run a stock kernel, else tcg), kvm or tcg"`
	// MemoryMiB and CPUs size the VM (defaults DefaultMemory, DefaultCPUs).
	MemoryMiB int `flag:"memory" meta:"MIB" usage:"guest memory in MiB (default 256)"`
	CPUs      int
	// Transport is TransportSerial (default) or TransportVsock.
	Transport string `flag:"vm-transport" meta:"serial|vsock" usage:"serial (virtio-serial) or vsock (needs /dev/vhost-vsock)"`
	// HostGrace is how long the guest waits for a lost host before it
	// powers off (0: the guest's default).
	HostGrace time.Duration `flag:"host-grace" meta:"DUR" usage:"the guest powers off after the host is gone this long (0: the guest's default, 30s)"`
	// ExtraAppend is added to the kernel command line.
	ExtraAppend string
	// ConsoleLimit bounds forwarded console output (default
	// kit.DefaultConsoleLimit).
	ConsoleLimit int64
	// StateRoot holds per-sandbox state; default kit.UserStateRoot's
	// (kit.DefaultStateRoot as root).
	StateRoot string
	// Mkfs is mkfs.ext4, which makes a kept sandbox's disk; default: found
	// in PATH or /usr/sbin (package e2fsprogs).
	Mkfs string
	// KeptDiskSize is the size in bytes of a kept sandbox's disk (a
	// sparse file); default vmkeep.DefaultDiskSize.
	KeptDiskSize int64
	// IDBase is the first host id of the id ranges virtiofsd maps the
	// guest's ids to; default kit.DefaultIDBase (the slots the bwrap and
	// OCI providers draw from).
	IDBase int
}

// Name implements provider.Provider.
func (p *Provider) Name() string { return "qemu" }

func init() {
	provider.Register(provider.Driver[Provider]{
		Name: "qemu", Defaults: &Provider{Accel: AccelAuto, Transport: TransportSerial},
		New: func(p *Provider) provider.Provider {
			p.Kernel, p.Initramfs = kit.BootImages(p.Kernel, p.Initramfs)
			return p.driver()
		},
	})
}

// Capabilities implements provider.Provider: --sandbox-io and --install
// reach the guest in an archive appended to the initramfs, --volume as a
// virtio-fs share; the root is the image's disk (--disk), not --rootfs;
// a kept sandbox is a disk of its own; the guest's clock and kernel are
// its own.
func (p *Provider) Capabilities() provider.Capabilities {
	return provider.Capabilities{
		GuestRootUnprivileged: true,
		Honours:               []provider.Feature{provider.FeatureSandboxIO, provider.FeatureInstall, provider.FeatureVolume},
		Instead:               map[provider.Feature]string{provider.FeatureRootfs: "qemu guests boot the image's root disk: pass --disk DISK (oac-image build's disk.ext4 or disk.erofs)"},
		Keeps:                 true,
		OwnClock:              true,
	}
}
