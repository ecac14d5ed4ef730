package shimcli

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/host/apiserver"
	"github.com/oac/sandbox-agent/host/kept"
	"github.com/oac/sandbox-agent/internal/sockfile"
)

// standIn is a process announced as a running sandbox's shim: a real
// process (so a signal reaches it and its start time proves it) whose
// entry is released when it exits, as a shim's is; with a control
// socket, a stop command there ends it as a shim's stop would.
type standIn struct {
	cmd  *exec.Cmd
	rec  kept.ShimRecord
	done chan struct{}
	stop func()
}

// announceStandIn starts script under sh as the shim of name; control
// is "serve" (a control socket), "" (none) or a path recorded as its
// socket where nothing listens.
func announceStandIn(t *testing.T, g *kept.Registry, name, script, control string) *standIn {
	t.Helper()
	// It says "ready" once the script's traps are set: a signal sent
	// before would find the shell's defaults.
	cmd := exec.Command("/bin/sh", "-c", strings.Replace(script, "exec ", "echo ready; exec ", 1))
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "ready\n", line)
	start, err := procStart(cmd.Process.Pid)
	require.NoError(t, err)
	s := &standIn{cmd: cmd, done: make(chan struct{})}
	s.rec = kept.ShimRecord{Name: name, Kind: api.RunThrowaway, Provider: "bwrap", PID: cmd.Process.Pid, ProcStart: start,
		Started: time.Now().UTC(), Version: "test"}
	ctx, cancel := context.WithCancel(context.Background())
	var served sync.WaitGroup
	if control != "serve" {
		s.rec.ControlSocket = control
	} else {
		s.rec.ControlSocket = filepath.Join(t.TempDir(), name+".ctl")
		ln, err := sockfile.Listen(s.rec.ControlSocket)
		require.NoError(t, err)
		// Its orderly stop ends it once the stop command's connection has
		// ended, as a shim exits some time after it answered.
		var stopAsked atomic.Bool
		srv := &apiserver.Server{Sandbox: name, Handler: apiserver.HandlerFunc(func(_ context.Context, c api.Command) (any, error) {
			if c.Cmd == api.CmdStop {
				stopAsked.Store(true)
			}
			return api.StatusResult{Status: api.Status{ServerID: api.ServerID(name), State: api.StateReady}}, nil
		})}
		served.Add(1)
		go func() {
			defer served.Done()
			srv.ServeSocket(ctx, onClose{ln, func() {
				if stopAsked.Load() {
					_ = cmd.Process.Signal(syscall.SIGKILL)
				}
			}})
		}()
	}
	a, err := g.Announce(s.rec)
	require.NoError(t, err)
	go func() {
		_ = cmd.Wait()
		cancel()
		served.Wait()
		a.Close() // last, as runShim's
		close(s.done)
	}()
	s.stop = func() {
		_ = cmd.Process.Kill()
		<-s.done
	}
	t.Cleanup(s.stop)
	return s
}

// onClose calls after when a connection it accepted is closed.
type onClose struct {
	net.Listener
	after func()
}

func (l onClose) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &closeHook{c, l.after}, nil
}

type closeHook struct {
	net.Conn
	after func()
}

func (c *closeHook) Close() error {
	err := c.Conn.Close()
	c.after()
	return err
}

func TestStopAllAsksEachShimOnItsControlSocketOrBySignalAndWaitsForEach(t *testing.T) {
	keep := t.TempDir()
	g := kept.OpenRegistry(keep)
	a := announceStandIn(t, g, "a", "exec sleep 60", "serve")
	b := announceStandIn(t, g, "b", "exec sleep 60", "")
	// Its control socket does not answer: SIGTERM instead.
	c := announceStandIn(t, g, "c", "exec sleep 60", filepath.Join(t.TempDir(), "gone.ctl"))

	rep, err := Stop(context.Background(), g, StopOptions{All: true, Grace: 20 * time.Second})
	require.NoError(t, err)
	assert.True(t, rep.AllStopped)
	require.Len(t, rep.Sandboxes, 3)
	byName := map[string]api.StopEntry{}
	for _, e := range rep.Sandboxes {
		byName[e.Name] = e
		assert.Equal(t, api.StopStopped, e.Outcome, "%s: %s", e.Name, e.Message)
	}
	assert.Equal(t, []string{"a", "b", "c"}, []string{rep.Sandboxes[0].Name, rep.Sandboxes[1].Name, rep.Sandboxes[2].Name}, "by name")
	assert.Equal(t, api.StopViaControl, byName["a"].Via)
	assert.Equal(t, api.StopViaSignal, byName["b"].Via)
	assert.Equal(t, "it serves no control socket: stopped by SIGTERM", byName["b"].Message)
	assert.Equal(t, api.StopViaSignal, byName["c"].Via)
	assert.Regexp(t, `^its control socket did not take the stop command \(.*no such file or directory\): stopped by SIGTERM$`, byName["c"].Message)
	assert.Equal(t, a.rec.PID, byName["a"].PID)
	for _, s := range []*standIn{a, b, c} {
		select {
		case <-s.done:
		default:
			t.Errorf("%s reported stopped while its shim runs", s.rec.Name)
		}
	}
	assert.Equal(t, syscall.SIGTERM, b.cmd.ProcessState.Sys().(syscall.WaitStatus).Signal(), "b got SIGTERM")
	live, cleaned, err := g.List()
	require.NoError(t, err)
	assert.Empty(t, live)
	assert.Empty(t, cleaned)
}

func TestAShimThatOutlivesTheGraceIsKilledAndReportedSo(t *testing.T) {
	g := kept.OpenRegistry(t.TempDir())
	// SIGTERM stays ignored across the exec.
	s := announceStandIn(t, g, "stubborn", `trap "" TERM; exec sleep 60`, "")
	code, out, errOut := shimMainJSON(t, "stop", "--keep-root", filepath.Dir(g.Root), "--grace", "300ms", "--json", "stubborn")
	assert.Equal(t, 1, code, "not everything stopped in order: %s", errOut)
	var rep api.StopReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	require.Len(t, rep.Sandboxes, 1)
	e := rep.Sandboxes[0]
	assert.Equal(t, api.StopKilled, e.Outcome)
	assert.Equal(t, api.StopViaSignal, e.Via)
	assert.Contains(t, e.Message, "did not exit within the grace of 300ms")
	assert.GreaterOrEqual(t, e.ElapsedMS, int64(300), "asked, waited out the grace, killed")
	assert.False(t, rep.AllStopped)
	assert.Equal(t, int64(300), rep.GraceMS)
	<-s.done
	assert.Equal(t, syscall.SIGKILL, s.cmd.ProcessState.Sys().(syscall.WaitStatus).Signal())
}

func TestAProcessThatIsNotTheShimIsNeverSignalled(t *testing.T) {
	g := kept.OpenRegistry(t.TempDir())
	// The record names a live process whose start time is not the
	// shim's (a reused pid): it is left alone.
	other := exec.Command("sleep", "60")
	require.NoError(t, other.Start())
	t.Cleanup(func() { _ = other.Process.Kill(); _ = other.Wait() })
	start, err := procStart(other.Process.Pid)
	require.NoError(t, err)
	a, err := g.Announce(kept.ShimRecord{Name: "reused", Kind: api.RunThrowaway, Provider: "bwrap", PID: other.Process.Pid,
		ProcStart: start + 1, Started: time.Now().UTC(), Version: "test"})
	require.NoError(t, err)
	defer a.Close()

	rep, err := Stop(context.Background(), g, StopOptions{Names: []string{"reused"}, Grace: 200 * time.Millisecond})
	require.NoError(t, err)
	require.Len(t, rep.Sandboxes, 1)
	assert.Equal(t, api.StopFailed, rep.Sandboxes[0].Outcome)
	assert.Empty(t, rep.Sandboxes[0].Via, "nothing was signalled")
	assert.Contains(t, rep.Sandboxes[0].Message, "its shim had exited already")
	assert.Contains(t, rep.Sandboxes[0].Message, "its process is gone, yet its entry is still held")
	assert.False(t, rep.AllStopped)
	assert.NoError(t, other.Process.Signal(syscall.Signal(0)), "the other process still runs")
}

func TestStopOfANameNotRunningAndOfADeadShimsRecord(t *testing.T) {
	keep := t.TempDir()
	g := kept.OpenRegistry(keep)
	// A shim that died without removing its entry: its record, the lock
	// free.
	dir := filepath.Join(g.Root, "sandboxes", "crashed")
	require.NoError(t, os.MkdirAll(dir, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "lock"), nil, 0o600))
	data, err := json.Marshal(kept.ShimRecord{Schema: kept.ShimRecordSchema, Name: "crashed", Kind: api.RunThrowaway,
		Provider: "bwrap", PID: 1 << 22, ProcStart: 1, Started: time.Now().UTC(), Version: "test"})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "shim.json"), data, 0o600))

	code, out, errOut := shimMainJSON(t, "stop", "--keep-root", keep, "--json", "crashed", "never-ran")
	assert.Equal(t, 0, code, errOut)
	var rep api.StopReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	assert.True(t, rep.AllStopped)
	require.Len(t, rep.Cleaned, 1)
	assert.Equal(t, "crashed", rep.Cleaned[0].Name)
	assert.Contains(t, errOut, "crashed: its shim (pid ")
	require.Len(t, rep.Sandboxes, 2)
	for _, e := range rep.Sandboxes {
		assert.Equal(t, api.StopNotRunning, e.Outcome, e.Name)
	}

	code, out, _ = shimMainJSON(t, "list", "--running", "--keep-root", keep, "--json")
	assert.Equal(t, 0, code)
	var list api.RunningReport
	require.NoError(t, json.Unmarshal([]byte(out), &list))
	assert.Empty(t, list.Sandboxes)
	assert.Empty(t, list.Cleaned, "cleaned once")
}

func TestListRunningPrintsEachSandboxWithItsControlSocket(t *testing.T) {
	keep := t.TempDir()
	g := kept.OpenRegistry(keep)
	a := announceStandIn(t, g, "a", "exec sleep 60", "serve")
	code, out, _ := shimMainJSON(t, "list", "--running", "--keep-root", keep)
	assert.Equal(t, 0, code)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2)
	assert.Regexp(t, `^NAME\s+KIND\s+PROVIDER\s+PID\s+STARTED\s+CONTROL$`, lines[0])
	assert.Contains(t, lines[1], a.rec.ControlSocket)
	assert.Regexp(t, `^a\s+run\s+bwrap\s+\d+\s`, lines[1])

	code, out, _ = shimMainJSON(t, "list", "--running", "--keep-root", keep, "--json")
	assert.Equal(t, 0, code)
	var rep api.RunningReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	require.Len(t, rep.Sandboxes, 1)
	assert.Equal(t, a.rec.ControlSocket, rep.Sandboxes[0].ControlSocket)
	assert.Equal(t, a.rec.PID, rep.Sandboxes[0].PID)
}

func TestStopUsage(t *testing.T) {
	for _, args := range [][]string{{"stop"}, {"stop", "--all", "a"}, {"stop", "--grace", "0s", "a"}, {"stop", "Bad_Name"}} {
		code, _, errOut := shimMainJSON(t, args...)
		assert.Equal(t, 2, code, "%v: %s", args, errOut)
	}
}

func shimMainJSON(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return shimMain(args...)
}
