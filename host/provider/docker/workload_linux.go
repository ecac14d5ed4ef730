package docker

import (
	"context"
	"fmt"

	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/provider/kit"
)

// Workload implements provider.Confiner. The container's seccomp profile
// (kit.ContainerSeccompProfile: the engine's default plus the launcher's calls) and CAP_SETFCAP
// let the agent start each workload process in a nested user and mount
// namespace, as under the oci provider.
func (p *Provider) Workload(ctx context.Context) string {
	return provider.WorkloadSummary(provider.DaemonIsolatedNested,
		fmt.Sprintf("pids %d for the whole container (--pids-limit), and %s", kit.PidsLimit, provider.RlimitLimits(kit.HostMemory())))
}
