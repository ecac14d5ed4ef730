package bwrap

import (
	"os"

	"github.com/oac/sandbox-agent/host/provider"
)

// Provider runs guests under bubblewrap (Linux only; elsewhere the
// registered driver is unavailable).
type Provider struct {
	// Bwrap is the bwrap binary; default: OwnBwrap, an application's own
	// (where Ubuntu's AppArmor restricts user namespaces), when it is
	// there, else bwrap in PATH.
	Bwrap string `flag:"bwrap,path" meta:"FILE" usage:"the bwrap binary (default: /opt/oac/bin/bwrap when it exists, oac's own under its AppArmor profile, else bwrap in PATH)"`
	// StateRoot holds per-sandbox state; default kit.UserStateRoot's.
	StateRoot string
	// IDBase is the first host id of the id slots; default
	// kit.DefaultIDBase.
	IDBase int
	// SingleUID allows the rootless fallback without subordinate ids (see
	// SingleUIDLoss); it is never chosen silently.
	SingleUID bool `flag:"single-uid" usage:"without root and without subordinate ids: run with one uid (guest uid 1000 is you; there is no guest root)"`
}

// Name implements provider.Provider.
func (p *Provider) Name() string { return "bwrap" }

func init() {
	provider.Register(provider.Driver[Provider]{Name: "bwrap", New: (*Provider).driver})
}

// Capabilities implements provider.Provider: every optional feature, kept
// sandboxes, a guest root that is an unprivileged host id in every mode
// (its user namespace), and the single-uid fallback's loss said plainly
// before a rootless sandbox runs.
func (p *Provider) Capabilities() provider.Capabilities {
	// A root shim can enter the guest's mount namespace to mount a
	// claim's volumes; an unprivileged one cannot.
	c := provider.Capabilities{Honours: provider.AllFeatures, Keeps: true, GuestRootUnprivileged: true, ClaimVolumes: os.Geteuid() == 0}
	if p.SingleUID && os.Geteuid() != 0 {
		c.Warnings = []string{SingleUIDLoss}
	}
	return c
}
