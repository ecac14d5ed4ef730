package qemu

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/oac/sandbox-agent/host/provider/vmguest"
)

func argString(a []string) string { return strings.Join(a, " ") }

func TestBuildArgsForASerialGuestUnderEmulation(t *testing.T) {
	a := buildArgs(vmConfig{
		Name: "demo", Kernel: "/k/vmlinuz", Initramfs: "/k/initramfs.img", Accel: AccelTCG,
		MemoryMiB: 256, CPUs: 1, Socket: "/run/oac/sandboxes/demo/agent.sock", HostGrace: 5 * time.Second,
	})
	s := argString(a)
	for _, want := range []string{
		"-name oac-demo", "-nodefaults", "-no-user-config", "-display none", "-no-reboot",
		"-machine q35", "-accel tcg", "-m 256", "-smp 1", "-kernel /k/vmlinuz", "-initrd /k/initramfs.img",
		"-nic none", "-serial stdio",
		"-device virtio-serial-pci,id=vser0",
		"-chardev socket,id=oacagent,server=off,path=/run/oac/sandboxes/demo/agent.sock",
		"-device virtserialport,bus=vser0.0,chardev=oacagent,name=oac.agent",
	} {
		assert.Contains(t, s, want)
	}
	assert.NotContains(t, s, "-cpu host", "no host CPU model without KVM")
	assert.NotContains(t, s, "vsock")
	i := indexOf(a, "-append")
	assert.Equal(t, "console=ttyS0 panic=-1 quiet loglevel=3 no_timer_check oac.transport=serial:oac.agent oac.host_grace=5s", a[i+1])
}

func TestBuildArgsWithKVMVsockAndADisk(t *testing.T) {
	a := buildArgs(vmConfig{
		Name: "v", Kernel: "k", Initramfs: "i", Accel: AccelKVM, MemoryMiB: 512, CPUs: 2,
		VsockCID: 7, VsockPort: 20004, Disk: "/data/a,b.img", ExtraAppend: "oac.debug=1",
	})
	s := argString(a)
	assert.Contains(t, s, "-accel kvm -cpu host")
	assert.Contains(t, s, "-device vhost-vsock-pci,guest-cid=7")
	assert.NotContains(t, s, "virtio-serial-pci", "vsock replaces the serial port")
	assert.Contains(t, s, "-drive if=none,id=disk0,format=raw,readonly=on,file=/data/a,,b.img", "commas escaped")
	assert.Contains(t, s, "-device virtio-blk-pci,drive=disk0")
	assert.Equal(t, "console=ttyS0 panic=-1 quiet loglevel=3 no_timer_check oac.transport=vsock:20004 oac.root=vda oac.debug=1", a[indexOf(a, "-append")+1],
		"with a disk the guest boots the image's root")
	assert.NotContains(t, s, "memory-backend", "no shared memory without shares")
}

func TestBuildArgsForAnARM64GuestWithSharesUnderEmulation(t *testing.T) {
	a := buildArgs(vmConfig{
		Name: "arm", Arch: vmguest.ArchARM64, Kernel: "/k/Image", Initramfs: "/k/i.img", Firmware: "/fw/QEMU_EFI.fd",
		Accel: AccelTCG, MemoryMiB: 384, CPUs: 1, Socket: "/s/agent.sock", Disk: "/img/disk.erofs",
		Shares: []share{
			{Share: vmguest.Share{Tag: "home", HostPath: "/h", GuestPath: "/home"}, Socket: "/s/fs0.sock"},
			{Share: vmguest.Share{Tag: "workspace", HostPath: "/w", GuestPath: "/environment/workspace"}, Socket: "/s/fs1.sock"},
		},
	})
	s := argString(a)
	for _, want := range []string{
		"-machine virt,memory-backend=mem", "-cpu cortex-a72", "-m 384",
		"-object memory-backend-memfd,id=mem,size=384M,share=on",
		"-bios /fw/QEMU_EFI.fd", "-kernel /k/Image",
		"-chardev socket,id=fs0,path=/s/fs0.sock -device vhost-user-fs-pci,chardev=fs0,tag=home",
		"-chardev socket,id=fs1,path=/s/fs1.sock -device vhost-user-fs-pci,chardev=fs1,tag=workspace",
		"-device virtio-serial-pci,id=vser0",
	} {
		assert.Contains(t, s, want)
	}
	assert.Equal(t, "console=ttyAMA0 panic=-1 quiet loglevel=3 oac.transport=serial:oac.agent oac.root=vda "+
		"oac.shares=home:/home,workspace:/environment/workspace", a[indexOf(a, "-append")+1])
}

func indexOf(a []string, s string) int {
	for i, v := range a {
		if v == s {
			return i
		}
	}
	return -1
}

func TestCPUHasVirtReadsTheFlagsLine(t *testing.T) {
	assert.True(t, cpuHasVirt(strings.NewReader("processor\t: 0\nflags\t\t: fpu vme vmx sse\n")))
	assert.True(t, cpuHasVirt(strings.NewReader("flags\t\t: fpu svm\n")))
	// What the build machines report: a hypervisor, no vmx or svm.
	assert.False(t, cpuHasVirt(strings.NewReader("flags\t\t: fpu hypervisor lahf_lm\nbugs\t\t: vmx_bug\n")))
	assert.False(t, cpuHasVirt(strings.NewReader("")))
}

func TestBuildArgsForAKeptSandbox(t *testing.T) {
	a := buildArgs(vmConfig{Name: "k", Kernel: "k", Initramfs: "i", Accel: AccelTCG, MemoryMiB: 256, CPUs: 1, Socket: "/s",
		Disk: "/keep/image.disk", Kept: "/keep/kept.ext4"})
	s := argString(a)
	assert.Contains(t, s, "-drive if=none,id=disk0,format=raw,readonly=on,file=/keep/image.disk -device virtio-blk-pci,drive=disk0 "+
		"-drive if=none,id=kept,format=raw,discard=unmap,file=/keep/kept.ext4 -device virtio-blk-pci,drive=kept",
		"the image's copy read-only, then the kept disk read-write")
	assert.Contains(t, a[indexOf(a, "-append")+1], "oac.root=vda oac.keep=vdb")

	a = buildArgs(vmConfig{Name: "k", Kernel: "k", Initramfs: "i", Accel: AccelTCG, MemoryMiB: 256, CPUs: 1, Socket: "/s", Kept: "/keep/kept.ext4"})
	assert.NotContains(t, argString(a), "disk0")
	assert.Contains(t, a[indexOf(a, "-append")+1], "oac.keep=vda", "without a root disk the kept disk is the first")
	assert.NotContains(t, a[indexOf(a, "-append")+1], "oac.root")
}
