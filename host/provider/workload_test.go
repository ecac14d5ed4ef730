package provider

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestWorkloadSummariesStateTheLimitsInForce(t *testing.T) {
	s := WorkloadSummary(DaemonIsolated, RlimitLimits(8<<30))
	assert.Equal(t, "seccomp filter (ptrace, other processes' memory, new user namespaces, keyctl, bpf, perf_event_open, userfaultfd, vsock refused); "+
		"the daemon in a mount namespace of its own without oac-sandbox-io's private file; oac-sandbox-io not dumpable; "+
		"limits: 128 tasks of uid 1000 (RLIMIT_NPROC) and 6144 MiB of data per process (RLIMIT_DATA, 3/4 of the memory)", s)
	assert.Equal(t, "pids 128 and memory 3/4 of the guest's (under 192 MiB of 256 MiB) for the whole workload (cgroup v2 in the guest)", CgroupLimits(256))
}
