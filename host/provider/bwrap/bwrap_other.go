//go:build !linux

package bwrap

import (
	"context"
	"fmt"

	"github.com/oac/sandbox-agent/host/provider"
)

// Provider runs guests under bubblewrap; on this OS it is never available.
type Provider struct {
	Bwrap     string
	StateRoot string
	IDBase    int
	SingleUID bool
}

// Name implements provider.Provider.
func (p *Provider) Name() string { return "bwrap" }

// Check implements provider.Provider.
func (p *Provider) Check(context.Context) error {
	return fmt.Errorf("%w: bwrap: bubblewrap runs only on Linux", provider.ErrUnavailable)
}

// Create implements provider.Provider.
func (p *Provider) Create(context.Context, provider.Spec) (provider.Instance, error) {
	return nil, p.Check(context.Background())
}
