package qemu

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/oac/sandbox-agent/host/provider/vmguest"
)

// Settings of the guest side that the provider and the image agree on.
const (
	// PortName is the virtio-serial port the guest looks up by name.
	PortName = "oac.agent"
	// DefaultMachine is the amd64 machine type: q35 never failed to boot
	// here; microvm needs tsc_early_khz and virtio-mmio modules.
	DefaultMachine = "q35"
	// ARM64Machine is the arm64 machine type: qemu's generic virt board.
	ARM64Machine = "virt"
	// ARM64CPU is the CPU model of an emulated arm64 guest: a generic
	// ARMv8.0 core. qemu's "max" also emulates pointer authentication in
	// software and boots about four times slower under TCG.
	ARM64CPU      = "cortex-a72"
	DefaultMemory = 256 // MiB
	DefaultCPUs   = 1   // -smp 2 is slower under software emulation
	// DefaultARM64Firmware is Debian's UEFI firmware for arm64 virt
	// machines (package qemu-efi-aarch64); the kernel boots as an EFI
	// application through it.
	DefaultARM64Firmware = "/usr/share/qemu-efi-aarch64/QEMU_EFI.fd"
)

// Accelerators.
const (
	AccelAuto = "auto"
	AccelKVM  = "kvm"
	AccelTCG  = "tcg"
)

// Transports.
const (
	TransportSerial = "serial"
	TransportVsock  = "vsock"
)

// share is one virtio-fs share as qemu sees it: the vhost-user socket its
// virtiofsd listens on.
type share struct {
	vmguest.Share
	Socket string
}

// vmConfig is everything the qemu command line depends on.
type vmConfig struct {
	Name string
	// Arch is the guest's (vmguest.ArchAMD64 or ArchARM64).
	Arch      string
	Kernel    string
	Initramfs string
	// Firmware, when set, is the UEFI firmware (arm64) the kernel boots
	// through.
	Firmware string
	// Disk is the image's root disk (read-only virtio-blk, vda).
	Disk string
	// Kept is a kept sandbox's disk (read-write virtio-blk after Disk;
	// see package vmkeep), or "".
	Kept      string
	Accel     string // kvm or tcg, resolved
	MemoryMiB int
	CPUs      int
	// Socket is the unix socket the shim listens on (serial transport).
	Socket string
	// VsockCID and VsockPort are set for the vsock transport.
	VsockCID, VsockPort uint32
	HostGrace           time.Duration
	Shares              []share
	ExtraAppend         string
}

// console is the kernel's name for the first serial port.
func (c vmConfig) console() string {
	if c.Arch == vmguest.ArchARM64 {
		return "ttyAMA0"
	}
	return "ttyS0"
}

// kernelCmdline returns the kernel command line: console on the first
// serial port, reboot at once on panic (qemu runs with -no-reboot, so a
// panic ends qemu), little console noise, and the oac.* settings.
func kernelCmdline(c vmConfig) string {
	parts := []string{"console=" + c.console(), "panic=-1", "quiet", "loglevel=3"}
	if c.Arch != vmguest.ArchARM64 {
		// The kernel checks that the IO-APIC timer ticks during early
		// boot; an emulated CPU on a loaded host can miss the check's
		// window, and the kernel panics ("IO-APIC + timer doesn't
		// work"). Measured here under make test.
		parts = append(parts, "no_timer_check")
	}
	if c.VsockCID != 0 {
		parts = append(parts, fmt.Sprintf("oac.transport=vsock:%d", c.VsockPort))
	} else {
		parts = append(parts, "oac.transport=serial:"+PortName)
	}
	if c.HostGrace > 0 {
		parts = append(parts, "oac.host_grace="+c.HostGrace.String())
	}
	shares := make([]vmguest.Share, len(c.Shares))
	for i, s := range c.Shares {
		shares[i] = s.Share
	}
	parts = append(parts, vmguest.KernelParams(c.Disk != "", c.Kept != "", shares)...)
	if c.ExtraAppend != "" {
		parts = append(parts, c.ExtraAppend)
	}
	return strings.Join(parts, " ")
}

// optEscape escapes a value for qemu's comma-separated option syntax.
func optEscape(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// buildArgs returns qemu-system-x86_64's or qemu-system-aarch64's
// arguments.
func buildArgs(c vmConfig) []string {
	machine := DefaultMachine
	if c.Arch == vmguest.ArchARM64 {
		machine = ARM64Machine
	}
	if len(c.Shares) > 0 {
		// vhost-user devices (virtiofsd) need the guest's memory shared
		// with them.
		machine += ",memory-backend=mem"
	}
	a := []string{
		"-name", "oac-" + c.Name,
		"-nodefaults", "-no-user-config",
		"-display", "none",
		"-no-reboot", // a reboot or panic ends qemu instead of looping
		"-machine", machine,
		"-accel", c.Accel,
	}
	switch {
	case c.Accel == AccelKVM:
		a = append(a, "-cpu", "host")
	case c.Arch == vmguest.ArchARM64:
		a = append(a, "-cpu", ARM64CPU)
	}
	a = append(a,
		"-m", strconv.Itoa(c.MemoryMiB),
		"-smp", strconv.Itoa(c.CPUs),
	)
	if len(c.Shares) > 0 {
		a = append(a, "-object", fmt.Sprintf("memory-backend-memfd,id=mem,size=%dM,share=on", c.MemoryMiB))
	}
	if c.Firmware != "" {
		a = append(a, "-bios", c.Firmware)
	}
	a = append(a,
		"-kernel", c.Kernel,
		"-initrd", c.Initramfs,
		"-append", kernelCmdline(c),
		"-nic", "none", // no network but lo: egress goes through the host
		"-serial", "stdio", // the console, captured by the provider
	)
	if c.VsockCID != 0 {
		a = append(a, "-device", fmt.Sprintf("vhost-vsock-pci,guest-cid=%d", c.VsockCID))
	} else {
		// qemu dials the socket the shim already listens on
		// (server=off): no connect race, and qemu fails at once if the
		// socket is not there.
		a = append(a,
			"-device", "virtio-serial-pci,id=vser0",
			"-chardev", "socket,id=oacagent,server=off,path="+optEscape(c.Socket),
			"-device", "virtserialport,bus=vser0.0,chardev=oacagent,name="+PortName,
		)
	}
	if c.Disk != "" {
		a = append(a,
			"-drive", "if=none,id=disk0,format=raw,readonly=on,file="+optEscape(c.Disk),
			"-device", "virtio-blk-pci,drive=disk0",
		)
	}
	if c.Kept != "" {
		// After the root disk: the guest finds it as the next device
		// (vmparams.KeepDevice). discard=unmap gives the host back what
		// the guest frees.
		a = append(a,
			"-drive", "if=none,id=kept,format=raw,discard=unmap,file="+optEscape(c.Kept),
			"-device", "virtio-blk-pci,drive=kept",
		)
	}
	for i, s := range c.Shares {
		// virtiofsd already listens on the socket (the shim created it
		// and handed it over), so qemu's connect cannot race it.
		a = append(a,
			"-chardev", fmt.Sprintf("socket,id=fs%d,path=%s", i, optEscape(s.Socket)),
			"-device", fmt.Sprintf("vhost-user-fs-pci,chardev=fs%d,tag=%s", i, s.Tag),
		)
	}
	return a
}

// cpuHasVirt reports whether a /proc/cpuinfo document lists hardware
// virtualization (vmx or svm) among the CPU flags.
func cpuHasVirt(r io.Reader) bool {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(k) != "flags" {
			continue
		}
		for _, f := range strings.Fields(v) {
			if f == "vmx" || f == "svm" {
				return true
			}
		}
		return false
	}
	return false
}
