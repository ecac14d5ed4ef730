//go:build !linux

package oci

import (
	"context"
	"fmt"

	"github.com/oac/sandbox-agent/host/provider"
)

// Provider runs OCI containers; on this OS it is never available (Docker
// Desktop's engine is reached through the docker provider).
type Provider struct {
	Runtime         string
	StateRoot       string
	IDBase          int
	NoNewPrivileges bool
	Debug           bool
}

// Name implements provider.Provider.
func (p *Provider) Name() string { return "oci" }

// Check implements provider.Provider.
func (p *Provider) Check(context.Context) error {
	return fmt.Errorf("%w: oci: runc and crun run only on Linux (use the docker provider with a Docker engine)", provider.ErrUnavailable)
}

// Create implements provider.Provider.
func (p *Provider) Create(context.Context, provider.Spec) (provider.Instance, error) {
	return nil, p.Check(context.Background())
}
