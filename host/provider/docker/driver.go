package docker

import (
	"github.com/oac/sandbox-agent/host/provider"
)

// Provider runs guests as containers of a Docker engine through the docker
// command line client (Linux only; elsewhere the registered driver is
// unavailable).
type Provider struct {
	// Docker is the docker client; default: found in PATH.
	Docker string
	// Image is the guest image (required); it is never pulled.
	Image string
	// StateRoot holds per-sandbox state; default kit.DefaultStateRoot.
	StateRoot string
	Debug     bool
}

// Name implements provider.Provider.
func (p *Provider) Name() string { return "docker" }

func init() {
	provider.Register(provider.Driver{
		Name:  "docker",
		Usage: "--docker-image IMAGE [--docker PATH]",
		Flags: func(fs *provider.FlagSet) func() provider.Provider {
			docker := fs.String("docker", "", "the docker client (default: docker in PATH)")
			image := fs.String("docker-image", "", "the guest image to run (never pulled)")
			return func() provider.Provider { return (&Provider{Docker: *docker, Image: *image}).driver() }
		},
	})
}
