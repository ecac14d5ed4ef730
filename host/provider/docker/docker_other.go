//go:build !linux

package docker

import (
	"context"
	"fmt"

	"github.com/oac/sandbox-agent/host/provider"
)

// Provider runs containers of a Docker engine; on this OS it is not
// built: the transport is a unix socket bound into the container, which
// needs the engine on the same kernel (Docker Desktop's VM does not relay
// sockets of the host). macOS uses the vz provider, Windows the wsl one.
type Provider struct {
	Docker, Image, StateRoot string
	Debug                    bool
}

// Name implements provider.Provider.
func (p *Provider) Name() string { return "docker" }

// Check implements provider.Provider.
func (p *Provider) Check(context.Context) error {
	return fmt.Errorf("%w: docker: the docker provider runs only with an engine on a Linux host", provider.ErrUnavailable)
}

// Create implements provider.Provider.
func (p *Provider) Create(context.Context, provider.Spec) (provider.Instance, error) {
	return nil, p.Check(context.Background())
}
