package oci

import (
	"github.com/oac/sandbox-agent/host/provider"
	"os"
)

// Provider runs guests as OCI containers under runc or crun (Linux only;
// elsewhere the registered driver is unavailable).
type Provider struct {
	// Runtime is runc, crun or a path to one of them; "" picks runc, then
	// crun, from PATH.
	Runtime string `flag:"runtime" meta:"runc|crun|PATH" usage:"runc, crun or the path of one (default: runc, else crun)"`
	// StateRoot holds per-sandbox state; default kit.DefaultStateRoot.
	StateRoot string
	// IDBase is the first host id of the id slots; default
	// kit.DefaultIDBase, the allocator the bwrap provider draws from too.
	IDBase int
	// NoNewPrivileges sets no_new_privs on the agent (the container
	// process); the agent sets it on the daemon either way.
	NoNewPrivileges bool `flag:"oci-no-new-privs" usage:"set no-new-privileges on the agent itself (the daemon always gets it)"`
	// Debug runs the agent with --debug.
	Debug bool
}

// Name implements provider.Provider.
func (p *Provider) Name() string { return "oci" }

func init() {
	provider.Register(provider.Driver[Provider]{Name: "oci", Defaults: &Provider{NoNewPrivileges: true}, New: (*Provider).driver})
}

// Capabilities implements provider.Provider: every optional feature, kept
// sandboxes, and a guest root mapped to the sandbox's unprivileged id
// range (the bundle's user namespace).
func (p *Provider) Capabilities() provider.Capabilities {
	return provider.Capabilities{Honours: provider.AllFeatures, Keeps: true, GuestRootUnprivileged: true, ClaimVolumes: os.Geteuid() == 0}
}
