//go:build linux

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/client"
	"github.com/oac/sandbox-agent/host/persist"
	"github.com/oac/sandbox-agent/schema"
)

// privateKeepRoot is a keep root of the test's own (0711, as a kept
// sandbox's guest root must reach its state there): the running
// sandboxes listed and stopped are this test's only.
func privateKeepRoot(t *testing.T) string {
	t.Helper()
	root, err := os.MkdirTemp("", "oac-e2e-many-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(root) })
	require.NoError(t, os.Chmod(root, 0o711))
	return root
}

// Many sandboxes from one parent: two throwaway runs (one serving a
// control socket, one none) and a started kept sandbox are listed with
// their control endpoints, and one oac-shim stop --all stops every one
// in order (the control socket's stop, SIGTERM to the shim without one),
// each within the grace, leaving no process, state directory, mount or
// held lock.
func TestStopAllStopsEverySandboxOfOneParentInOrderLeavingNothing(t *testing.T) {
	needBwrap(t)
	keep := privateKeepRoot(t)
	ctlDir, err := os.MkdirTemp("", "oac-e2e-ctl-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(ctlDir) })

	keptName := uniqueName("many-kept")
	out, err := exec.Command(bins.shim, "create", "--provider", "bwrap", "--name", keptName, "--agent", bins.guest,
		"--keep-root", keep).CombinedOutput()
	require.NoError(t, err, "%s", out)

	type sandbox struct {
		s      *shim
		marker string
		ctl    string
		kind   string
	}
	var all []sandbox
	for i, kind := range []string{api.RunThrowaway, api.RunThrowaway, api.RunKept} {
		sb := sandbox{marker: sleepMarker(), kind: kind}
		spec := sandboxSpec{name: uniqueName(fmt.Sprintf("many-%d", i)), bootstrap: daemon("exec "+sb.marker, `"stop_grace":"2s"`),
			args: []string{"--keep-root", keep}}
		if kind == api.RunKept {
			spec.name, spec.command = keptName, "start"
		}
		if i != 1 {
			sb.ctl = filepath.Join(ctlDir, fmt.Sprintf("%d.ctl", i))
			spec.args = append(spec.args, "--control-socket", sb.ctl)
		}
		sb.s = startShim(t, spec)
		all = append(all, sb)
	}
	for _, sb := range all {
		sb.s.waitState(api.StateReady, bootTimeout)
		require.Eventually(t, func() bool { return len(hostProcs(sb.marker)) == 1 }, 10*time.Second, 20*time.Millisecond)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	listed, err := client.List(ctx, client.Sandboxes{Shim: bins.shim, KeepRoot: keep})
	require.NoError(t, err)
	require.Len(t, listed.Sandboxes, len(all), "%+v", listed)
	assert.Empty(t, listed.Cleaned)
	byName := map[string]api.RunningEntry{}
	for _, e := range listed.Sandboxes {
		byName[e.Name] = e
	}
	for _, sb := range all {
		e, ok := byName[sb.s.name]
		require.True(t, ok, "%s is listed", sb.s.name)
		assert.Equal(t, sb.kind, e.Kind, sb.s.name)
		assert.Equal(t, "bwrap", e.Provider)
		assert.Equal(t, sb.s.cmd.Process.Pid, e.PID, "its shim's pid")
		assert.Equal(t, sb.ctl, e.ControlSocket, "its control socket, or none")
		assert.Empty(t, e.Message)
	}
	raw, err := exec.Command(bins.shim, "list", "--running", "--json", "--keep-root", keep).Output()
	require.NoError(t, err)
	assert.NoError(t, schema.Validate(schema.Running, raw), "%s", raw)

	const grace = 30 * time.Second
	var shimPIDs []int
	for _, sb := range all {
		shimPIDs = append(shimPIDs, append([]int{sb.s.cmd.Process.Pid}, descendants(sb.s.cmd.Process.Pid)...)...)
	}
	begin := time.Now()
	cmd := exec.CommandContext(ctx, bins.shim, "stop", "--all", "--json", "--grace", grace.String(), "--keep-root", keep)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	raw, err = cmd.Output()
	took := time.Since(begin)
	require.NoError(t, err, "oac-shim stop --all exits 0 when every sandbox stopped: %s %s", raw, stderr.String())
	assert.NoError(t, schema.Validate(schema.Stop, raw), "%s", raw)
	var rep api.StopReport
	require.NoError(t, json.Unmarshal(raw, &rep))
	t.Logf("oac-shim stop --all: %d sandboxes in %s: %s", len(rep.Sandboxes), took, raw)
	assert.True(t, rep.AllStopped)
	require.Len(t, rep.Sandboxes, len(all))
	for _, sb := range all {
		var e api.StopEntry
		for _, x := range rep.Sandboxes {
			if x.Name == sb.s.name {
				e = x
			}
		}
		assert.Equal(t, api.StopStopped, e.Outcome, "%s: %s", sb.s.name, e.Message)
		want := api.StopViaControl
		if sb.ctl == "" {
			want = api.StopViaSignal
		}
		assert.Equal(t, want, e.Via, sb.s.name)
		assert.LessOrEqual(t, e.ElapsedMS, grace.Milliseconds(), "within the grace")
		// Every shim had ended when stop returned (a zombie until this
		// test, its parent, reaps it), after its stopped event.
		if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", sb.s.cmd.Process.Pid)); err == nil {
			assert.Contains(t, string(st), ") Z ", "%s's shim had ended when stop returned", sb.s.name)
		}
		assert.Equal(t, 0, sb.s.exit(10*time.Second), sb.s.name)
		assert.Equal(t, api.StateStopped, sb.s.lastEvent().State, sb.s.name)
		assert.Empty(t, hostProcs(sb.marker), "%s's daemon is gone", sb.s.name)
		_, err := os.Stat(sb.ctl)
		assert.True(t, sb.ctl == "" || os.IsNotExist(err), "%s's control socket is removed", sb.s.name)
	}
	for _, p := range shimPIDs {
		if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p)); err == nil {
			assert.Contains(t, string(st), ") Z ", "process %d of a stopped sandbox is left", p)
		}
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	for _, sb := range all {
		_, err := os.Stat(filepath.Join("/run/oac/sandboxes", sb.s.name))
		assert.True(t, os.IsNotExist(err), "/run/oac/sandboxes/%s is removed", sb.s.name)
		assert.NotContains(t, string(mi), sb.s.name, "no mount names %s", sb.s.name)
	}
	running, err := os.ReadDir(filepath.Join(keep, "running", "sandboxes"))
	require.NoError(t, err)
	assert.Empty(t, running, "no running sandbox's record is left")
	kept, err := os.ReadDir(filepath.Join(keep, "sandboxes"))
	require.NoError(t, err)
	require.Len(t, kept, 1, "only the kept sandbox stays in the keep root")
	assert.Equal(t, keptName, kept[0].Name())
	assert.False(t, persist.NewFileStore(keep).Held(keptName), "no shim holds the kept sandbox")
	rec, err := persist.NewFileStore(keep).Load(keptName)
	require.NoError(t, err)
	assert.Equal(t, persist.StateStopped, rec.State, "the kept sandbox's record says stopped")

	again, err := client.List(ctx, client.Sandboxes{Shim: bins.shim, KeepRoot: keep})
	require.NoError(t, err)
	assert.Empty(t, again.Sandboxes)
	rep2, err := client.StopAll(ctx, client.Sandboxes{Shim: bins.shim, KeepRoot: keep}, grace)
	require.NoError(t, err, "nothing left to stop is no error")
	assert.Empty(t, rep2.Sandboxes)
}

// A shim killed with SIGKILL leaves its record in the keep root's running
// sandboxes: the next listing says so and removes it, never listing it as
// running, and stop of its name finds nothing to stop.
func TestTheRecordOfAKilledShimIsReportedAndCleanedNeverListedAsRunning(t *testing.T) {
	needBwrap(t)
	keep := privateKeepRoot(t)
	s := startShim(t, sandboxSpec{bootstrap: daemon("exec sleep 1000"), args: []string{"--keep-root", keep}})
	s.waitState(api.StateReady, bootTimeout)
	o := client.Sandboxes{Shim: bins.shim, KeepRoot: keep}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	listed, err := client.List(ctx, o)
	require.NoError(t, err)
	require.Len(t, listed.Sandboxes, 1)
	pid := s.cmd.Process.Pid
	assert.Equal(t, pid, listed.Sandboxes[0].PID)

	s.signal(syscall.SIGKILL)
	s.exit(10 * time.Second)
	require.FileExists(t, filepath.Join(keep, "running", "sandboxes", s.name, "shim.json"), "a killed shim cannot remove its record")

	listed, err = client.List(ctx, o)
	require.NoError(t, err)
	assert.Empty(t, listed.Sandboxes, "a dead shim is never listed as running")
	require.Len(t, listed.Cleaned, 1)
	assert.Equal(t, s.name, listed.Cleaned[0].Name)
	assert.Contains(t, listed.Cleaned[0].Message, fmt.Sprintf("its shim (pid %d, started ", pid))
	assert.NoDirExists(t, filepath.Join(keep, "running", "sandboxes", s.name))

	rep, err := client.StopNamed(ctx, o, 10*time.Second, s.name)
	require.NoError(t, err)
	require.Len(t, rep.Sandboxes, 1)
	assert.Equal(t, api.StopNotRunning, rep.Sandboxes[0].Outcome)
}

// A shim still inside its sandbox's own stop grace when stop's grace ends
// (its daemon ignores SIGTERM for 20 s) is killed and reported so: stop
// exits 1, the shim and its runtime are gone, and its record with them.
func TestStopKillsAShimThatOutlivesTheGraceAndSaysSo(t *testing.T) {
	needBwrap(t)
	keep := privateKeepRoot(t)
	marker := sleepMarker()
	s := startShim(t, sandboxSpec{bootstrap: daemon(`trap "" TERM; `+marker+` & echo started; wait`, `"stop_grace":"20s"`),
		args: []string{"--keep-root", keep}})
	s.waitState(api.StateReady, bootTimeout)
	s.waitLog("started", bootTimeout)
	pids := append([]int{s.cmd.Process.Pid}, descendants(s.cmd.Process.Pid)...)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rep, err := client.StopNamed(ctx, client.Sandboxes{Shim: bins.shim, KeepRoot: keep}, time.Second, s.name)
	require.ErrorIs(t, err, client.ErrNotAllStopped)
	require.Len(t, rep.Sandboxes, 1)
	e := rep.Sandboxes[0]
	assert.Equal(t, api.StopKilled, e.Outcome, e.Message)
	assert.Equal(t, api.StopViaSignal, e.Via, "no control socket: SIGTERM, then SIGKILL")
	assert.Contains(t, e.Message, "did not exit within the grace of 1s")
	assert.GreaterOrEqual(t, e.ElapsedMS, int64(1000))
	assert.False(t, rep.AllStopped)

	assert.Equal(t, -1, s.exit(10*time.Second), "killed by a signal")
	assert.Equal(t, syscall.SIGKILL, s.cmd.ProcessState.Sys().(syscall.WaitStatus).Signal())
	assert.Eventually(t, func() bool {
		for _, p := range pids {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", p)); err == nil {
				return false
			}
		}
		return len(hostProcs(marker)) == 0
	}, 10*time.Second, 20*time.Millisecond, "bwrap, the guest and the daemon die with the shim")
	running, err := os.ReadDir(filepath.Join(keep, "running", "sandboxes"))
	require.NoError(t, err)
	assert.Empty(t, running, "the killed shim's record is removed by the stop")
}
