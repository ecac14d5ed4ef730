//go:build darwin && cgo

package vz

// The only file that touches Virtualization.framework: it turns a VMConfig
// into vz objects and vz's errors and states into this package's, and
// decides nothing. It is compiled and tested only on macOS (see
// .github/workflows/macos.yml).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"

	vzf "github.com/Code-Hex/vz/v3"
)

func platformHypervisor() Hypervisor { return vzHypervisor{} }

type vzHypervisor struct{}

// Available implements Hypervisor.
func (vzHypervisor) Available() error {
	// Creating a Linux boot loader configuration is the cheapest call that
	// fails on a macOS without the APIs (vz checks the OS version).
	if _, err := vzf.NewVirtioSocketDeviceConfiguration(); err != nil {
		return convert(err)
	}
	return nil
}

// convert maps vz's errors to the portable ones.
func convert(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, vzf.ErrUnsupportedOSVersion) {
		return fmt.Errorf("%w: %v", ErrUnsupportedOS, err)
	}
	var ns *vzf.NSError
	if errors.As(err, &ns) {
		return &HVError{Domain: ns.Domain, Code: ns.Code, Description: ns.LocalizedDescription}
	}
	return err
}

// NewMachine implements Hypervisor.
func (vzHypervisor) NewMachine(cfg VMConfig, console io.Writer) (Machine, error) {
	boot, err := vzf.NewLinuxBootLoader(cfg.Kernel, vzf.WithInitrd(cfg.Initramfs), vzf.WithCommandLine(cfg.CommandLine))
	if err != nil {
		return nil, convert(err)
	}
	vc, err := vzf.NewVirtualMachineConfiguration(boot, cfg.CPUs, cfg.MemoryBytes)
	if err != nil {
		return nil, convert(err)
	}
	m := &vzMachine{}
	if cfg.Console {
		if err := m.attachConsole(vc, console); err != nil {
			return nil, err
		}
	}
	if cfg.Entropy {
		e, err := vzf.NewVirtioEntropyDeviceConfiguration()
		if err != nil {
			return nil, convert(err)
		}
		vc.SetEntropyDevicesVirtualMachineConfiguration([]*vzf.VirtioEntropyDeviceConfiguration{e})
	}
	if cfg.Balloon {
		b, err := vzf.NewVirtioTraditionalMemoryBalloonDeviceConfiguration()
		if err != nil {
			return nil, convert(err)
		}
		vc.SetMemoryBalloonDevicesVirtualMachineConfiguration([]vzf.MemoryBalloonDeviceConfiguration{b})
	}
	var disks []vzf.StorageDeviceConfiguration
	for _, d := range cfg.Disks {
		a, err := vzf.NewDiskImageStorageDeviceAttachment(d.Path, d.ReadOnly)
		if err != nil {
			return nil, convert(err)
		}
		blk, err := vzf.NewVirtioBlockDeviceConfiguration(a)
		if err != nil {
			return nil, convert(err)
		}
		disks = append(disks, blk)
	}
	vc.SetStorageDevicesVirtualMachineConfiguration(disks)
	var shares []vzf.DirectorySharingDeviceConfiguration
	for _, s := range cfg.Shares {
		dir, err := vzf.NewSharedDirectory(s.Path, s.ReadOnly)
		if err != nil {
			return nil, convert(err)
		}
		single, err := vzf.NewSingleDirectoryShare(dir)
		if err != nil {
			return nil, convert(err)
		}
		fs, err := vzf.NewVirtioFileSystemDeviceConfiguration(s.Tag)
		if err != nil {
			return nil, convert(err)
		}
		fs.SetDirectoryShare(single)
		shares = append(shares, fs)
	}
	vc.SetDirectorySharingDevicesVirtualMachineConfiguration(shares)
	sock, err := vzf.NewVirtioSocketDeviceConfiguration()
	if err != nil {
		return nil, convert(err)
	}
	vc.SetSocketDevicesVirtualMachineConfiguration([]vzf.SocketDeviceConfiguration{sock})
	// No network device: the guest has nothing but lo.
	if ok, err := vc.Validate(); !ok || err != nil {
		if err == nil {
			err = errors.New("configuration rejected")
		}
		m.closeConsole()
		return nil, convert(err)
	}
	vm, err := vzf.NewVirtualMachine(vc)
	if err != nil {
		m.closeConsole()
		return nil, convert(err)
	}
	m.vm = vm
	m.changes = make(chan State, 16)
	go func() {
		defer close(m.changes)
		for s := range vm.StateChangedNotify() {
			m.changes <- State(s)
			if s == vzf.VirtualMachineStateStopped || s == vzf.VirtualMachineStateError {
				m.closeConsole()
				return
			}
		}
	}()
	return m, nil
}

type vzMachine struct {
	vm      *vzf.VirtualMachine
	changes chan State
	// The console's pipe: the VM writes to consoleW, a goroutine copies
	// consoleR to the diagnostics; guest input is /dev/null.
	consoleR, consoleW, consoleIn *os.File
}

func (m *vzMachine) attachConsole(vc *vzf.VirtualMachineConfiguration, console io.Writer) error {
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("console pipe: %w", err)
	}
	in, err := os.Open(os.DevNull)
	if err != nil {
		r.Close()
		w.Close()
		return fmt.Errorf("console input: %w", err)
	}
	m.consoleR, m.consoleW, m.consoleIn = r, w, in
	att, err := vzf.NewFileHandleSerialPortAttachment(in, w)
	if err != nil {
		m.closeConsole()
		return convert(err)
	}
	port, err := vzf.NewVirtioConsoleDeviceSerialPortConfiguration(att)
	if err != nil {
		m.closeConsole()
		return convert(err)
	}
	vc.SetSerialPortsVirtualMachineConfiguration([]*vzf.VirtioConsoleDeviceSerialPortConfiguration{port})
	go func() { _, _ = io.Copy(console, r) }()
	return nil
}

func (m *vzMachine) closeConsole() {
	for _, f := range []*os.File{m.consoleW, m.consoleIn} {
		if f != nil {
			f.Close()
		}
	}
	m.consoleW, m.consoleIn = nil, nil
}

func (m *vzMachine) Start(ctx context.Context) error { return convert(m.vm.Start()) }
func (m *vzMachine) Stop() error                     { return convert(m.vm.Stop()) }
func (m *vzMachine) State() State                    { return State(m.vm.State()) }
func (m *vzMachine) StateChanged() <-chan State      { return m.changes }

func (m *vzMachine) ListenVsock(port uint32) (net.Listener, error) {
	devs := m.vm.SocketDevices()
	if len(devs) == 0 {
		return nil, errors.New("the virtual machine has no virtio socket device")
	}
	ln, err := devs[0].Listen(port)
	if err != nil {
		return nil, convert(err)
	}
	return ln, nil
}
