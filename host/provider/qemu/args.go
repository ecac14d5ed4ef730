package qemu

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// Settings of the guest side that the provider and the image agree on.
const (
	// PortName is the virtio-serial port the guest looks up by name.
	PortName = "oac.agent"
	// DefaultMachine is the only machine type built: q35 never failed to
	// boot here; microvm needs tsc_early_khz and virtio-mmio modules.
	DefaultMachine = "q35"
	DefaultMemory  = 256 // MiB
	DefaultCPUs    = 1   // -smp 2 is slower under software emulation
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

// vmConfig is everything the qemu command line depends on.
type vmConfig struct {
	Name      string
	Kernel    string
	Initramfs string
	Disk      string
	Accel     string // kvm or tcg, resolved
	MemoryMiB int
	CPUs      int
	// Socket is the unix socket the shim listens on (serial transport).
	Socket string
	// VsockCID and VsockPort are set for the vsock transport.
	VsockCID, VsockPort uint32
	HostGrace           time.Duration
	ExtraAppend         string
}

// kernelCmdline returns the kernel command line: console on the first
// serial port, reboot at once on panic (qemu runs with -no-reboot, so a
// panic ends qemu), little console noise, and the oac.* settings.
func kernelCmdline(c vmConfig) string {
	parts := []string{"console=ttyS0", "panic=-1", "quiet", "loglevel=3"}
	if c.VsockCID != 0 {
		parts = append(parts, fmt.Sprintf("oac.transport=vsock:%d", c.VsockPort))
	} else {
		parts = append(parts, "oac.transport=serial:"+PortName)
	}
	if c.HostGrace > 0 {
		parts = append(parts, "oac.host_grace="+c.HostGrace.String())
	}
	if c.ExtraAppend != "" {
		parts = append(parts, c.ExtraAppend)
	}
	return strings.Join(parts, " ")
}

// optEscape escapes a value for qemu's comma-separated option syntax.
func optEscape(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// buildArgs returns qemu-system-x86_64's arguments.
func buildArgs(c vmConfig) []string {
	a := []string{
		"-name", "oac-" + c.Name,
		"-nodefaults", "-no-user-config",
		"-display", "none",
		"-no-reboot", // a reboot or panic ends qemu instead of looping
		"-machine", DefaultMachine,
		"-accel", c.Accel,
	}
	if c.Accel == AccelKVM {
		a = append(a, "-cpu", "host")
	}
	a = append(a,
		"-m", strconv.Itoa(c.MemoryMiB),
		"-smp", strconv.Itoa(c.CPUs),
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
