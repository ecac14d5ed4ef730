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
	// Kernel and Initramfs are the boot images (required; the driver's
	// default: vmlinuz and initramfs.img beside oac-shim).
	Kernel    string `flag:"kernel,path" meta:"FILE" usage:"kernel image (default: vmlinuz beside oac-shim; make initramfs puts it there)"`
	Initramfs string `flag:"initramfs,path" meta:"FILE" usage:"initramfs with oac-guest as /init (default: initramfs.img beside oac-shim)"`
	// Disk is an optional raw disk image attached read-only as virtio-blk.
	Disk string `flag:"disk,path" meta:"FILE" usage:"raw disk image attached read-only as virtio-blk (the guest sees /dev/vda; oac-image build makes disk.ext4 and disk.erofs)"`
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
	// StateRoot holds per-sandbox state; default kit.DefaultStateRoot.
	StateRoot string
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
