package vz

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"

	"github.com/oac/sandbox-agent/host/ospolicy"
	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/provider/vmguest"
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
	// DefaultConsoleLimit).
	ConsoleLimit int64
	// OS describes the host for the policy check; default ospolicy.Detect.
	OS func() ospolicy.OS
}

// Name implements provider.Provider.
func (p *Provider) Name() string { return "vz" }

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

// Check implements provider.Provider: the OS policy (macOS 12 or newer),
// the hypervisor, and the boot images.
func (p *Provider) Check(ctx context.Context) error {
	if p.Hypervisor == nil || p.OS != nil {
		detect := p.OS
		if detect == nil {
			detect = ospolicy.Detect
		}
		if o := detect(); o.GOOS == "darwin" {
			if v := ospolicy.Evaluate(o); v.Level == ospolicy.Block {
				return fmt.Errorf("%w: vz: %s", provider.ErrUnavailable, v.Message)
			}
		}
	}
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
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if spec.Rootfs != "" {
		return nil, fmt.Errorf("%w: vz guests boot the image's root disk: pass --disk DISK (oac-image build's disk.ext4 or disk.erofs), not --rootfs", provider.ErrInvalidSpec)
	}
	if err := p.Check(ctx); err != nil {
		return nil, err
	}
	s := p.settings()
	s.Volumes = spec.Volumes
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
	var tmp string
	if len(installs) > 0 {
		var err error
		if tmp, err = os.MkdirTemp("", "oac-vz-"); err != nil {
			return nil, fmt.Errorf("vz: %w", err)
		}
		if s.Initramfs, err = vmguest.ComposeInitramfs(s.Initramfs, filepath.Join(tmp, "initramfs.img"), installs); err != nil {
			os.RemoveAll(tmp)
			return nil, err
		}
	}
	ok := false
	defer func() {
		if !ok && tmp != "" {
			os.RemoveAll(tmp)
		}
	}()
	cfg, err := Assemble(s)
	if err != nil {
		return nil, err
	}
	var out io.Writer = io.Discard
	if spec.Stderr != nil {
		out = spec.Stderr
	}
	limit := p.ConsoleLimit
	if limit <= 0 {
		limit = DefaultConsoleLimit
	}
	m, err := p.hv().NewMachine(cfg, &consoleWriter{w: out, limit: limit})
	if err != nil {
		return nil, mapError("create virtual machine", err)
	}
	ln, err := m.ListenVsock(cfg.VsockPort)
	if err != nil {
		return nil, mapError(fmt.Sprintf("listen on vsock port %d", cfg.VsockPort), err)
	}
	ok = true
	return &Instance{cfg: cfg, m: m, ln: ln, tmp: tmp, vm: provider.NewProcess(func(err error) error { return err },
		errors.New("vz: the virtual machine did not stop within 10s"))}, nil
}

// Instance is one virtual machine.
type Instance struct {
	cfg VMConfig
	m   Machine
	ln  net.Listener
	// tmp holds the initramfs with this start's installed binaries.
	tmp string

	mu      sync.Mutex
	started bool
	vm      *provider.Process // watches the machine's states; Err is why it ended
	closeLn sync.Once
}

// Config returns the machine's configuration.
func (in *Instance) Config() VMConfig { return in.cfg }

// Start implements provider.Instance.
func (in *Instance) Start(ctx context.Context) error {
	in.mu.Lock()
	if in.started {
		in.mu.Unlock()
		return errors.New("vz: already started")
	}
	in.started = true
	in.mu.Unlock()
	run := machineRun{m: in.m, changes: in.m.StateChanged()}
	if err := in.m.Start(ctx); err != nil {
		run.startErr = mapError("start virtual machine", err)
		in.vm.Watch(run)
		<-in.vm.Done()
		return run.startErr
	}
	in.vm.Watch(run)
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

// Kill is not used: Instance.Kill stops the machine and checks the error.
func (r machineRun) Kill() error { return r.m.Stop() }
func (r machineRun) Pid() int    { return 0 }

// Accept implements provider.Instance: the guest's connection on the
// virtio socket. The vz listener has no deadlines, so an interrupted
// Accept closes it (a sandbox accepts one connection).
func (in *Instance) Accept(ctx context.Context) (net.Conn, error) {
	in.mu.Lock()
	started := in.started
	in.mu.Unlock()
	if !started {
		return nil, provider.ErrNotStarted
	}
	if dl, ok := in.ln.(provider.DeadlineListener); ok {
		return provider.Accept(ctx, dl, in.vm.Done(), in.vm.Err)
	}
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() { c, err := in.ln.Accept(); ch <- result{c, err} }()
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, fmt.Errorf("accept guest connection: %w", r.err)
		}
		return r.c, nil
	case <-ctx.Done():
		in.closeListener()
		return nil, fmt.Errorf("accept guest connection: %w", ctx.Err())
	case <-in.vm.Done():
		in.closeListener()
		return nil, in.Err()
	}
}

func (in *Instance) closeListener() { in.closeLn.Do(func() { in.ln.Close() }) }

// Done implements provider.Instance.
func (in *Instance) Done() <-chan struct{} { return in.vm.Done() }

// Err implements provider.Instance.
func (in *Instance) Err() error { return in.vm.Err() }

// Kill implements provider.Instance: stop the machine at once.
func (in *Instance) Kill() error {
	in.mu.Lock()
	started := in.started
	in.mu.Unlock()
	if !started {
		return nil
	}
	return in.vm.KillWith(func() error {
		if err := in.m.Stop(); err != nil {
			if s := in.m.State(); s != StateStopped && s != StateError {
				return mapError("stop virtual machine", err)
			}
		}
		return nil
	})
}

// Destroy implements provider.Instance.
func (in *Instance) Destroy() error {
	err := in.Kill()
	in.closeListener()
	if in.tmp != "" {
		os.RemoveAll(in.tmp)
	}
	return err
}

// consoleWriter forwards console output without carriage returns, up to
// limit bytes; then it says so once and drops the rest.
type consoleWriter struct {
	mu      sync.Mutex
	w       io.Writer
	limit   int64
	written int64
	capped  bool
}

func (c *consoleWriter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(p)
	if c.capped {
		return n, nil
	}
	out := make([]byte, 0, len(p))
	for _, b := range p {
		if b != '\r' {
			out = append(out, b)
		}
	}
	if c.written+int64(len(out)) > c.limit {
		out = out[:c.limit-c.written]
		c.capped = true
	}
	c.written += int64(len(out))
	_, _ = c.w.Write(out)
	if c.capped {
		fmt.Fprintf(c.w, "\nconsole output limit of %d bytes reached; further console output dropped\n", c.limit)
	}
	return n, nil
}
