package qemu

import (
	"context"

	"github.com/oac/sandbox-agent/host/provider"
)

// Workload implements provider.Confiner: the VM's own kernel, and the
// agent (PID 1) owns its cgroup hierarchy.
func (p *Provider) Workload(ctx context.Context) string {
	mib := p.MemoryMiB
	if mib == 0 {
		mib = DefaultMemory
	}
	return provider.WorkloadSummary(provider.DaemonIsolated, provider.CgroupLimits(mib))
}
