package workload

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

// cgroupRoot is where cgroup v2 is mounted in a guest, and cgroupName the
// workload's cgroup below it.
const (
	cgroupRoot = "/sys/fs/cgroup"
	cgroupName = "/oac-workload"
)

// memoryLimit is the workload's share of the guest's memory
// (bootstrap.WorkloadMemory).
func memoryLimit() uint64 {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil || si.Totalram == 0 {
		return 1 << 30
	}
	return bootstrap.WorkloadMemory(uint64(si.Totalram) * uint64(si.Unit))
}

// workloadCgroup creates the workload's cgroup with pids.max and
// memory.max and opens it for CLONE_INTO_CGROUP. The agent uses a cgroup
// only where the guest gives it a whole cgroup v2 hierarchy (it is at the
// root of its cgroup namespace, as PID 1 of a VM is): a cgroup below
// another manager's (systemd's) is that manager's to divide.
func workloadCgroup(memLimit uint64) (*os.File, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(cgroupRoot, &st); err != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		return nil, errors.New("no cgroup v2 hierarchy at " + cgroupRoot)
	}
	own, err := ownCgroup()
	if err != nil {
		return nil, err
	}
	if own != "/" {
		return nil, fmt.Errorf("the agent's cgroup is %s, not the root of a hierarchy of its own", own)
	}
	ctrl, err := os.ReadFile(filepath.Join(cgroupRoot, "cgroup.controllers"))
	if err != nil {
		return nil, err
	}
	have := strings.Fields(string(ctrl))
	for _, c := range []string{"pids", "memory"} {
		if !slices.Contains(have, c) {
			return nil, fmt.Errorf("cgroup v2 has no %s controller", c)
		}
	}
	dir := filepath.Join(cgroupRoot, cgroupName)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("create %s: %w", dir, err)
	}
	for _, w := range [][2]string{
		{filepath.Join(cgroupRoot, "cgroup.subtree_control"), "+pids +memory"},
		{filepath.Join(dir, "pids.max"), strconv.Itoa(PidsMax)},
		{filepath.Join(dir, "memory.max"), strconv.FormatUint(memLimit, 10)},
	} {
		if err := os.WriteFile(w[0], []byte(w[1]), 0); err != nil {
			return nil, fmt.Errorf("write %s: %w", w[0], err)
		}
	}
	return os.OpenFile(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
}

// ownCgroup returns the agent's cgroup v2 path ("0::PATH").
func ownCgroup() (string, error) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if p, ok := strings.CutPrefix(sc.Text(), "0::"); ok {
			return p, nil
		}
	}
	return "", errors.New("no cgroup v2 entry in /proc/self/cgroup")
}
