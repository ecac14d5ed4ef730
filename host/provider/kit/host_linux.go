package kit

import (
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// HostMemory returns this host's memory in bytes (0 when unknown): what a
// guest sharing the host's kernel sees as MemTotal.
func HostMemory() uint64 {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return 0
	}
	return uint64(si.Totalram) * uint64(si.Unit)
}

// Seccomp reports whether this kernel filters system calls with seccomp
// (what oac-guest's workload filter needs in guests sharing it).
func Seccomp() bool {
	b, err := os.ReadFile("/proc/sys/kernel/seccomp/actions_avail")
	return err == nil && strings.Contains(string(b), "errno") && strings.Contains(string(b), "kill_process")
}
