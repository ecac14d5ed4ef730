//go:build !linux

package docker

import "github.com/oac/sandbox-agent/host/provider"

// driver: the transport is a unix socket bound into the container, which
// needs the engine on the same kernel (Docker Desktop's VM does not relay
// sockets of the host). macOS uses the vz provider, Windows the wsl one.
func (p *Provider) driver() provider.Provider {
	return provider.Unavailable("docker", "the docker provider runs only with an engine on a Linux host")
}
