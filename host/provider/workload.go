package provider

import (
	"context"
	"fmt"

	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

// Confiner is implemented by providers that can say how the workload
// (oac-sandbox-io and the daemon) is confined in their sandboxes here;
// oac-shim check prints it.
type Confiner interface {
	Workload(ctx context.Context) string
}

// WorkloadSummary joins what oac-guest gives the workload in every guest
// (its seccomp filter; oac-sandbox-io never dumpable) with what depends on
// the provider: whether the daemon gets a mount namespace of its own
// without oac-sandbox-io's private file, and which limits apply.
func WorkloadSummary(daemon, limits string) string {
	return bootstrap.WorkloadFilter + "; " + daemon + "; oac-sandbox-io not dumpable; limits: " + limits
}

// Daemon isolation, as WorkloadSummary's daemon.
const (
	DaemonIsolated       = "the daemon in a mount namespace of its own without oac-sandbox-io's private file"
	DaemonIsolatedNested = "the daemon in a nested user and mount namespace of its own without oac-sandbox-io's private file"
)

// RlimitLimits describes the limits of a guest without a cgroup of its
// own, whose memory is memTotal bytes.
func RlimitLimits(memTotal uint64) string {
	return fmt.Sprintf("%d tasks of uid 1000 (RLIMIT_NPROC) and %d MiB of data per process (RLIMIT_DATA, 3/4 of the memory)",
		bootstrap.WorkloadPids, bootstrap.WorkloadMemory(memTotal)>>20)
}

// CgroupLimits describes the limits of a VM guest of vmMiB, whose agent
// owns the cgroup v2 hierarchy.
func CgroupLimits(vmMiB int) string {
	return fmt.Sprintf("pids %d and memory 3/4 of the guest's (under %d MiB of %d MiB) for the whole workload (cgroup v2 in the guest)",
		bootstrap.WorkloadPids, bootstrap.WorkloadMemory(uint64(vmMiB)<<20)>>20, vmMiB)
}
