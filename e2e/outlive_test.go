//go:build linux

package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
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
	"github.com/oac/sandbox-agent/internal/crashpoint"
)

// outliveParent is the parent of an outliving shim: a shell that holds the
// shim's stdin (a fifo it keeps open) and is the only reader of its
// stdout (another fifo), which it copies to its own stdout. Killing it is
// a parent dying: the shim's stdin ends and its stdout has no reader.
const outliveParent = `exec 4<>"$D/in"
"$@" <"$D/in" >"$D/out" 2>"$D/shim.err" 4>&- &
echo "shim $!"
while IFS= read -r l; do printf '%s\n' "$l"; done <"$D/out"`

// lineSeq is the seq of an event line (0 for a line without one).
func lineSeq(t *testing.T, line string) api.Event {
	t.Helper()
	validLine(t, []byte(line))
	var e api.Event
	require.NoError(t, json.Unmarshal([]byte(line), &e), "%s", line)
	return e
}

// A sandbox started with --outlive-parent keeps running when its parent is
// SIGKILLed (its stdin ended, its stdout without a reader); oac-shim attach
// replays its events from a seq, byte for byte what the parent saw, then
// follows them, carries commands from its stdin to the shim's control
// socket and their answers back; a stop sent through it stops the sandbox,
// attach exits 0 after the stopped state, and nothing is left: no
// process, registry entry, journal or state directory.
func TestAnOutlivingSandboxSurvivesItsParentAndAttachTakesItUpAndStopsIt(t *testing.T) {
	needBwrap(t)
	keep := privateKeepRoot(t)
	dir := t.TempDir()
	for _, f := range []string{"in", "out"} {
		require.NoError(t, syscall.Mkfifo(filepath.Join(dir, f), 0o600))
	}
	name := uniqueName("outlive")
	marker := sleepMarker()
	boot := filepath.Join(dir, "bootstrap.json")
	require.NoError(t, os.WriteFile(boot, []byte(daemon(`echo outlive-hello; exec `+marker, `"stop_grace":"2s"`)), 0o600))

	parent := exec.Command("/bin/sh", "-c", outliveParent, "sh", bins.shim, "run", "--provider", "bwrap", "--name", name,
		"--agent", bins.guest, "--bootstrap", boot, "--keep-root", keep, "--outlive-parent", "--control", "stdin")
	parent.Env = append(os.Environ(), "D="+dir)
	out, err := parent.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, parent.Start())
	t.Cleanup(func() {
		_ = parent.Process.Kill()
		_ = parent.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "shim.err"))
			t.Logf("oac-shim stderr:\n%s", b)
		}
	})
	br := bufio.NewReader(out)
	first, err := br.ReadString('\n')
	require.NoError(t, err)
	shimPID, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(first, "shim ")))
	require.NoError(t, err, "%q", first)
	t.Cleanup(func() { _ = syscall.Kill(shimPID, syscall.SIGKILL) })

	// What the parent saw, up to ready and the daemon's line.
	var seen []string
	var ready, hello bool
	deadline := time.AfterFunc(bootTimeout, func() { _ = parent.Process.Kill() })
	for !ready || !hello {
		l, err := br.ReadString('\n')
		require.NoError(t, err, "the parent's copy of the events ended before ready and the daemon's line")
		l = strings.TrimSuffix(l, "\n")
		e := lineSeq(t, l)
		require.Equal(t, uint64(len(seen)+1), e.Seq, "seq counts the lines from 1: %s", l)
		seen = append(seen, l)
		ready = ready || (e.Event == api.KindState && e.State == api.StateReady)
		hello = hello || (e.Event == api.KindLog && e.Line == "outlive-hello")
	}
	deadline.Stop()
	t.Logf("the parent saw %d events, the last: %s", len(seen), seen[len(seen)-1])
	procs := append(descendants(shimPID), shimPID)

	// The parent dies.
	require.NoError(t, parent.Process.Signal(syscall.SIGKILL))
	_ = parent.Wait()
	// The shim lives on and is listed; its sandbox's daemon too.
	raw, err := exec.Command(bins.shim, "list", "--running", "--json", "--keep-root", keep).Output()
	require.NoError(t, err)
	var listed api.RunningReport
	require.NoError(t, json.Unmarshal(raw, &listed))
	require.Len(t, listed.Sandboxes, 1, "%s", raw)
	assert.Equal(t, name, listed.Sandboxes[0].Name)
	assert.Equal(t, shimPID, listed.Sandboxes[0].PID)
	assert.True(t, listed.Sandboxes[0].OutliveParent, "listed as one attach takes up")
	assert.Equal(t, filepath.Join(keep, "running", "sandboxes", name, "control.sock"), listed.Sandboxes[0].ControlSocket,
		"a control socket in its registry entry, the caller having named none")
	assert.Len(t, hostProcs(marker), 1, "the daemon runs on")

	// Another parent attaches from the second event.
	const from = 2
	attach := exec.Command(bins.shim, "attach", name, "--from", strconv.Itoa(from), "--keep-root", keep)
	stdin, err := attach.StdinPipe()
	require.NoError(t, err)
	aout, err := attach.StdoutPipe()
	require.NoError(t, err)
	var aerr lockedBuffer
	attach.Stderr = &aerr
	require.NoError(t, attach.Start())
	t.Cleanup(func() {
		_ = attach.Process.Kill()
		if t.Failed() {
			t.Logf("oac-shim attach stderr:\n%s", aerr.String())
		}
	})
	// A second caller (a tool watching the same sandbox) attaches at the
	// same time, from the oldest event, and only reads.
	watch := exec.Command(bins.shim, "attach", name, "--keep-root", keep)
	watchIn, err := watch.StdinPipe()
	require.NoError(t, err)
	var wout, werr lockedBuffer
	watch.Stdout, watch.Stderr = &wout, &werr
	require.NoError(t, watch.Start())
	t.Cleanup(func() { _ = watch.Process.Kill(); watchIn.Close() })

	ar := bufio.NewReader(aout)
	var events []string // the event lines attach gave (not the answers)
	next := func(what string) (string, api.Event) {
		t.Helper()
		l, err := ar.ReadString('\n')
		require.NoError(t, err, "attach's output ended before %s (stderr: %s)", what, aerr.String())
		l = strings.TrimSuffix(l, "\n")
		e := lineSeq(t, l)
		if e.Event != api.KindAnswer {
			events = append(events, l)
		}
		return l, e
	}
	for i := from; i <= len(seen); i++ {
		l, _ := next(fmt.Sprintf("event %d", i))
		assert.Equal(t, seen[i-1], l, "the replay is what the parent saw, byte for byte")
	}

	// A command through attach: a forward added, an event written after
	// the parent died (its stdout has no reader: the shim must not die of
	// it), and its answer.
	_, err = io.WriteString(stdin, `{"id":"f1","cmd":"add_forward","listen":"127.0.0.1:0","guest_port":4096}`+"\n")
	require.NoError(t, err)
	var answered, forwarded bool
	last := uint64(len(seen))
	for !answered || !forwarded {
		l, e := next("the add_forward answer and forward event")
		if e.Event == api.KindAnswer {
			var a api.Answer
			require.NoError(t, json.Unmarshal([]byte(l), &a))
			assert.Equal(t, "f1", a.ID)
			assert.True(t, a.OK, "%s", l)
			assert.Zero(t, a.Seq, "an answer on the control socket is not a line of the events")
			answered = true
			continue
		}
		assert.Equal(t, last+1, e.Seq, "the live events follow the replay without a gap: %s", l)
		last = e.Seq
		forwarded = forwarded || (e.Event == api.KindForward && e.Message == "listening")
	}

	// The stop, through attach.
	_, err = io.WriteString(stdin, `{"id":"s1","cmd":"stop"}`+"\n")
	require.NoError(t, err)
	var stopped bool
	for !stopped {
		l, e := next("the stopped state")
		if e.Event == api.KindAnswer {
			assert.Contains(t, l, `"id":"s1"`)
			continue
		}
		assert.Equal(t, last+1, e.Seq, "%s", l)
		last = e.Seq
		stopped = e.Event == api.KindState && e.State == api.StateStopped
	}
	t.Logf("attach gave events %d to %d", from, last)
	rest, _ := io.ReadAll(ar)
	assert.Empty(t, string(rest), "nothing after the stopped state")
	require.NoError(t, attach.Wait(), "attach exits 0 after stopped: %s", aerr.String())
	require.NoError(t, watch.Wait(), "the watching attach exits 0 after stopped too: %s", werr.String())
	assert.Equal(t, append(seen[:from-1:from-1], events...), strings.Split(strings.TrimSuffix(wout.String(), "\n"), "\n"),
		"the watching attach gave every event, the same lines, whichever of the two ended first")

	// Nothing left.
	assert.Eventually(t, func() bool {
		for _, p := range procs {
			if syscall.Kill(p, 0) == nil {
				if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p)); err == nil && !strings.Contains(string(st), ") Z ") {
					return false
				}
			}
		}
		return len(hostProcs(marker)) == 0
	}, 30*time.Second, 50*time.Millisecond, "the shim and every process of its sandbox ended")
	assert.NoDirExists(t, filepath.Join(keep, "running", "sandboxes", name), "no registry entry, journal or socket: attach read the journal to its end and removed it")
	assert.NoDirExists(t, runDir(name), "no state directory")
	raw, err = exec.Command(bins.shim, "list", "--running", "--json", "--keep-root", keep).Output()
	require.NoError(t, err)
	assert.JSONEq(t, fmt.Sprintf(`{"schema_version":%d,"sandboxes":[],"cleaned":[]}`, api.SchemaVersion), string(raw))
}

// An outliving shim killed at crash point outlive/torn-line (the guest
// ready, the journal holding half of the ready event's line): attach gives
// every whole line up to the kill, says the last one is torn and that the
// shim died, and exits api.ExitShimDied; list --running then removes and
// reports what the shim left.
func TestAttachReadsAKilledOutlivingShimToTheKillAndSaysItDied(t *testing.T) {
	needBwrap(t)
	keep := privateKeepRoot(t)
	name := uniqueName("outlive-k")
	s := startShim(t, sandboxSpec{name: name, shim: bins.crashShim, bootstrap: daemon("exec sleep 1000"),
		args: []string{"--keep-root", keep, "--outlive-parent"}, env: []string{crashpoint.EnvVar + "=" + crashpoint.OutliveTornLine.Name()}})
	select {
	case <-s.done:
	case <-time.After(3 * bootTimeout):
		t.Fatalf("oac-shim did not reach crash point %s", crashpoint.OutliveTornLine.Name())
	}
	ws, ok := s.cmd.ProcessState.Sys().(syscall.WaitStatus)
	require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, "killed at the point: %s", s.cmd.ProcessState)
	require.Contains(t, s.stderr.String(), "crash point "+crashpoint.OutliveTornLine.Name())
	_, printed := s.allEvents()
	require.NotEmpty(t, printed)
	assert.Empty(t, s.find(func(e api.Event) bool { return e.State == api.StateReady }), "the ready event was torn before stdout got it")

	attach := exec.Command(bins.shim, "attach", name, "--keep-root", keep)
	var aerr strings.Builder
	attach.Stderr = &aerr
	raw, err := attach.Output()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "attach fails: %s", aerr.String())
	assert.Equal(t, api.ExitShimDied, ee.ExitCode())
	got := strings.Split(strings.TrimSuffix(string(raw), "\n"), "\n")
	// The journal has every line stdout got (it is written first), and
	// may have a few the killed shim had not yet handed its parent.
	require.GreaterOrEqual(t, len(got), len(printed))
	t.Logf("stdout got %d lines, attach %d; attach's stderr: %s", len(printed), len(got), aerr.String())
	assert.Equal(t, printed, got[:len(printed)], "attach gives the lines the shim printed, as it printed them")
	for i, l := range got {
		e := lineSeq(t, l)
		assert.Equal(t, uint64(i+1), e.Seq, "every whole line, in order: %s", l)
		assert.NotEqual(t, api.StateReady, e.State, "the torn ready line is not given")
	}
	assert.Contains(t, aerr.String(), "the journal's last line is torn")
	assert.Contains(t, aerr.String(), fmt.Sprintf("its shim (pid %d", s.cmd.Process.Pid))
	assert.Contains(t, aerr.String(), "died without a final state")

	raw, err = exec.Command(bins.shim, "list", "--running", "--json", "--keep-root", keep).Output()
	require.NoError(t, err)
	var rep api.RunningReport
	require.NoError(t, json.Unmarshal(raw, &rep))
	assert.Empty(t, rep.Sandboxes)
	require.Len(t, rep.Cleaned, 1, "%s", raw)
	assert.Contains(t, rep.Cleaned[0].Message, "died without removing its record")
	assert.NoDirExists(t, filepath.Join(keep, "running", "sandboxes", name))
}
