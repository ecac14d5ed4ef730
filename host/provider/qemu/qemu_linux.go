package qemu

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/mdlayher/vsock"
	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/provider/kit"
	"github.com/oac/sandbox-agent/host/provider/statedir"
)

// Vsock guests get CID vsockCIDBase+slot and the host listens on
// vsockPortBase+slot for them.
const (
	vsockCIDBase  = 3
	vsockPortBase = 20000
	vsockSlots    = 4096
	devKVM        = "/dev/kvm"
	devVhostVsock = "/dev/vhost-vsock"
)

func (p *Provider) driver() provider.Provider { return p }

func (p *Provider) qemu() (string, error) {
	return kit.Binary("qemu", p.Qemu, "qemu-system-x86_64", "qemu-system-x86_64 is not installed (apt-get install qemu-system-x86, or make deps)")
}

// kvmUsable reports whether hardware-assisted KVM can run a stock kernel:
// /dev/kvm opens read-write and the CPU lists vmx or svm. /dev/kvm alone is
// not enough: measured on the build machines, a paravirtual /dev/kvm
// (kvm-pvm, no vmx/svm flag) accepts qemu but a stock kernel never boots.
func kvmUsable() bool {
	f, err := os.OpenFile(devKVM, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	f.Close()
	ci, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return false
	}
	defer ci.Close()
	return cpuHasVirt(ci)
}

// accel resolves p.Accel.
func (p *Provider) accel() (string, error) {
	switch p.Accel {
	case "", AccelAuto:
		if kvmUsable() {
			return AccelKVM, nil
		}
		return AccelTCG, nil
	case AccelKVM:
		if !kvmUsable() {
			return "", fmt.Errorf("%w: qemu: --accel kvm needs a usable %s and a CPU with vmx or svm (use --accel tcg or auto)", provider.ErrUnavailable, devKVM)
		}
		return AccelKVM, nil
	case AccelTCG:
		return AccelTCG, nil
	}
	return "", fmt.Errorf("%w: accelerator %q (want auto, kvm or tcg)", provider.ErrInvalidSpec, p.Accel)
}

func (p *Provider) transport() (string, error) {
	switch p.Transport {
	case "", TransportSerial:
		return TransportSerial, nil
	case TransportVsock:
		if _, err := os.Stat(devVhostVsock); err != nil {
			return "", fmt.Errorf("%w: qemu: the vsock transport needs %s (modprobe vhost_vsock; a host without it uses the serial transport)", provider.ErrUnavailable, devVhostVsock)
		}
		return TransportVsock, nil
	}
	return "", fmt.Errorf("%w: transport %q (want serial or vsock)", provider.ErrInvalidSpec, p.Transport)
}

// Check implements provider.Provider.
func (p *Provider) Check(ctx context.Context) error {
	if _, err := p.qemu(); err != nil {
		return err
	}
	for _, f := range []struct{ what, path string }{{"kernel", p.Kernel}, {"initramfs", p.Initramfs}} {
		if f.path == "" {
			return fmt.Errorf("%w: qemu: no %s given (make initramfs puts vmlinuz and initramfs.img beside oac-shim)", provider.ErrUnavailable, f.what)
		}
		if st, err := os.Stat(f.path); err != nil || !st.Mode().IsRegular() {
			return fmt.Errorf("%w: qemu: %s %s is not a readable file (make initramfs builds it)", provider.ErrUnavailable, f.what, f.path)
		}
	}
	if _, err := p.accel(); err != nil {
		return err
	}
	_, err := p.transport()
	return err
}

// Create implements provider.Provider.
func (p *Provider) Create(ctx context.Context, spec provider.Spec) (_ provider.Instance, err error) {
	if spec.Rootfs != "" {
		return nil, fmt.Errorf("%w: qemu guests run from their initramfs; --rootfs is a bwrap option (switch_root into a disk is not built yet)", provider.ErrInvalidSpec)
	}
	if p.Disk != "" {
		if st, err := os.Stat(p.Disk); err != nil || !st.Mode().IsRegular() {
			return nil, fmt.Errorf("%w: disk %s is not a readable file (oac-image build makes disk.ext4 and disk.erofs)", provider.ErrInvalidSpec, p.Disk)
		}
	}
	if err := p.Check(ctx); err != nil {
		return nil, err
	}
	qemuBin, _ := p.qemu()
	accel, _ := p.accel()
	tr, _ := p.transport()
	in := &Instance{
		Process: provider.NewProcess(provider.Exits("virtual machine powered off", "qemu exited"), errors.New("qemu did not exit within 10s of SIGKILL")), spec: spec, qemu: qemuBin,
		cfg: vmConfig{
			Name: spec.Name, Kernel: provider.AbsPath(p.Kernel), Initramfs: provider.AbsPath(p.Initramfs), Disk: provider.AbsPath(p.Disk), Accel: accel,
			MemoryMiB: orDefault(p.MemoryMiB, DefaultMemory), CPUs: orDefault(p.CPUs, DefaultCPUs),
			HostGrace: p.HostGrace, ExtraAppend: p.ExtraAppend,
		},
		consoleLimit: p.ConsoleLimit,
	}
	defer in.DestroyOnError(&err)
	root := kit.StateRoot(p.StateRoot)
	state, err := kit.ClaimState(in.Process, root, spec.Name)
	if err != nil {
		return nil, err
	}
	if tr == TransportVsock {
		if err := in.listenVsock(filepath.Join(root, "vsock")); err != nil {
			return nil, err
		}
	} else {
		in.cfg.Socket = filepath.Join(state.Path, "agent.sock")
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: in.cfg.Socket, Net: "unix"})
		if err != nil {
			return nil, fmt.Errorf("listen on %s: %w (paths of unix sockets are limited to 107 bytes: use a shorter state root)", in.cfg.Socket, err)
		}
		in.Own(ln)
		in.Listen(ln)
	}
	return in, nil
}

func orDefault(v, def int) int {
	if v <= 0 {
		return def
	}
	return v
}

// Instance is one qemu VM; the embedded Process is qemu's.
type Instance struct {
	*provider.Process
	spec         provider.Spec
	qemu         string
	cfg          vmConfig
	consoleLimit int64
}

// listenVsock claims a CID/port slot and listens for the guest on the
// host's vsock port of that slot.
func (in *Instance) listenVsock(dir string) error {
	slot, f, err := statedir.ClaimSlot(dir, vsockSlots, "vsock")
	if err != nil {
		return err
	}
	port := uint32(vsockPortBase + slot)
	ln, err := vsock.Listen(port, nil)
	if err != nil {
		f.Close()
		return fmt.Errorf("listen on vsock port %d: %w (is vhost_vsock loaded?)", port, err)
	}
	cid := uint32(vsockCIDBase + slot)
	in.Own(f)
	cl := &cidListener{Listener: ln, cid: cid}
	in.Own(cl)
	in.Listen(cl)
	in.cfg.VsockCID, in.cfg.VsockPort = cid, port
	return nil
}

// cidListener accepts only connections from one guest CID: a host vsock
// port is reachable from every VM on the host.
type cidListener struct {
	*vsock.Listener
	cid uint32
}

func (l *cidListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if a, ok := c.RemoteAddr().(*vsock.Addr); ok && a.ContextID == l.cid {
			return c, nil
		}
		c.Close() // another VM knocking on our port
	}
}

// Args returns qemu's command line (without the binary).
func (in *Instance) Args() []string { return buildArgs(in.cfg) }

// Start implements provider.Instance.
func (in *Instance) Start(ctx context.Context) error {
	return in.StartOnce("qemu", func() error { return in.start(ctx) })
}

func (in *Instance) start(ctx context.Context) error {
	cmd := exec.Command(in.qemu, buildArgs(in.cfg)...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Dir = "/"
	console := kit.NewConsole(in.spec.Stderr, in.consoleLimit)
	// One writer for both: os/exec then copies through a single pipe
	// and goroutine, so lines never interleave.
	cmd.Stdout, cmd.Stderr = console, console
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// qemu dies with the shim, whatever kills the shim.
		Pdeathsig: syscall.SIGKILL,
		Setpgid:   true,
	}
	if err := in.Process.Start(cmd); err != nil {
		return fmt.Errorf("start qemu: %w", err)
	}
	return nil
}
