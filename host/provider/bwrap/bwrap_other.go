//go:build !linux

package bwrap

import "github.com/oac/sandbox-agent/host/provider"

// driver: bubblewrap is Linux's.
func (p *Provider) driver() provider.Provider {
	return provider.Unavailable("bwrap", "bubblewrap runs only on Linux")
}
