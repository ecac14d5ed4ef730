package docker

import (
	"github.com/oac/sandbox-agent/host/apparmor"
	"github.com/oac/sandbox-agent/host/provider"
)

// Provider runs guests as containers of a Docker engine through the docker
// command line client (Linux only; elsewhere the registered driver is
// unavailable).
type Provider struct {
	// Docker is the docker client; default: found in PATH.
	Docker string `flag:"docker" meta:"PATH" usage:"the docker client (default: docker in PATH)"`
	// Image is the guest image (required); it is never pulled.
	Image string `flag:"docker-image" meta:"!IMAGE" usage:"the guest image to run (never pulled)"`
	// AppArmor is how containers of an engine that confines them with
	// AppArmor get the guest's profile (apparmor.Mode; "" is load).
	AppArmor string `flag:"docker-apparmor" meta:"load|require" usage:"where the engine confines containers with AppArmor: load (default: oac-shim loads the oac-guest profile when root, else uses the loaded one) or require (only a loaded oac-guest profile)"`
	// StateRoot holds per-sandbox state; default kit.DefaultStateRoot.
	StateRoot string
	Debug     bool
	// aa is this host's AppArmor (replaced in tests).
	aa apparmor.Host
}

// Name implements provider.Provider.
func (p *Provider) Name() string { return "docker" }

func init() {
	provider.Register(provider.Driver[Provider]{Name: "docker", Defaults: &Provider{AppArmor: string(apparmor.Load)}, New: (*Provider).driver})
}

// Capabilities implements provider.Provider: installs and volumes are
// bind mounts; the root is the image; kept sandboxes are a container and
// volumes. The engine gives the container no user namespace of its own
// by default: guest root holds the engine's capability set in the host's
// user namespace, so the guest is never offered host sockets.
func (p *Provider) Capabilities() provider.Capabilities {
	return provider.Capabilities{
		Honours: []provider.Feature{provider.FeatureSandboxIO, provider.FeatureInstall, provider.FeatureVolume},
		Instead: map[provider.Feature]string{provider.FeatureRootfs: "it runs an image: pass --docker-image (docker import the image build's rootfs.tar.gz)"},
		Keeps:   true,
	}
}
