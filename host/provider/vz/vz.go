package vz

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"

	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/provider/kit"
	"github.com/oac/sandbox-agent/host/provider/vmguest"
	"github.com/oac/sandbox-agent/host/provider/vmkeep"
	"github.com/oac/sandbox-agent/protocol"
)

// Provider boots guests as Virtualization.framework virtual machines from
// a Linux kernel and an initramfs whose /init is oac-guest and, with a
// disk, the image's root disk, connected over a virtio socket the guest
// dials.
type Provider struct {
	Settings
	// Hypervisor creates the machines; default: Virtualization.framework
	// on macOS (cgo builds), unavailable elsewhere.
	Hypervisor Hypervisor
	// ConsoleLimit bounds forwarded console output (default
	// kit.DefaultConsoleLimit).
	ConsoleLimit int64
}

// Name implements provider.Provider.
func (p *Provider) Name() string { return "vz" }

func init() {
	provider.Register(provider.Driver[Provider]{Name: "vz", New: func(p *Provider) provider.Provider {
		p.Kernel, p.Initramfs = kit.BootImages(p.Kernel, p.Initramfs)
		return p
	}})
}

func (p *Provider) hv() Hypervisor {
	if p.Hypervisor != nil {
		return p.Hypervisor
	}
	return platformHypervisor()
}

func (p *Provider) settings() Settings {
	s := p.Settings
	if s.HostCPUs == 0 {
		s.HostCPUs = runtime.NumCPU()
	}
	if s.HostArch == "" {
		s.HostArch = runtime.GOARCH
	}
	return s
}

// Check implements provider.Provider: the hypervisor and the boot images.
// (The OS policy, macOS 12 or newer, is oac-shim's, applied once before
// any provider runs.)
func (p *Provider) Check(ctx context.Context) error {
	if err := p.hv().Available(); err != nil {
		return mapError("check", err)
	}
	if _, err := Assemble(p.settings()); err != nil {
		return fmt.Errorf("%w: %w (make initramfs builds the images)", provider.ErrUnavailable, err)
	}
	return nil
}

// Create implements provider.Provider.
func (p *Provider) Create(ctx context.Context, spec provider.Spec) (provider.Instance, error) {
	if spec.Rootfs != "" {
		return nil, fmt.Errorf("%w: vz guests boot the image's root disk: pass --disk DISK (oac-image build's disk.ext4 or disk.erofs), not --rootfs", provider.ErrInvalidSpec)
	}
	if err := p.Check(ctx); err != nil {
		return nil, err
	}
	s := p.settings()
	s.Volumes = spec.Volumes
	changed := ""
	if spec.Keep != nil {
		// The image's copy (an APFS clone) and the kept disk, kept in
		// the sandbox's directory (package vmkeep).
		mkfs, err := vmkeep.Mkfs("vz", s.Mkfs)
		if err != nil {
			return nil, err
		}
		k, err := vmkeep.Prepare(spec.Keep.Dir, s.Disk, mkfs, s.KeptDiskSize)
		if err != nil {
			return nil, err
		}
		s.Disk, s.DiskWritable, s.Kept, changed = k.Image, false, k.Disk, k.Changed
	}
	installs := spec.Installs()
	if _, err := vmguest.InstallFiles(installs); err != nil {
		return nil, err
	}
	if _, err := Assemble(s); err != nil {
		return nil, err
	}
	// The binaries the host installs for this start go in an archive
	// appended to a copy of the initramfs (the guest lays them over the
	// root disk's /usr/local/bin).
	tmp := ""
	removeTmp := func() {
		if tmp != "" {
			os.RemoveAll(tmp)
		}
	}
	if len(installs) > 0 {
		var err error
		if tmp, err = os.MkdirTemp("", "oac-vz-"); err != nil {
			return nil, fmt.Errorf("vz: %w", err)
		}
		if s.Initramfs, err = vmguest.ComposeInitramfs(s.Initramfs, filepath.Join(tmp, "initramfs.img"), installs); err != nil {
			removeTmp()
			return nil, err
		}
	}
	cfg, err := Assemble(s)
	if err != nil {
		removeTmp()
		return nil, err
	}
	m, err := p.hv().NewMachine(cfg, kit.NewConsole(spec.Stderr, p.ConsoleLimit))
	if err != nil {
		removeTmp()
		return nil, mapError("create virtual machine", err)
	}
	ln, err := m.ListenVsock(cfg.VsockPort)
	if err != nil {
		removeTmp()
		return nil, mapError(fmt.Sprintf("listen on vsock port %d", cfg.VsockPort), err)
	}
	in := &Instance{
		Process: provider.NewProcess(func(err error) error { return err }, errors.New("vz: the virtual machine did not stop within 10s")),
		cfg:     cfg, m: m, ln: ln, imageChanged: changed,
	}
	in.OnDestroy(func() error { removeTmp(); return nil })
	in.Own(ln)
	// Kill stops the machine at once.
	in.KillBy(func() error {
		if !in.Started() {
			return nil
		}
		return in.KillWith(func() error {
			if err := in.m.Stop(); err != nil {
				if s := in.m.State(); s != StateStopped && s != StateError {
					return mapError("stop virtual machine", err)
				}
			}
			return nil
		})
	})
	return in, nil
}

// Instance is one virtual machine; the embedded Process watches the
// machine's states, and its Err says why the machine ended.
type Instance struct {
	*provider.Process
	cfg VMConfig
	m   Machine
	ln  net.Listener
	// imageChanged says how the image changed since a kept sandbox was
	// created (vmkeep.Kept.Changed).
	imageChanged string
}

// ImageChanged implements provider.ImageChecker.
func (in *Instance) ImageChanged() string { return in.imageChanged }

// Discard implements provider.Keeper: a kept vz sandbox keeps nothing but
// the files in its directory (the image's clone and the kept disk).
func (p *Provider) Discard(ctx context.Context, name, dir string) error {
	return vmkeep.Discard(dir)
}

// Config returns the machine's configuration.
func (in *Instance) Config() VMConfig { return in.cfg }

// Start implements provider.Instance. The guest's connection is accepted
// from the machine's virtio socket from now on.
func (in *Instance) Start(ctx context.Context) error {
	return in.StartOnce("vz", func() error { return in.start(ctx) })
}

func (in *Instance) start(ctx context.Context) error {
	in.ListenData(in.ln, protocol.CapDataDial)
	run := machineRun{m: in.m, changes: in.m.StateChanged()}
	if err := in.m.Start(ctx); err != nil {
		run.startErr = mapError("start virtual machine", err)
		in.Watch(run)
		<-in.Done()
		return run.startErr
	}
	in.Watch(run)
	return nil
}

// machineRun is a started machine as a provider.Waiter: Wait follows its
// states until it has ended and says why.
type machineRun struct {
	m        Machine
	changes  <-chan State
	startErr error // the machine did not start
}

func (r machineRun) Wait() error {
	if r.startErr != nil {
		return r.startErr
	}
	for s := range r.changes {
		if end, why := ended(s); end {
			return why
		}
	}
	return errors.New("virtual machine state notifications ended")
}

// Kill is not used: the Instance's Kill stops the machine and checks the
// error.
func (r machineRun) Kill() error { return r.m.Stop() }
func (r machineRun) Pid() int    { return 0 }

// Capabilities implements provider.Provider: --sandbox-io and --install
// reach the guest in an archive appended to the initramfs, --volume as a
// virtio-fs share; the root is the image's disk (--disk), not --rootfs;
// a kept sandbox is a disk of its own; the guest's clock and kernel are
// its own.
func (p *Provider) Capabilities() provider.Capabilities {
	return provider.Capabilities{
		GuestRootUnprivileged: true,
		Honours:               []provider.Feature{provider.FeatureSandboxIO, provider.FeatureInstall, provider.FeatureVolume},
		Instead:               map[provider.Feature]string{provider.FeatureRootfs: "vz guests boot the image's root disk: pass --disk DISK (oac-image build's disk.ext4 or disk.erofs)"},
		Keeps:                 true,
		OwnClock:              true,
	}
}
