//go:build !linux

package qemu

import (
	"context"
	"fmt"
	"time"

	"github.com/oac/sandbox-agent/host/provider"
)

// Provider boots qemu VMs; on this OS it is not built (macOS uses the
// Virtualization.framework provider).
type Provider struct {
	Qemu, Kernel, Initramfs, Arch, Firmware, Disk, Share, Virtiofsd, Accel, Transport string
	MemoryMiB, CPUs                                                                   int
	HostGrace                                                                         time.Duration
	ExtraAppend                                                                       string
	ConsoleLimit                                                                      int64
	StateRoot                                                                         string
	IDBase                                                                            int
}

// Name implements provider.Provider.
func (p *Provider) Name() string { return "qemu" }

// Check implements provider.Provider.
func (p *Provider) Check(context.Context) error {
	return fmt.Errorf("%w: qemu: the qemu provider runs only on Linux", provider.ErrUnavailable)
}

// Create implements provider.Provider.
func (p *Provider) Create(context.Context, provider.Spec) (provider.Instance, error) {
	return nil, p.Check(context.Background())
}
