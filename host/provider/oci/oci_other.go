//go:build !linux

package oci

import "github.com/oac/sandbox-agent/host/provider"

// driver: runc and crun are Linux's (Docker Desktop's engine is reached
// through the docker provider).
func (p *Provider) driver() provider.Provider {
	return provider.Unavailable("oci", "runc and crun run only on Linux (use the docker provider with a Docker engine)")
}
