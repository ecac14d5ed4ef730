package bootstrap

// The workload's limits (oac-sandbox-io, the daemon and what they start),
// which oac-guest enforces in every guest and oac-shim check states.
const (
	// WorkloadPids is the most tasks (threads included) the workload may
	// have: the hosted containers' pids limit.
	WorkloadPids = 128
	// WorkloadFilter says what the workload's seccomp filter refuses, as
	// the agent and oac-shim check describe it.
	WorkloadFilter = "seccomp filter (ptrace, other processes' memory, new user namespaces, keyctl, bpf, perf_event_open, userfaultfd, vsock refused)"
	// WorkloadMemoryQuarters of the guest's memory may go to the
	// workload; the rest stays for the agent and the kernel.
	WorkloadMemoryQuarters = 3
)

// WorkloadMemory returns the workload's memory limit in a guest with total
// bytes of memory.
func WorkloadMemory(total uint64) uint64 { return total / 4 * WorkloadMemoryQuarters }
