package qemu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"github.com/mdlayher/vsock"
	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/provider/kit"
	"github.com/oac/sandbox-agent/host/provider/statedir"
	"github.com/oac/sandbox-agent/host/provider/vmguest"
	"github.com/oac/sandbox-agent/host/provider/vmkeep"
	"github.com/oac/sandbox-agent/protocol"
)

// Defaults.
const (
	// DefaultVirtiofsd is the virtio-fs daemon Debian's qemu ships.
	DefaultVirtiofsd = "/usr/lib/qemu/virtiofsd"
	// Vsock guests get CID vsockCIDBase+slot and the host listens on
	// vsockPortBase+slot for them.
	vsockCIDBase  = 3
	vsockPortBase = 20000
	vsockSlots    = 4096
	devKVM        = "/dev/kvm"
	devVhostVsock = "/dev/vhost-vsock"
	// virtiofsdLogLimit bounds what one virtiofsd may write to the
	// diagnostics.
	virtiofsdLogLimit = 64 << 10
)

func (p *Provider) driver() provider.Provider { return p }

// arch resolves the guest architecture.
func (p *Provider) arch() (string, error) {
	switch p.Arch {
	case vmguest.ArchAMD64, vmguest.ArchARM64:
		return p.Arch, nil
	case "":
		a, err := vmguest.KernelArch(p.Kernel)
		if err != nil {
			return "", fmt.Errorf("%w: qemu: %w (or pass --arch)", provider.ErrInvalidSpec, err)
		}
		return a, nil
	}
	return "", fmt.Errorf("%w: qemu: architecture %q (want amd64 or arm64)", provider.ErrInvalidSpec, p.Arch)
}

func (p *Provider) qemu(arch string) (string, error) {
	bin, pkg := "qemu-system-x86_64", "qemu-system-x86"
	if arch == vmguest.ArchARM64 {
		bin, pkg = "qemu-system-aarch64", "qemu-system-arm"
	}
	return kit.Binary("qemu", p.Qemu, bin, bin+" is not installed (apt-get install "+pkg+", or make deps)")
}

func (p *Provider) firmware(arch string) (string, error) {
	if p.Firmware != "" {
		if st, err := os.Stat(p.Firmware); err != nil || !st.Mode().IsRegular() {
			return "", fmt.Errorf("%w: qemu: firmware %s is not a readable file", provider.ErrUnavailable, p.Firmware)
		}
		return p.Firmware, nil
	}
	if arch == vmguest.ArchARM64 {
		if _, err := os.Stat(DefaultARM64Firmware); err == nil {
			return DefaultARM64Firmware, nil
		}
	}
	return "", nil
}

// kvmUsable says whether hardware-assisted KVM can run a stock kernel of
// arch here, and why not: the guest's architecture must be the host's,
// /dev/kvm must open read-write and, on x86, the CPU must list vmx or svm.
// /dev/kvm alone is not enough: measured on the build machines, a
// paravirtual /dev/kvm (kvm-pvm, no vmx/svm flag) accepts qemu but a stock
// kernel never boots.
func kvmUsable(arch string) (bool, string) {
	if arch != runtime.GOARCH {
		return false, "KVM runs only guests of the host's architecture (" + runtime.GOARCH + ")"
	}
	f, err := os.OpenFile(devKVM, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, "there is no usable " + devKVM
	}
	f.Close()
	if arch != vmguest.ArchAMD64 {
		return true, ""
	}
	ci, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return false, "/proc/cpuinfo cannot be read"
	}
	defer ci.Close()
	if !cpuHasVirt(ci) {
		return false, devKVM + " exists but the CPU lists neither vmx nor svm: a paravirtual KVM, on which a stock kernel does not boot"
	}
	return true, ""
}

// accel resolves p.Accel; the reason says why KVM is not used.
func (p *Provider) accel(arch string) (string, string, error) {
	ok, why := kvmUsable(arch)
	switch p.Accel {
	case "", AccelAuto:
		if ok {
			return AccelKVM, "", nil
		}
		return AccelTCG, why, nil
	case AccelKVM:
		if !ok {
			return "", "", fmt.Errorf("%w: qemu: --accel kvm cannot run here: %s (use --accel tcg or auto)", provider.ErrUnavailable, why)
		}
		return AccelKVM, "", nil
	case AccelTCG:
		return AccelTCG, "--accel tcg asks for it", nil
	}
	return "", "", fmt.Errorf("%w: accelerator %q (want auto, kvm or tcg)", provider.ErrInvalidSpec, p.Accel)
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

func (p *Provider) stateRoot() string { return kit.UserStateRoot(p.StateRoot) }

// checkStateRoot makes sure sandboxes can keep their state: the state root
// or, when it does not exist yet, its nearest existing parent must be
// writable.
func (p *Provider) checkStateRoot() error {
	root := p.stateRoot()
	for d := root; ; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil {
			if unix.Access(d, unix.W_OK|unix.X_OK) != nil {
				return fmt.Errorf("%w: qemu: the state directory %s cannot be created or written by uid %d (run as root, or let it default to $XDG_RUNTIME_DIR/oac)", provider.ErrUnavailable, root, os.Geteuid())
			}
			return nil
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

func (p *Provider) virtiofsd() (string, error) {
	if p.Virtiofsd != "" {
		return p.Virtiofsd, nil
	}
	if _, err := os.Stat(DefaultVirtiofsd); err == nil {
		return DefaultVirtiofsd, nil
	}
	path, err := exec.LookPath("virtiofsd")
	if err != nil {
		return "", fmt.Errorf("%w: qemu: shares and volumes need virtiofsd (%s, from qemu-system-common, or virtiofsd in PATH)", provider.ErrUnavailable, DefaultVirtiofsd)
	}
	return path, nil
}

// checkShares says whether virtio-fs shares can be served here: virtiofsd
// must exist and the shim must be root, because virtiofsd runs in a user
// namespace that maps the guest's ids to a private host id range.
func (p *Provider) checkShares() error {
	if _, err := p.virtiofsd(); err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: qemu: shares and volumes need root: virtiofsd runs in a user namespace mapping the guest's ids to a private host id range", provider.ErrUnavailable)
	}
	return nil
}

// Check implements provider.Provider.
func (p *Provider) Check(ctx context.Context) error {
	_, err := p.resolve()
	return err
}

// resolved is what Check decides about this host.
type resolved struct {
	arch, qemu, firmware, accel, noKVM, transport string
}

func (p *Provider) resolve() (resolved, error) {
	var r resolved
	for _, f := range []struct{ what, path string }{{"kernel", p.Kernel}, {"initramfs", p.Initramfs}} {
		if f.path == "" {
			return r, fmt.Errorf("%w: qemu: no %s given (make initramfs puts vmlinuz and initramfs.img beside oac-shim)", provider.ErrUnavailable, f.what)
		}
		if st, err := os.Stat(f.path); err != nil || !st.Mode().IsRegular() {
			return r, fmt.Errorf("%w: qemu: %s %s is not a readable file (make initramfs builds it)", provider.ErrUnavailable, f.what, f.path)
		}
	}
	var err error
	if r.arch, err = p.arch(); err != nil {
		return r, err
	}
	if r.qemu, err = p.qemu(r.arch); err != nil {
		return r, err
	}
	if r.firmware, err = p.firmware(r.arch); err != nil {
		return r, err
	}
	if r.accel, r.noKVM, err = p.accel(r.arch); err != nil {
		return r, err
	}
	if r.transport, err = p.transport(); err != nil {
		return r, err
	}
	if err := p.checkStateRoot(); err != nil {
		return r, err
	}
	if p.Share != "" {
		if err := p.checkShares(); err != nil {
			return r, err
		}
	}
	return r, nil
}

// Detail describes how sandboxes would run here (after a nil Check).
func (p *Provider) Detail(ctx context.Context) string {
	r, err := p.resolve()
	if err != nil {
		return ""
	}
	var parts []string
	machine := r.arch + " " + DefaultMachine
	if r.arch == vmguest.ArchARM64 {
		machine = r.arch + " " + ARM64Machine + " (" + ARM64CPU + ")"
	}
	if r.accel == AccelKVM {
		parts = append(parts, machine+" with KVM")
	} else {
		parts = append(parts, fmt.Sprintf("%s under TCG software emulation, seconds per boot, because %s", machine, r.noKVM))
	}
	if r.transport == TransportSerial {
		why := "vsock needs " + devVhostVsock + ", which this host lacks"
		if _, err := os.Stat(devVhostVsock); err == nil {
			why = "vsock on request"
		}
		parts = append(parts, "virtio-serial transport ("+why+")")
	} else {
		parts = append(parts, "vsock transport")
	}
	if r.firmware != "" {
		parts = append(parts, "UEFI firmware "+r.firmware)
	}
	if p.Disk != "" {
		parts = append(parts, "root disk "+p.Disk)
	} else {
		parts = append(parts, "initramfs only")
	}
	if err := p.checkShares(); err != nil {
		parts = append(parts, "no shares or volumes: "+strings.TrimPrefix(err.Error(), provider.ErrUnavailable.Error()+": qemu: "))
	} else {
		parts = append(parts, "shares and volumes over virtio-fs")
	}
	parts = append(parts, "state in "+p.stateRoot())
	return strings.Join(parts, "; ")
}

// Create implements provider.Provider.
func (p *Provider) Create(ctx context.Context, spec provider.Spec) (_ provider.Instance, err error) {
	if spec.Rootfs != "" {
		return nil, fmt.Errorf("%w: qemu guests boot the image's root disk: pass --disk DISK (oac-image build's disk.ext4 or disk.erofs), not --rootfs", provider.ErrInvalidSpec)
	}
	if p.Disk != "" {
		if st, err := os.Stat(p.Disk); err != nil || !st.Mode().IsRegular() {
			return nil, fmt.Errorf("%w: disk %s is not a readable file (oac-image build makes disk.ext4 and disk.erofs)", provider.ErrInvalidSpec, p.Disk)
		}
	}
	r, err := p.resolve()
	if err != nil {
		return nil, err
	}
	shares, err := vmguest.Shares(provider.AbsPath(p.Share), false, spec.Volumes)
	if err != nil {
		return nil, err
	}
	if len(shares) > 0 {
		if err := p.checkShares(); err != nil {
			return nil, err
		}
		for _, s := range shares {
			if err := searchable(s.HostPath); err != nil {
				return nil, err
			}
		}
	}
	installs := spec.Installs()
	if _, err := vmguest.InstallFiles(installs); err != nil {
		return nil, err
	}
	in := &Instance{
		Process: provider.NewProcess(provider.Exits("virtual machine powered off", "qemu exited"), errors.New("qemu did not exit within 10s of SIGKILL")), spec: spec, qemu: r.qemu,
		cfg: vmConfig{
			Name: spec.Name, Arch: r.arch, Kernel: provider.AbsPath(p.Kernel), Initramfs: provider.AbsPath(p.Initramfs), Firmware: r.firmware,
			Disk: provider.AbsPath(p.Disk), Accel: r.accel,
			MemoryMiB: orDefault(p.MemoryMiB, DefaultMemory), CPUs: orDefault(p.CPUs, DefaultCPUs),
			HostGrace: p.HostGrace, ExtraAppend: p.ExtraAppend,
		},
		consoleLimit: p.ConsoleLimit,
	}
	defer in.DestroyOnError(&err)
	root := p.stateRoot()
	state, err := kit.ClaimState(in.Process, root, spec.Name)
	if err != nil {
		return nil, err
	}
	if spec.Keep != nil {
		// Under the name's lock: one shim at a time uses the kept disks.
		if err := in.keep(p, spec.Keep.Dir); err != nil {
			return nil, err
		}
	}
	if r.transport == TransportVsock {
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
	// The binaries the host installs for this start go in an archive
	// appended to a copy of the initramfs (in the state directory).
	if in.cfg.Initramfs, err = vmguest.ComposeInitramfs(in.cfg.Initramfs, filepath.Join(state.Path, "initramfs.img"), installs); err != nil {
		return nil, err
	}
	if len(shares) > 0 {
		if err := in.prepareShares(p, root, state.Path, shares); err != nil {
			return nil, err
		}
	}
	return in, nil
}

// keep boots a kept sandbox from the disks kept in dir: the image's copy
// (instead of the image) and the kept disk (see package vmkeep).
func (in *Instance) keep(p *Provider, dir string) error {
	mkfs, err := vmkeep.Mkfs("qemu", p.Mkfs)
	if err != nil {
		return err
	}
	k, err := vmkeep.Prepare(dir, in.cfg.Disk, mkfs, p.KeptDiskSize)
	if err != nil {
		return err
	}
	in.cfg.Disk, in.cfg.Kept, in.imageChanged = k.Image, k.Disk, k.Changed
	return nil
}

// Discard implements provider.Keeper: a kept qemu sandbox keeps nothing
// but the files in its directory.
func (p *Provider) Discard(ctx context.Context, name, dir string) error {
	if err := kit.DiscardRuntime(p.stateRoot(), name, nil); err != nil {
		return err
	}
	return vmkeep.Discard(dir)
}

// ImageChanged implements provider.ImageChecker.
func (in *Instance) ImageChanged() string { return in.imageChanged }

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
	// imageChanged says how the image changed since a kept sandbox was
	// created (vmkeep.Kept.Changed).
	imageChanged string

	// virtio-fs: one virtiofsd per share, serving it on a socket the shim
	// created (handed over as fd 3) with the guest's ids mapped to the
	// sandbox's host id range.
	virtiofsd string
	idBase    int
	fsSocks   []*os.File
	fsOwners  [][2]int // the share directory's uid and gid
	fsProcs   []*exec.Cmd
}

// prepareShares claims a host id range and creates each share's
// vhost-user socket (virtiofsd gets it as a listening descriptor, qemu
// connects to its path).
func (in *Instance) prepareShares(p *Provider, root, dir string, shares []vmguest.Share) error {
	in.virtiofsd, _ = p.virtiofsd()
	ids, err := kit.ClaimIDs(root, p.IDBase)
	if err != nil {
		return err
	}
	in.Own(ids)
	in.idBase = ids.Base
	in.OnDestroy(func() error { in.killVirtiofsd(); return nil })
	for i, s := range shares {
		sock := filepath.Join(dir, fmt.Sprintf("fs%d.sock", i))
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
		if err != nil {
			return fmt.Errorf("listen on %s: %w", sock, err)
		}
		ln.SetUnlinkOnClose(false) // qemu connects after the shim let go
		lf, err := ln.File()
		ln.Close()
		if err != nil {
			return fmt.Errorf("virtio-fs socket: %w", err)
		}
		in.Own(lf)
		in.fsSocks = append(in.fsSocks, lf)
		var st unix.Stat_t
		if err := unix.Stat(s.HostPath, &st); err != nil {
			return fmt.Errorf("%w: share %s: %v", provider.ErrInvalidSpec, s.HostPath, err)
		}
		in.fsOwners = append(in.fsOwners, [2]int{int(st.Uid), int(st.Gid)})
		in.cfg.Shares = append(in.cfg.Shares, share{Share: s, Socket: sock})
	}
	return nil
}

// searchable checks that every directory above a share is searchable by
// others: virtiofsd reaches the share as an unprivileged host id of the
// sandbox's range.
func searchable(dir string) error {
	for d := filepath.Dir(dir); ; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("%w: share %s: %v", provider.ErrInvalidSpec, dir, err)
		}
		if st.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("%w: share %s: %s is not searchable by others (mode %#o); virtiofsd reaches the share as an unprivileged host id, so every directory above it needs o+x", provider.ErrInvalidSpec, dir, d, st.Mode().Perm())
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

// idMap maps guest ids 0..IDRange-1 to base+id, except the runtime id
// 1000, which maps to owner when owner is an ordinary host id (not root,
// not in the range): the share's owner then owns what uid 1000 writes and
// uid 1000 can write what the owner can, as on macOS, where the VM
// writes shares as the user who runs it.
func idMap(base, owner int) []syscall.SysProcIDMap {
	const runtimeID = 1000
	if owner <= 0 || (owner >= base && owner < base+kit.IDRange) {
		return []syscall.SysProcIDMap{{ContainerID: 0, HostID: base, Size: kit.IDRange}}
	}
	return []syscall.SysProcIDMap{
		{ContainerID: 0, HostID: base, Size: runtimeID},
		{ContainerID: runtimeID, HostID: owner, Size: 1},
		{ContainerID: runtimeID + 1, HostID: base + runtimeID + 1, Size: kit.IDRange - runtimeID - 1},
	}
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
	// A vsock guest can dial the host port again, once per connection.
	in.ListenData(cl, protocol.CapDataDial)
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
	out := provider.Output(in.spec.Stderr)
	for i := range in.cfg.Shares {
		if err := in.startVirtiofsd(i, out); err != nil {
			in.killVirtiofsd()
			return err
		}
	}
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
		in.killVirtiofsd()
		return fmt.Errorf("start qemu: %w", err)
	}
	return nil
}

// startVirtiofsd serves share i: virtiofsd in a new user namespace (guest
// ids mapped by idMap, so the guest's root is never the host's), in its
// own mount, pid and network namespaces (its default sandbox), with the
// listening socket as fd 3. It exits when qemu disconnects.
func (in *Instance) startVirtiofsd(i int, out io.Writer) error {
	s := in.cfg.Shares[i]
	cmd := exec.Command(in.virtiofsd, "--fd=3", "-o", "source="+s.HostPath, "-o", "cache=auto", "-o", "sandbox=namespace", "-o", "log_level=err")
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Dir = "/"
	cmd.ExtraFiles = []*os.File{in.fsSocks[i]}
	w := kit.NewConsole(&prefixWriter{w: out, prefix: "virtiofsd[" + s.Tag + "]: "}, virtiofsdLogLimit)
	cmd.Stdout, cmd.Stderr = w, w
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: idMap(in.idBase, in.fsOwners[i][0]),
		GidMappings: idMap(in.idBase, in.fsOwners[i][1]),
		Credential:  &syscall.Credential{Uid: 0, Gid: 0},
		Pdeathsig:   syscall.SIGKILL,
		Setpgid:     true,
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start virtiofsd for share %s: %w", s.Tag, err)
	}
	in.fsProcs = append(in.fsProcs, cmd)
	go func() { _ = cmd.Wait() }()
	return nil
}

// killVirtiofsd kills the virtiofsd processes (they would exit once qemu
// is gone; this does not wait for that).
func (in *Instance) killVirtiofsd() {
	for _, c := range in.fsProcs {
		_ = c.Process.Kill()
	}
}

// prefixWriter prefixes each line written to w.
type prefixWriter struct {
	w      io.Writer
	prefix string
	mid    bool
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	var out []byte
	for _, c := range b {
		if !p.mid {
			out = append(out, p.prefix...)
			p.mid = true
		}
		out = append(out, c)
		if c == '\n' {
			p.mid = false
		}
	}
	_, err := p.w.Write(out)
	return len(b), err
}
