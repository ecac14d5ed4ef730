//go:build linux

package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
)

// ociRuntimes are the OCI runtimes booted for real (Debian packages runc
// and crun; make deps installs them).
var ociRuntimes = []string{"runc", "crun"}

func needOCI(t *testing.T, runtime string) {
	t.Helper()
	_, err := exec.LookPath(runtime)
	need(t, err == nil, runtime+" is not installed: apt-get install "+runtime+" (or run make deps)")
	need(t, os.Geteuid() == 0, "the oci provider runs the runtime as root: run the e2e tests as root (sudo make test)")
}

// runtimeRoot is where the runtime keeps container state by default.
func runtimeRoot(runtime string) string { return "/run/" + runtime }

// pidsMax returns the pids limit of the sandbox's cgroup, on a v1 or v2
// layout ("" when the cgroup does not exist).
func pidsMax(name string) string {
	for _, p := range []string{"/sys/fs/cgroup/pids/oac/oac-" + name, "/sys/fs/cgroup/pids/oac/" + name, "/sys/fs/cgroup/oac/" + name} {
		if b, err := os.ReadFile(filepath.Join(p, "pids.max")); err == nil {
			return strings.TrimSpace(string(b))
		}
	}
	return ""
}

var readyIn = regexp.MustCompile(`guest ready in (\S+)`)

func TestOCIBootsHardenedGuestsAndLeavesNothingBehind(t *testing.T) {
	for _, rt := range ociRuntimes {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			needOCI(t, rt)
			marker := sleepMarker()
			s := startShim(t, sandboxSpec{provider: "oci", args: []string{"--runtime", rt}, bootstrap: daemon(
				`trap 'echo daemon got TERM; exit 0' TERM; echo "uid=$(id -u) gid=$(id -g) groups=$(id -G)"; grep NoNewPrivs /proc/self/status; grep CapEff /proc/self/status; `+
					`echo "ifaces=$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\n' ' ')"; `+
					`echo "pid1=$(cat /proc/1/comm)"; echo "host=$(hostname)"; `+
					`echo "rootfs=$(touch /oac-probe 2>&1 | grep -o 'Read-only file system')"; `+
					`echo "tmp=$(df -k /tmp | tail -1 | awk '{print $2}')"; `+
					`echo "lo=$(cat /sys/class/net/lo/operstate 2>/dev/null || echo none)"; `+
					marker+` & wait`, `"hostname":"oci-e2e"`)})
			ready := s.waitState(api.StateReady, bootTimeout)
			t.Logf("%s: %s", rt, ready.Message)
			assert.Regexp(t, readyIn, ready.Message)
			assert.Equal(t, "1000 gid=1000 groups=1000", s.waitLog("uid=", bootTimeout))
			assert.Equal(t, "1", strings.TrimSpace(s.waitLog("NoNewPrivs:", bootTimeout)))
			assert.Equal(t, "0000000000000000", strings.TrimSpace(s.waitLog("CapEff:", bootTimeout)), "the daemon has no capabilities")
			assert.Equal(t, "lo ", s.waitLog("ifaces=", bootTimeout), "no network but lo")
			assert.Equal(t, "oac-guest", s.waitLog("pid1=", bootTimeout))
			assert.Equal(t, "oci-e2e", s.waitLog("host=", bootTimeout))
			assert.Equal(t, "Read-only file system", s.waitLog("rootfs=", bootTimeout))
			assert.Equal(t, strconv.Itoa(128*1024), s.waitLog("tmp=", bootTimeout), "a 128 MiB /tmp")
			assert.NotEqual(t, "down", s.waitLog("lo=", bootTimeout))
			assert.Equal(t, "128", pidsMax(s.name), "pids limit 128")

			var pids []int
			require.Eventually(t, func() bool { pids = filterCmdline(hostProcs(marker), "sleep 100000."); return len(pids) == 1 },
				5*time.Second, 20*time.Millisecond)
			uids := procStatus(t, pids[0], "Uid")
			hostUID, err := strconv.Atoi(uids[0])
			require.NoError(t, err)
			assert.NotContains(t, []int{0, 1000}, hostUID, "guest uid 1000 is an unprivileged host id of its own")
			shell, err := strconv.Atoi(procStatus(t, pids[0], "PPid")[0])
			require.NoError(t, err)
			agentPID, err := strconv.Atoi(procStatus(t, shell, "PPid")[0])
			require.NoError(t, err)
			agentUID := procStatus(t, agentPID, "Uid")[0]
			assert.NotEqual(t, "0", agentUID, "guest root is not host root")
			assert.NotEqual(t, uids[0], agentUID)
			assert.Equal(t, strconv.Itoa(hostUID-1000), agentUID, "one id range: guest 0 and 1000 are 1000 apart on the host")
			assert.DirExists(t, filepath.Join(runtimeRoot(rt), "oac-"+s.name))

			s.signal(syscall.SIGTERM)
			s.waitLog("daemon got TERM", 10*time.Second)
			assert.Equal(t, 0, s.exit(15*time.Second))
			assert.Equal(t, api.StateStopped, s.lastEvent().State)
			assert.Empty(t, hostProcs(marker))
			assert.NoDirExists(t, filepath.Join(runtimeRoot(rt), "oac-"+s.name), "no container state left in the runtime's root")
			assert.NoDirExists(t, filepath.Join("/run/oac/sandboxes", s.name))
			assert.Equal(t, "", pidsMax(s.name), "the cgroup is removed")
		})
	}
}

func TestOCIRuntimeKilledIsReportedFailedAndCleanedUp(t *testing.T) {
	for _, rt := range ociRuntimes {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			needOCI(t, rt)
			marker := sleepMarker()
			s := startShim(t, sandboxSpec{provider: "oci", args: []string{"--runtime", rt}, bootstrap: daemon("exec " + marker)})
			s.waitState(api.StateReady, bootTimeout)
			var runtimes []int
			require.Eventually(t, func() bool {
				runtimes = filterCmdline(hostProcs("--no-new-keyring oac-"+s.name), "/usr/")
				return len(runtimes) == 1
			}, 5*time.Second, 20*time.Millisecond, "the %s run process", rt)
			require.NoError(t, syscall.Kill(runtimes[0], syscall.SIGKILL))

			failed := s.waitState(api.StateFailed, 10*time.Second)
			assert.Regexp(t, `sandbox runtime exited|guest connection lost`, failed.Message)
			s.exitFailed(api.CodeRuntimeFailed, 15*time.Second)
			assert.Eventually(t, func() bool { return len(hostProcs(marker)) == 0 }, 5*time.Second, 20*time.Millisecond,
				"the container is deleted with its daemon")
			assert.NoDirExists(t, filepath.Join(runtimeRoot(rt), "oac-"+s.name))
			assert.NoDirExists(t, filepath.Join("/run/oac/sandboxes", s.name))
		})
	}
}

// filterCmdline keeps the pids whose command line starts with sub.
func filterCmdline(pids []int, sub string) []int {
	var out []int
	for _, p := range pids {
		if strings.HasPrefix(strings.ReplaceAll(readCmdline(p), "\x00", " "), sub) {
			out = append(out, p)
		}
	}
	return out
}
