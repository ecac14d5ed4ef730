package docker

import (
	"context"
	"fmt"

	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/provider/kit"
)

// Workload implements provider.Confiner. The container gives the agent no
// capability to make namespaces (and the engine's seccomp profile refuses
// them), so the daemon shares oac-sandbox-io's view of the files.
func (p *Provider) Workload(ctx context.Context) string {
	return provider.WorkloadSummary("the daemon NOT kept from oac-sandbox-io's private file (the container lets the agent make no mount namespace)",
		fmt.Sprintf("pids %d for the whole container (--pids-limit), and %s", kit.PidsLimit, provider.RlimitLimits(kit.HostMemory())))
}
