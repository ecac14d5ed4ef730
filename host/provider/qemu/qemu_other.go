//go:build !linux

package qemu

import "github.com/oac/sandbox-agent/host/provider"

// driver: qemu is not built here (macOS uses the Virtualization.framework
// provider).
func (p *Provider) driver() provider.Provider {
	return provider.Unavailable("qemu", "the qemu provider runs only on Linux")
}
