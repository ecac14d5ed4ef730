package wsl

import (
	"context"
	"fmt"

	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

// Workload implements provider.Confiner. The agent is root in the
// distribution but not its init, so the cgroups are not its to divide.
func (p *Provider) Workload(ctx context.Context) string {
	return provider.WorkloadSummary(provider.DaemonIsolated,
		fmt.Sprintf("%d tasks of uid 1000 (RLIMIT_NPROC) and 3/4 of the WSL VM's memory per process (RLIMIT_DATA)", bootstrap.WorkloadPids))
}
