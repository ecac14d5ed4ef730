package bwrap

import (
	"context"

	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/provider/kit"
)

// Workload implements provider.Confiner.
func (p *Provider) Workload(ctx context.Context) string {
	if !kit.Seccomp() {
		return "this kernel has no seccomp filters: workload processes cannot start (oac-guest refuses to run them unfiltered)"
	}
	s := provider.WorkloadSummary(provider.DaemonIsolated, provider.RlimitLimits(kit.HostMemory())+"; bwrap gives the guest no cgroup of its own")
	if m, err := p.mode(); err == nil && m == ModeSingleUID {
		if bw, err := p.bwrap(); err == nil && bwrapFeatures(bw).DisableUserns {
			s += "; no user namespace can be created anywhere in the guest (bwrap --disable-userns)"
		}
	}
	return s
}
