//go:build linux

package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
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

// qmpQemu puts a qemu-system-x86_64 first in PATH that runs the real one
// with a QMP socket, and returns the PATH entry and the socket: the
// test's way to stop a VM's clock as a host's sleep does (qemu's stop
// freezes the guest's clock; SIGSTOP does not: the guest's clock reads
// the host's and runs on).
func qmpQemu(t *testing.T) (pathEnv, socket string) {
	t.Helper()
	real, err := exec.LookPath("qemu-system-x86_64")
	require.NoError(t, err)
	dir, err := os.MkdirTemp("", "oacqmp") // short: unix socket paths are limited
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	socket = filepath.Join(dir, "qmp.sock")
	script := fmt.Sprintf("#!/bin/sh\nexec %q \"$@\" -qmp unix:%s,server=on,wait=off\n", real, socket)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "qemu-system-x86_64"), []byte(script), 0o755))
	return "PATH=" + dir + ":" + os.Getenv("PATH"), socket
}

// qmp is a QMP client: one command at a time, answers read in order
// (events in between skipped).
type qmp struct {
	c net.Conn
	r *bufio.Reader
}

func dialQMP(t *testing.T, socket string) *qmp {
	t.Helper()
	c, err := net.DialTimeout("unix", socket, 5*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	q := &qmp{c: c, r: bufio.NewReader(c)}
	require.NoError(t, c.SetDeadline(time.Now().Add(30*time.Second)))
	greeting, err := q.r.ReadString('\n')
	require.NoError(t, err)
	require.Contains(t, greeting, "QMP")
	q.do(t, "qmp_capabilities")
	return q
}

func (q *qmp) do(t *testing.T, cmd string) {
	t.Helper()
	_, err := fmt.Fprintf(q.c, "{\"execute\":%q}\n", cmd)
	require.NoError(t, err)
	for {
		line, err := q.r.ReadString('\n')
		require.NoError(t, err)
		var m map[string]json.RawMessage
		require.NoError(t, json.Unmarshal([]byte(line), &m), line)
		if _, ok := m["return"]; ok {
			return
		}
		require.NotContains(t, m, "error", "qmp %s: %s", cmd, line)
	}
}

// guestClockAfter returns the first clock_ms report the host received
// after at, and the host's receipt time.
func guestClockAfter(t *testing.T, s *shim, at time.Time) (guest, received time.Time) {
	t.Helper()
	e := s.waitFor(func(e api.Event) bool {
		return e.Event == api.KindLog && strings.HasPrefix(e.Line, "clock_ms=") && e.Time.After(at)
	}, 30*time.Second, "a clock report after "+at.Format(time.RFC3339Nano))
	ms, err := strconv.ParseInt(strings.TrimPrefix(e.Line, "clock_ms="), 10, 64)
	require.NoError(t, err)
	return time.UnixMilli(ms), e.Time
}

// A host's sleep stops a VM's clock: here qemu's stop freezes the
// guest's for a chosen span, as a suspended host would. The shim's check
// (every 200ms here) finds the guest behind by that span, steps its
// clock and says so in a clock event; the guest's own clock, read in
// the guest after the event, is the host's again. Then qemu is stopped
// with SIGSTOP, which the guest reports as a jump it saw.
func TestVMClockStoppedLikeASleepingHostIsSteppedBackIntoStep(t *testing.T) {
	t.Parallel()
	kernel, initramfs := needVM(t)
	pathEnv, socket := qmpQemu(t)
	env, _ := json.Marshal([]string{"VMDAEMON_CLOCK_EVERY=200ms"})
	name := uniqueName("vmclock")
	s := startShim(t, sandboxSpec{
		provider: "qemu", name: name, env: []string{pathEnv},
		bootstrap: `{"version":1,"stop_grace":"3s","daemon":{"argv":["` + vmDaemon + `"],"env":` + string(env) + `}}`,
		args: []string{"--kernel", kernel, "--initramfs", initramfs, "--boot-timeout", vmBootTimeout.String(),
			"--host-grace", vmHostGrace.String(), "--clock-interval", "200ms", "--debug"},
	})
	s.waitState(api.StateReady, vmBootTimeout)
	guest, received := guestClockAfter(t, s, time.Now())
	assert.InDelta(t, received.UnixMilli(), guest.UnixMilli(), 1000, "the guest's clock starts in step")

	const span = 3 * time.Second
	q := dialQMP(t, socket)
	begin := time.Now()
	q.do(t, "stop") // the VM and its clock stop here
	stopped := time.Now()
	time.Sleep(span) // the chosen span of the "sleep"
	q.do(t, "cont")
	window := time.Since(begin)
	t.Logf("VM stopped for %s (stop to cont answered: %s)", span, window)

	e := s.waitFor(func(e api.Event) bool { return e.Event == api.KindClock && e.Time.After(stopped) }, 60*time.Second, "clock event")
	t.Logf("clock event: %s", e.Message)
	assert.Equal(t, api.ClockTriggerInterval, e.Trigger, "found by the periodic check")
	assert.GreaterOrEqual(t, e.CorrectionMS, (span - 200*time.Millisecond).Milliseconds(), "the guest was behind by the span it was stopped")
	assert.LessOrEqual(t, e.CorrectionMS, (window + 500*time.Millisecond).Milliseconds(), "and by no more than the stop lasted")
	assert.Contains(t, e.Message, "behind the host's")

	guest, received = guestClockAfter(t, s, e.Time)
	assert.InDelta(t, received.UnixMilli(), guest.UnixMilli(), 1000, "the guest's clock, read in the guest, is the host's again")
	assert.Len(t, s.find(func(e api.Event) bool { return e.Event == api.KindClock }), 1, "one step, one event")

	// SIGSTOP to qemu is not a sleep: the guest's clock reads the host's
	// and runs on. The guest sees its clock watch wake late and reports
	// it; the host checks at once and finds the clock in step.
	pids := hostProcs("oac-" + name)
	require.Len(t, pids, 1)
	require.NoError(t, syscall.Kill(pids[0], syscall.SIGSTOP))
	time.Sleep(4 * time.Second) // the chosen span
	require.NoError(t, syscall.Kill(pids[0], syscall.SIGCONT))
	require.Eventually(t, func() bool { return strings.Contains(s.stderr.String(), "trigger=guest_jump") }, 30*time.Second, 20*time.Millisecond,
		"the guest's report of its late watch made the host check")
	guest, received = guestClockAfter(t, s, time.Now())
	assert.InDelta(t, received.UnixMilli(), guest.UnixMilli(), 1000, "the guest's clock ran on while qemu was stopped")
	assert.Len(t, s.find(func(e api.Event) bool { return e.Event == api.KindClock }), 1, "no step was needed")

	s.signal(syscall.SIGTERM)
	s.waitState(api.StateStopped, 20*time.Second)
	assert.Equal(t, 0, s.exit(15*time.Second))
}
