package oci

import (
	"context"
	"fmt"

	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/provider/kit"
)

// Workload implements provider.Confiner.
func (p *Provider) Workload(ctx context.Context) string {
	if !kit.Seccomp() {
		return "this kernel has no seccomp filters: workload processes cannot start"
	}
	return provider.WorkloadSummary(provider.DaemonIsolatedNested,
		fmt.Sprintf("pids %d for the whole container (cgroup), and %s", kit.PidsLimit, provider.RlimitLimits(kit.HostMemory())))
}
