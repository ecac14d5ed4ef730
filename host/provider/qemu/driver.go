package qemu

import (
	"time"

	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/provider/kit"
)

// Provider boots guests as qemu virtual machines from a kernel and an
// initramfs that has oac-guest as /init (see package initramfs). It runs
// only on Linux; elsewhere the registered driver is unavailable.
type Provider struct {
	// Qemu is the qemu-system-x86_64 binary; default: found in PATH.
	Qemu string
	// Kernel and Initramfs are the boot images (required).
	Kernel, Initramfs string
	// Disk is an optional raw disk image attached read-only as virtio-blk.
	Disk string
	// Accel is AccelAuto (default), AccelKVM or AccelTCG.
	Accel string
	// Transport is TransportSerial (default) or TransportVsock.
	Transport string
	// MemoryMiB and CPUs size the VM (defaults DefaultMemory, DefaultCPUs).
	MemoryMiB, CPUs int
	// HostGrace is how long the guest waits for a lost host before it
	// powers off (0: the guest's default).
	HostGrace time.Duration
	// ExtraAppend is added to the kernel command line.
	ExtraAppend string
	// ConsoleLimit bounds forwarded console output (default
	// kit.DefaultConsoleLimit).
	ConsoleLimit int64
	// StateRoot holds per-sandbox state; default kit.DefaultStateRoot.
	StateRoot string
}

// Name implements provider.Provider.
func (p *Provider) Name() string { return "qemu" }

func init() {
	provider.Register(provider.Driver{
		Name: "qemu",
		Usage: "[--kernel FILE] [--initramfs FILE] [--disk FILE] [--accel auto|kvm|tcg]\n" +
			"[--memory MIB] [--vm-transport serial|vsock] [--host-grace DUR]",
		Flags: func(fs *provider.FlagSet) func() provider.Provider {
			kernel := fs.Path("kernel", "kernel image (default: vmlinuz beside oac-shim; make initramfs puts it there)")
			initramfs := fs.Path("initramfs", "initramfs with oac-guest as /init (default: initramfs.img beside oac-shim)")
			disk := fs.Path("disk", "raw disk image attached read-only as virtio-blk (the guest sees /dev/vda; oac-image build makes disk.ext4 and disk.erofs)")
			accel := fs.String("accel", AccelAuto, "accelerator: auto (kvm when it can run a stock kernel, else tcg), kvm or tcg")
			memory := fs.Int("memory", 0, "guest memory in MiB (default 256)")
			transport := fs.String("vm-transport", TransportSerial, "serial (virtio-serial) or vsock (needs /dev/vhost-vsock)")
			grace := fs.Duration("host-grace", 0, "the guest powers off after the host is gone this long (0: the guest's default, 30s)")
			return func() provider.Provider {
				p := &Provider{Kernel: *kernel, Initramfs: *initramfs, Disk: *disk, Accel: *accel, MemoryMiB: *memory, Transport: *transport, HostGrace: *grace}
				if p.Kernel == "" {
					p.Kernel = kit.BesideShim("vmlinuz")
				}
				if p.Initramfs == "" {
					p.Initramfs = kit.BesideShim("initramfs.img")
				}
				return p.driver()
			}
		},
	})
}
