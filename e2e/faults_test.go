//go:build linux

package e2e

// The fault matrix on real bwrap guests: kill -9, in turn, the daemon,
// oac-sandbox-io, oac-guest, the sandbox runtime (bwrap) and the shim. Each
// time the right state and reason (or a restart, where the contract says
// so), and afterwards nothing left on the host: no process of the sandbox,
// no /run/oac/sandboxes/NAME, no mount naming it.

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/internal/proctree"
	"github.com/oac/sandbox-agent/protocol"
	"github.com/oac/sandbox-agent/protocol/transport"
)

// descendants returns the pids below pid (children first, then theirs).
func descendants(pid int) []int {
	var out []int
	for _, p := range proctree.Descendants(proctree.All(), pid) {
		out = append(out, p.PID)
	}
	return out
}

func comm(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return strings.TrimSpace(string(b))
}

// findBelow returns the first process below pid whose comm is name.
func findBelow(t *testing.T, pid int, name string) int {
	t.Helper()
	var found int
	require.Eventually(t, func() bool {
		for _, p := range descendants(pid) {
			if comm(p) == name {
				found = p
				return true
			}
		}
		return false
	}, 10*time.Second, 20*time.Millisecond, "no %s below pid %d", name, pid)
	return found
}

// assertNothingLeft checks the host after a sandbox ended: none of the
// processes that ran it, no state directory, no mount naming it.
func assertNothingLeft(t *testing.T, name string, pids []int) {
	t.Helper()
	assert.Eventually(t, func() bool {
		for _, p := range pids {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", p)); err == nil {
				if st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p)); !bytes.Contains(st, []byte(") Z ")) {
					return false
				}
			}
		}
		return len(hostProcs(name)) == 0
	}, 10*time.Second, 20*time.Millisecond, "a process of sandbox %s is left: %v %v", name, pids, hostProcs(name))
	_, err := os.Stat(filepath.Join("/run/oac/sandboxes", name))
	assert.True(t, os.IsNotExist(err), "/run/oac/sandboxes/%s is removed", name)
	mi, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	assert.NotContains(t, string(mi), name, "no mount names the sandbox")
}

func TestFaultMatrixKill9(t *testing.T) {
	needBwrap(t)
	cases := []struct {
		victim string // comm of the process killed, or "shim"
		check  func(t *testing.T, s *shim)
	}{
		{"oac-daemon-stan", func(t *testing.T, s *shim) { // comm is cut at 15 bytes
			failed := s.waitState(api.StateFailed, 10*time.Second)
			assert.Equal(t, "guest: daemon exited: killed by signal killed", failed.Message)
			s.exitFailed(api.CodeDaemonFailed, 15*time.Second)
		}},
		{"oac-sandbox-io", func(t *testing.T, s *shim) {
			// The contract: restarted with backoff, the sandbox stays ready.
			r := s.waitFor(func(e api.Event) bool {
				return e.Event == api.KindProcess && e.Process == "oac-sandbox-io" && e.Restarts == 1 && e.RestartInMS > 0
			}, 10*time.Second, "restart of oac-sandbox-io")
			assert.GreaterOrEqual(t, r.RestartInMS, int64(100))
			s.waitFor(func(e api.Event) bool {
				return e.Event == api.KindProcess && e.Process == "oac-sandbox-io" && e.Running != nil && *e.Running && e.Restarts == 1
			}, 10*time.Second, "oac-sandbox-io started again")
			assert.Empty(t, s.find(func(e api.Event) bool { return e.Event == api.KindState && e.State == api.StateFailed }))
			s.signal(syscall.SIGTERM)
			s.waitState(api.StateStopped, 15*time.Second)
			assert.Equal(t, 0, s.exit(15*time.Second))
		}},
		{"oac-guest", func(t *testing.T, s *shim) {
			failed := s.waitState(api.StateFailed, 10*time.Second)
			assert.Regexp(t, `guest connection lost|sandbox runtime exited`, failed.Message)
			s.exitFailed(api.CodeRuntimeFailed, 15*time.Second)
		}},
		{"bwrap", func(t *testing.T, s *shim) {
			failed := s.waitState(api.StateFailed, 10*time.Second)
			assert.Regexp(t, `guest connection lost|sandbox runtime exited|killed`, failed.Message)
			s.exitFailed(api.CodeRuntimeFailed, 15*time.Second)
		}},
		{"shim", func(t *testing.T, s *shim) {
			s.exit(10 * time.Second)
		}},
	}
	for _, c := range cases {
		t.Run(c.victim, func(t *testing.T) {
			s := startShim(t, sandboxSpec{bootstrap: encode(t, contract("link.example.com")), args: identityArgs()})
			s.waitState(api.StateReady, bootTimeout)
			shimPID := s.cmd.Process.Pid
			findBelow(t, shimPID, "oac-daemon-stan")
			findBelow(t, shimPID, "oac-sandbox-io")
			pids := append([]int{shimPID}, descendants(shimPID)...)
			victim := shimPID
			if c.victim != "shim" {
				victim = findBelow(t, shimPID, c.victim)
			}
			t.Logf("kill -9 %s (pid %d); sandbox processes %v", c.victim, victim, pids)
			require.NoError(t, syscall.Kill(victim, syscall.SIGKILL))
			c.check(t, s)
			if c.victim == "shim" {
				// Nothing runs any more, but a SIGKILLed shim cannot
				// remove its state directory (socket, lock): the next
				// sandbox started on the host sweeps it.
				assert.Eventually(t, func() bool {
					for _, p := range pids {
						if _, err := os.Stat(fmt.Sprintf("/proc/%d", p)); err == nil {
							return false
						}
					}
					return true
				}, 10*time.Second, 20*time.Millisecond, "bwrap and the guest die with the shim")
				next := startShim(t, sandboxSpec{bootstrap: daemon("exec sleep 1000")})
				next.waitState(api.StateReady, bootTimeout)
				next.signal(syscall.SIGTERM)
				assert.Equal(t, 0, next.exit(15*time.Second))
				assertNothingLeft(t, next.name, []int{next.cmd.Process.Pid})
			}
			assertNothingLeft(t, s.name, pids)
		})
	}
}

// Transport cut: the host side of a real oac-guest's transport goes away
// (stdio, the test plays the host). The guest stops its children (TERM, then
// KILL after the grace) and exits.
func TestTransportCutStopsTheGuestsChildrenAndTheGuestExits(t *testing.T) {
	cmd, sess, stderr := guestOverStdio(t)
	ctl, _, _, err := protocol.HostHandshake(sess, protocol.MinVersion, protocol.MaxVersion, protocol.Welcome{HostVersion: "e2e"}, 10*time.Second)
	require.NoError(t, err)
	marker := sleepMarker()
	// The daemon ignores TERM: only the KILL after the 1s grace stops it.
	require.NoError(t, ctl.Send(protocol.TypeBootstrap, map[string]any{"version": 1, "stop_grace": "1s",
		"daemon": map[string]any{"argv": []string{"/bin/sh", "-c", `trap "" TERM; exec ` + marker}}}))
	var st protocol.State
	for st.State != protocol.StateReady {
		require.NoError(t, ctl.RecvMessage(protocol.TypeState, &st), stderr.String())
	}
	require.Eventually(t, func() bool { return len(hostProcs(marker)) == 1 }, 5*time.Second, 20*time.Millisecond)
	sess.Close() // the transport is cut
	assert.NotEqual(t, 0, exitCode(t, cmd, 15*time.Second), "the guest exits and says it failed")
	assert.Empty(t, hostProcs(marker), "its children are gone")
	// Which the guest notices first, the closed control stream or a failed
	// State write, depends on timing; both end it the same way.
	assert.Regexp(t, `host connection lost: stopped all processes|report state: session shutdown`, stderr.String())
	_ = transport.StreamConn // the stdio transport is what the WSL provider uses
}
