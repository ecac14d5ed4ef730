//go:build linux

package e2e

import (
	"crypto/rand"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
)

const bootTimeout = 20 * time.Second

// sleepMarker returns a sleep command line unique to this test, so the
// daemon can be found among the host's processes.
func sleepMarker() string {
	n, _ := rand.Int(rand.Reader, big.NewInt(1_000_000))
	return fmt.Sprintf("sleep 100000.%06d", n.Int64())
}

func TestBootsToReadyAndStopsCleanlyOnSIGTERM(t *testing.T) {
	needBwrap(t)
	s := startShim(t, sandboxSpec{bootstrap: daemon("exec sleep 1000")})
	s.waitState(api.StateStarting, bootTimeout)
	ready := s.waitState(api.StateReady, bootTimeout)
	assert.Contains(t, ready.Message, "guest ready in")

	s.signal(syscall.SIGTERM)
	stopped := s.waitState(api.StateStopped, 15*time.Second)
	assert.Contains(t, stopped.Message, "received terminated")
	assert.Equal(t, 0, s.exit(10*time.Second))
	assert.Equal(t, api.StateStopped, s.lastEvent().State, "the last event is the final state")
}

func TestAgentIsPID1OfTheGuest(t *testing.T) {
	needBwrap(t)
	s := startShim(t, sandboxSpec{bootstrap: daemon(`echo "pid1=$(cat /proc/1/comm)"; exec sleep 1000`)})
	agent := s.waitFor(func(e api.Event) bool { return e.Event == api.KindAgent }, bootTimeout, "agent event")
	assert.Equal(t, 1, agent.PID, "the agent reports its own pid in Hello")
	assert.Equal(t, 1, agent.Protocol)
	assert.Equal(t, "oac-guest", s.waitLog("pid1=", bootTimeout))
	s.signal(syscall.SIGTERM)
	assert.Equal(t, 0, s.exit(15*time.Second))
}

func TestDaemonRunsAsUID1000InTheGuestAndAsAnUnprivilegedUIDOnTheHost(t *testing.T) {
	needBwrap(t)
	marker := sleepMarker()
	s := startShim(t, sandboxSpec{bootstrap: daemon(
		`echo "uid=$(id -u) gid=$(id -g) groups=$(id -G)"; grep NoNewPrivs /proc/self/status; grep CapEff /proc/self/status; exec ` + marker)})
	s.waitState(api.StateReady, bootTimeout)
	assert.Equal(t, "1000 gid=1000 groups=1000", s.waitLog("uid=", bootTimeout),
		"uid and gid 1000 with no supplementary groups")
	assert.Equal(t, "1", strings.TrimSpace(s.waitLog("NoNewPrivs:", bootTimeout)), "no-new-privileges is set")
	assert.Equal(t, "0000000000000000", strings.TrimSpace(s.waitLog("CapEff:", bootTimeout)), "no capabilities")

	var pids []int
	require.Eventually(t, func() bool { pids = hostProcs(marker); return len(pids) == 1 }, 5*time.Second, 20*time.Millisecond)
	daemonPID := pids[0]
	uids := procStatus(t, daemonPID, "Uid")
	gids := procStatus(t, daemonPID, "Gid")
	hostUID, err := strconv.Atoi(uids[0])
	require.NoError(t, err)
	assert.NotEqual(t, 0, hostUID, "the daemon must not be host root")
	assert.NotEqual(t, 1000, hostUID, "guest uid 1000 must not be the host's uid 1000")
	assert.Equal(t, []string{uids[0], uids[0], uids[0], uids[0]}, uids, "real, effective, saved and fs uid agree")
	assert.Equal(t, uids, gids, "gid maps like uid")

	// The daemon's parent on the host is the agent: guest root, which must
	// not be host root either and must differ from the daemon's uid.
	agentPID, err := strconv.Atoi(procStatus(t, daemonPID, "PPid")[0])
	require.NoError(t, err)
	agentUID := procStatus(t, agentPID, "Uid")[0]
	assert.NotEqual(t, "0", agentUID, "guest root must not be host root")
	assert.NotEqual(t, uids[0], agentUID, "guest root and uid 1000 are distinct host ids")

	s.signal(syscall.SIGTERM)
	assert.Equal(t, 0, s.exit(15*time.Second))
}

func TestGuestHasNoNetworkInterfaceButLoopback(t *testing.T) {
	needBwrap(t)
	s := startShim(t, sandboxSpec{bootstrap: daemon(`echo "ifaces=$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\n' ' ')"; exec sleep 1000`)})
	assert.Equal(t, "lo ", s.waitLog("ifaces=", bootTimeout))
	s.signal(syscall.SIGTERM)
	assert.Equal(t, 0, s.exit(15*time.Second))
}

func TestSIGTERMStopsEverythingWithinTheGraceAndLeavesNothingBehind(t *testing.T) {
	needBwrap(t)
	marker := sleepMarker()
	// The daemon ignores SIGTERM (and so do its children), so only the
	// KILL after the 1s grace stops it.
	s := startShim(t, sandboxSpec{bootstrap: daemon(`trap "" TERM; `+marker+` & echo started; wait`, `"stop_grace":"1s"`)})
	s.waitState(api.StateReady, bootTimeout)
	s.waitLog("started", bootTimeout)
	// The shell (its -c script names the marker) and the sleep itself.
	require.Eventually(t, func() bool { return len(hostProcs(marker)) == 2 }, 5*time.Second, 20*time.Millisecond)

	begin := time.Now()
	s.signal(syscall.SIGTERM)
	assert.Equal(t, 0, s.exit(15*time.Second))
	took := time.Since(begin)
	t.Logf("SIGTERM to shim exit: %s with a 1s grace", took)
	assert.Less(t, took, 1*time.Second+5*time.Second, "grace plus the stop margin")
	assert.Equal(t, api.StateStopped, s.lastEvent().State)
	assert.Empty(t, hostProcs(marker), "the daemon's children are gone")
	_, err := os.Stat(filepath.Join("/run/oac/sandboxes", s.name))
	assert.True(t, os.IsNotExist(err), "the sandbox's state directory is removed")
}

func TestGuestKilledFromOutsideIsReportedFailed(t *testing.T) {
	needBwrap(t)
	marker := sleepMarker()
	s := startShim(t, sandboxSpec{bootstrap: daemon("exec " + marker)})
	s.waitState(api.StateReady, bootTimeout)
	var pids []int
	require.Eventually(t, func() bool { pids = hostProcs(marker); return len(pids) == 1 }, 5*time.Second, 20*time.Millisecond)
	agentPID, err := strconv.Atoi(procStatus(t, pids[0], "PPid")[0])
	require.NoError(t, err)
	require.NoError(t, syscall.Kill(agentPID, syscall.SIGKILL))

	failed := s.waitState(api.StateFailed, 10*time.Second)
	assert.Regexp(t, `guest connection lost|sandbox runtime exited`, failed.Message)
	s.exitFailed(api.CodeRuntimeFailed, 10*time.Second)
	assert.Contains(t, s.stderr.String(), "oac-shim: ", "a one-line reason on stderr")
	// The kernel tears the pid namespace down asynchronously.
	assert.Eventually(t, func() bool { return len(hostProcs(marker)) == 0 }, 5*time.Second, 20*time.Millisecond,
		"the daemon dies with the guest's PID 1")
}

func TestDaemonExitAfterReadyIsFailed(t *testing.T) {
	needBwrap(t)
	s := startShim(t, sandboxSpec{bootstrap: daemon("sleep 0.2; exit 3")})
	s.waitState(api.StateReady, bootTimeout)
	exited := s.waitFor(func(e api.Event) bool {
		return e.Event == api.KindProcess && e.Running != nil && !*e.Running
	}, 10*time.Second, "process exit event")
	require.NotNil(t, exited.ExitCode)
	assert.Equal(t, 3, *exited.ExitCode)
	failed := s.waitState(api.StateFailed, 10*time.Second)
	assert.Equal(t, "guest: daemon exited: exit status 3", failed.Message)
	s.exitFailed(api.CodeDaemonFailed, 15*time.Second)
}

func TestInvalidBootstrapCreatesNothing(t *testing.T) {
	needBwrap(t)
	s := startShim(t, sandboxSpec{bootstrap: `{"version":1,"daemon":{"argv":["relative/path","secret-value"]}}`})
	failed := s.waitState(api.StateFailed, 10*time.Second)
	assert.Contains(t, failed.Message, "nothing created")
	assert.Contains(t, failed.Message, "argv")
	assert.NotContains(t, failed.Message, "secret-value", "messages never echo submitted values")
	s.exitFailed(api.CodeInvalidBootstrap, 10*time.Second)
	_, err := os.Stat(filepath.Join("/run/oac/sandboxes", s.name))
	assert.True(t, os.IsNotExist(err), "no state directory was created")
}

func TestGuestSpeakingAnotherProtocolVersionFailsClearly(t *testing.T) {
	needBwrap(t)
	s := startShim(t, sandboxSpec{agent: bins.badVersion})
	failed := s.waitState(api.StateFailed, bootTimeout)
	assert.Contains(t, failed.Message, "protocol version mismatch: guest speaks 2..3, host 1..1")
	s.exitFailed(api.CodeGuestIncompatible, 10*time.Second)
	assert.Contains(t, s.stderr.String(), "badguest: handshake: protocol version mismatch: guest speaks 2..3, host 1..1",
		"the guest side fails with the same message")
	assert.NotContains(t, s.stderr.String(), "panic")
}

func TestPeerSendingGarbageFailsClearly(t *testing.T) {
	needBwrap(t)
	s := startShim(t, sandboxSpec{agent: bins.badGarbage})
	failed := s.waitState(api.StateFailed, bootTimeout)
	assert.Contains(t, failed.Message, "handshake with guest: guest sent bytes that are not an oac session")
	s.exitFailed(api.CodeGuestIncompatible, 10*time.Second)
	assert.NotContains(t, s.stderr.String(), "panic")
}

func TestTwoSandboxesWithTheSameNameCannotRunAtOnce(t *testing.T) {
	needBwrap(t)
	name := uniqueName("dup")
	first := startShim(t, sandboxSpec{name: name, bootstrap: daemon("exec sleep 1000")})
	first.waitState(api.StateReady, bootTimeout)
	second := startShim(t, sandboxSpec{name: name, bootstrap: daemon("exec sleep 1000")})
	failed := second.waitState(api.StateFailed, 10*time.Second)
	assert.Contains(t, failed.Message, "sandbox already exists")
	second.exitFailed(api.CodeInvalidConfig, 10*time.Second)
	first.signal(syscall.SIGTERM)
	assert.Equal(t, 0, first.exit(15*time.Second))
}

func TestOrphansInTheGuestAreReapedByTheAgent(t *testing.T) {
	needBwrap(t)
	// Each subshell exits at once and leaves a sleep whose parent dies:
	// the orphans are re-parented to PID 1, which must reap them.
	s := startShim(t, sandboxSpec{bootstrap: daemon(
		`for i in 1 2 3 4 5; do (sleep 0.05 &); done; sleep 0.5; ` +
			`echo "zombies=$(cat /proc/[0-9]*/stat 2>/dev/null | awk '$3 == "Z"' | wc -l)"; exec sleep 1000`)})
	assert.Equal(t, "0", s.waitLog("zombies=", bootTimeout))
	s.signal(syscall.SIGTERM)
	assert.Equal(t, 0, s.exit(15*time.Second))
}

func TestSIGTERMToTheAgentStopsTheGuestInOrder(t *testing.T) {
	needBwrap(t)
	marker := sleepMarker()
	s := startShim(t, sandboxSpec{bootstrap: daemon(`trap 'echo daemon got TERM; exit 0' TERM; ` + marker + ` & wait`)})
	s.waitState(api.StateReady, bootTimeout)
	// The shell is the daemon; its parent is the agent. Wait until its
	// background child has exec'd sleep, so the two cannot be confused.
	var shell int
	require.Eventually(t, func() bool {
		shell = 0
		sleeps := 0
		for _, p := range hostProcs(marker) {
			switch cmd := readCmdline(p); {
			case strings.HasPrefix(cmd, "/bin/sh"):
				shell = p
			case strings.HasPrefix(cmd, "sleep"):
				sleeps++
			}
		}
		return shell != 0 && sleeps == 1
	}, 5*time.Second, 20*time.Millisecond)
	agentPID, err := strconv.Atoi(procStatus(t, shell, "PPid")[0])
	require.NoError(t, err)
	require.NoError(t, syscall.Kill(agentPID, syscall.SIGTERM))

	assert.Equal(t, "", s.waitLog("daemon got TERM", 10*time.Second), "the daemon was asked to stop first")
	failed := s.waitState(api.StateFailed, 10*time.Second)
	assert.Equal(t, "guest stopped on its own: agent received a stop signal", failed.Message)
	s.exitFailed(api.CodeGuestFailed, 10*time.Second)
	assert.Empty(t, hostProcs(marker))
}

func TestKillingTheShimLeavesNoGuestProcessBehind(t *testing.T) {
	needBwrap(t)
	marker := sleepMarker()
	s := startShim(t, sandboxSpec{bootstrap: daemon("exec " + marker)})
	s.waitState(api.StateReady, bootTimeout)
	require.Eventually(t, func() bool { return len(hostProcs(marker)) == 1 }, 5*time.Second, 20*time.Millisecond)
	s.signal(syscall.SIGKILL)
	s.exit(5 * time.Second)
	assert.Eventually(t, func() bool { return len(hostProcs(marker)) == 0 }, 5*time.Second, 20*time.Millisecond,
		"bwrap and the guest die with the shim")
}

func TestEventsCanGoToAFile(t *testing.T) {
	needBwrap(t)
	file := filepath.Join(t.TempDir(), "events.jsonl")
	s := startShim(t, sandboxSpec{args: []string{"--events", file, "--timeout", "300ms"}})
	assert.Equal(t, 0, s.exit(15*time.Second))
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	require.GreaterOrEqual(t, len(lines), 3)
	for _, l := range lines {
		validLine(t, []byte(l))
	}
	assert.Contains(t, lines[len(lines)-1], `"state":"stopped"`)
	assert.Contains(t, lines[len(lines)-1], `run time limit of 300ms reached`)
	assert.Empty(t, s.all, "nothing on stdout")
}

func TestCheckReportsBwrapAvailable(t *testing.T) {
	needBwrap(t)
	out, err := exec.Command(bins.shim, "check").CombinedOutput()
	require.NoError(t, err, string(out))
	assert.Contains(t, string(out), "bwrap: available")
}

func readCmdline(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return string(b)
}
