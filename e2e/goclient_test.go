//go:build linux

package e2e

// The Go client (package client) against the real oac-shim and real bwrap
// guests: create until ready with the password it made, typed errors,
// every wait ended by its context, kept sandboxes, and oac-guest helper's
// output read as an exec stream delivers it.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/client"
)

// goOptions are the client's options for a bwrap sandbox of the boot
// contract with name, the bootstrap handed over on stdin.
func goOptions(t *testing.T, name string, daemonArgs ...string) client.Options {
	return client.Options{
		Shim: bins.shim, Name: name, Provider: "bwrap", Agent: bins.guest,
		SandboxIO: bins.sandboxIO, Install: []string{"oac-daemon-standin=" + bins.daemon},
		Identity:  &client.Identity{Tenant: tenantID, Environment: environmentID, Allocation: allocationID},
		Bootstrap: strings.NewReader(encode(t, contract("link.example.com", daemonArgs...))),
		Forwards:  []string{"127.0.0.1:0=4096"},
		Stderr:    testWriter{t},
	}
}

// testWriter logs the shim's diagnostics with the test's.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Logf("oac-shim: %s", strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func timeout(t *testing.T, d time.Duration) context.Context {
	c, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return c
}

// noneLeft says that nothing of the sandbox runs: no process names it.
func noneLeft(t *testing.T, name string) {
	t.Helper()
	assert.Empty(t, hostProcs(name), "no process of sandbox %s is left", name)
}

func TestGoClientStartsUntilReadyAndTheDaemonTakesThePasswordItMade(t *testing.T) {
	needBwrap(t)
	name := uniqueName("goclient")
	s, ready, err := client.StartReady(timeout(t, bootTimeout), goOptions(t, name))
	require.NoError(t, err)
	defer s.Kill()
	assert.Regexp(t, `^http://127\.0\.0\.1:\d+$`, ready.URL, "the forward's address")
	assert.Equal(t, "runtime", ready.Username)
	pw := s.Password()
	require.Len(t, pw, 43)

	get := func(password string) int {
		req, err := http.NewRequestWithContext(timeout(t, 10*time.Second), http.MethodGet, ready.URL+"/global/health", nil)
		require.NoError(t, err)
		req.SetBasicAuth(ready.Username, password)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	assert.Equal(t, http.StatusOK, get(pw), "the daemon takes the password the client made")
	assert.Equal(t, http.StatusUnauthorized, get(client.NewPassword()))
	digest, err := s.WaitEvent(timeout(t, 10*time.Second), func(e api.Event) bool {
		return e.Event == api.KindLog && strings.HasPrefix(e.Line, "daemon: password-sha256=")
	})
	require.NoError(t, err)
	assert.Equal(t, "daemon: password-sha256="+sha(pw), digest.Line)

	for _, pid := range append([]int{s.PID()}, descendants(s.PID())...) {
		if cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); strings.Contains(string(cmd), "oac-daemon-standin") {
			continue // the daemon's password_env has it: the bootstrap's contract
		}
		for _, f := range []string{"cmdline", "environ"} {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, f))
			assert.NotContains(t, string(b), pw, "the password is in no argv or environment but the daemon's (pid %d %s)", pid, f)
		}
	}
	for _, e := range s.History() {
		assert.NotContains(t, fmt.Sprintf("%+v", e), pw, "nor in an event")
	}

	st, err := s.Status(timeout(t, 10*time.Second))
	require.NoError(t, err)
	assert.Equal(t, "sandbox:"+name, st.ServerID)
	require.NoError(t, s.Stop(timeout(t, 30*time.Second)))
	h := s.History()
	assert.Equal(t, "stopped: stop command", h[len(h)-1].Message)
	noneLeft(t, name)
}

func TestGoClientErrorsAreTypedWithTheCodeAndWhetherARetryHelps(t *testing.T) {
	needBwrap(t)
	t.Run("a refused bootstrap", func(t *testing.T) {
		name := uniqueName("goclient-bad")
		o := goOptions(t, name)
		o.Bootstrap = strings.NewReader(`{"version": 1, "Daemon": {}}`)
		s, _, err := client.StartReady(timeout(t, bootTimeout), o)
		assert.Nil(t, s)
		var fe *client.FailedError
		require.ErrorAs(t, err, &fe)
		assert.Equal(t, api.CodeInvalidBootstrap, fe.Code)
		assert.Equal(t, api.CodeInvalidBootstrap, client.Code(err))
		assert.False(t, client.Retryable(err), "the same bootstrap fails the same way")
		noneLeft(t, name)
	})
	t.Run("a missing binary", func(t *testing.T) {
		o := goOptions(t, uniqueName("goclient-nobin"))
		o.Shim = "/nonexistent/oac-shim"
		_, _, err := client.StartReady(timeout(t, 10*time.Second), o)
		assert.ErrorIs(t, err, fs.ErrNotExist, "ENOENT, not an exit before ready")
	})
	t.Run("a flag the shim does not know", func(t *testing.T) {
		name := uniqueName("goclient-flag")
		o := goOptions(t, name)
		o.Args, o.Stderr = []string{"--frobnicate"}, nil
		_, _, err := client.StartReady(timeout(t, 10*time.Second), o)
		var xe *client.ExitedError
		require.ErrorAs(t, err, &xe)
		assert.Equal(t, api.ExitUsage, xe.Status)
		assert.Contains(t, xe.Stderr, "flag provided but not defined: -frobnicate")
		assert.Equal(t, "exited", client.Code(err))
		noneLeft(t, name)
	})
	t.Run("a refused command", func(t *testing.T) {
		name := uniqueName("goclient-cmd")
		s, _, err := client.StartReady(timeout(t, bootTimeout), goOptions(t, name))
		require.NoError(t, err)
		defer s.Kill()
		err = s.PushTime(timeout(t, 10*time.Second))
		var ce *client.CommandError
		require.ErrorAs(t, err, &ce)
		assert.Equal(t, api.AnswerUnsupported, ce.Code, "only VM guests set their clock from the host")
		assert.False(t, client.Retryable(err))
		err = s.RemoveForward(timeout(t, 10*time.Second), "127.0.0.1:1")
		assert.Equal(t, api.AnswerNotFound, client.Code(err))
		require.NoError(t, s.Stop(timeout(t, 30*time.Second)))
	})
}

func TestGoClientEndsEveryWaitWithItsContextAndLeavesNothing(t *testing.T) {
	needBwrap(t)
	t.Run("start until ready", func(t *testing.T) {
		name := uniqueName("goclient-cancel")
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		o := goOptions(t, name)
		o.OnEvent = func(e api.Event) {
			if e.Event == api.KindAgent { // the guest is up, not yet ready
				cancel()
			}
		}
		s, _, err := client.StartReady(ctx, o)
		assert.Nil(t, s)
		assert.ErrorIs(t, err, context.Canceled)
		noneLeft(t, name)
	})
	t.Run("events, a command and stop", func(t *testing.T) {
		name := uniqueName("goclient-cancel2")
		s, _, err := client.StartReady(timeout(t, bootTimeout), goOptions(t, name))
		require.NoError(t, err)
		defer s.Kill()
		gone, cancel := context.WithCancel(context.Background())
		cancel()
		for _, err := range s.Events(gone, client.FromNow()) {
			assert.ErrorIs(t, err, context.Canceled)
		}
		_, err = s.WaitState(gone, api.StateStopped)
		assert.ErrorIs(t, err, context.Canceled)
		_, err = s.Status(gone)
		assert.ErrorIs(t, err, context.Canceled)
		st, err := s.Status(timeout(t, 10*time.Second))
		require.NoError(t, err, "a cancelled command leaves the shim usable")
		assert.Equal(t, api.StateReady, st.State)
		err = s.Stop(gone)
		assert.ErrorIs(t, err, context.Canceled)
		select {
		case <-s.Done():
		default:
			t.Fatal("a stop whose context ended kills the shim")
		}
		noneLeft(t, name)
	})
}

func TestGoClientCreatesStartsResetsAndDestroysAKeptSandbox(t *testing.T) {
	needBwrap(t)
	root, err := os.MkdirTemp("", "oac-e2e-keep-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(root) })
	require.NoError(t, os.Chmod(root, 0o711))
	where := client.Sandboxes{Shim: bins.shim, KeepRoot: root}
	name := uniqueName("goclient-kept")
	ctx := timeout(t, 3*time.Minute)
	require.NoError(t, client.CreateKept(ctx, where, client.KeptSpec{Name: name, Provider: "bwrap", Agent: bins.guest,
		SandboxIO: bins.sandboxIO, Install: []string{"oac-daemon-standin=" + bins.daemon}}))
	t.Cleanup(func() { _ = client.DestroyKept(context.Background(), where, name) })
	rep, err := client.ListKept(ctx, where)
	require.NoError(t, err)
	require.Len(t, rep.Sandboxes, 1)
	assert.Equal(t, api.KeptCreated, rep.Sandboxes[0].State)

	// Each start reports whether /home/runtime/kept was there, then makes it.
	persisted := func() string {
		o := goOptions(t, name, "--persist", "/home/runtime/kept")
		o.Provider, o.SandboxIO, o.Install = "", "", nil
		o.Kept, o.KeepRoot = true, root
		s, _, err := client.StartReady(ctx, o)
		require.NoError(t, err)
		defer s.Kill()
		e, err := s.WaitEvent(ctx, func(e api.Event) bool {
			return e.Event == api.KindLog && strings.HasPrefix(e.Line, "daemon: persist /home/runtime/kept=")
		})
		require.NoError(t, err)
		_, err = s.WaitEvent(ctx, func(e api.Event) bool {
			return e.Event == api.KindLog && strings.HasPrefix(e.Line, "daemon: persisted /home/runtime/kept=")
		})
		require.NoError(t, err)
		listed, err := client.ListKept(ctx, where)
		require.NoError(t, err)
		assert.True(t, listed.Sandboxes[0].InUse, "a shim holds it while it runs")
		require.NoError(t, s.Stop(ctx))
		return strings.TrimPrefix(e.Line, "daemon: persist /home/runtime/kept=")
	}
	assert.Equal(t, "absent", persisted(), "a fresh kept sandbox")
	assert.NotEqual(t, "absent", persisted(), "the second start finds what the first wrote")
	require.NoError(t, client.ResetKept(ctx, where, name, bins.guest))
	assert.Equal(t, "absent", persisted(), "a reset takes it back to its image")

	require.NoError(t, client.DestroyKept(ctx, where, name))
	rep, err = client.ListKept(ctx, where)
	require.NoError(t, err)
	assert.Empty(t, rep.Sandboxes)
	_, err = os.Stat(root + "/sandboxes/" + name)
	assert.ErrorIs(t, err, fs.ErrNotExist, "every byte of it is gone")
}

// oac-guest helper's stdout, read as E2B's process API or msb exec
// --stream delivers it: a byte stream of the process's standard output.
func TestGoClientReadsOacGuestHelperOutputFromAnExecStream(t *testing.T) {
	needBwrap(t)
	needImageBuild(t)
	_, link := publicLink(t)
	name := uniqueName("goclient-helper")
	argv := bwrapHelperArgv(t, name)
	cmd := exec.Command(argv[0], argv[1:]...)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	_, err = io.WriteString(stdin, helperPayload(link, name)+"\n")
	require.NoError(t, err)

	out := client.NewHelperOutput(stdout)
	kinds := map[string]int{}
	ready, err := out.WaitReady(func(e api.Event) { kinds[e.Event]++ })
	require.NoError(t, err)
	assert.Equal(t, fmt.Sprintf("http://127.0.0.1:%d", daemonPort), ready.URL)
	assert.Equal(t, "runtime", ready.Username)
	assert.Positive(t, kinds[api.KindAgent], "every event before ready passed the reader's rules")

	require.NoError(t, stdin.Close()) // E2B's CloseStdin
	var last api.Event
	for {
		e, err := out.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		last = e
	}
	assert.Equal(t, "stopped: stdin closed", last.Message)
	require.NoError(t, cmd.Wait())

	bad := exec.Command(argv[0], argv[1:]...)
	bad.Stdin = strings.NewReader(`{"Runtime": {"command": ["/bin/true"]}}`)
	badOut, err := bad.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, bad.Start())
	_, err = client.NewHelperOutput(badOut).WaitReady(nil)
	var fe *client.FailedError
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, api.CodeInvalidBootstrap, fe.Code)
	_ = bad.Wait()
}

func TestGoClientAttachesToASandboxAfterItsParentWasKilled(t *testing.T) {
	needBwrap(t)
	name := uniqueName("goclient-attach")
	bootFile := filepath.Join(t.TempDir(), "bootstrap.json")
	require.NoError(t, os.WriteFile(bootFile, []byte(encode(t, contract("link.example.com"))), 0o600))
	parent := exec.Command(bins.goParent, append([]string{"-shim", bins.shim, "-name", name, "-bootstrap", bootFile, "--",
		"--provider", "bwrap", "--agent", bins.guest}, identityArgs()...)...)
	parent.Stderr = testWriter{t}
	out, err := parent.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, parent.Start())
	t.Cleanup(func() {
		_ = parent.Process.Kill()
		_, _ = client.StopNamed(context.Background(), client.Sandboxes{Shim: bins.shim}, 10*time.Second, name)
	})
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		sc.Scan()
		line <- sc.Text()
	}()
	var fields []string
	select {
	case l := <-line:
		fields = strings.Fields(l)
	case <-time.After(bootTimeout):
		t.Fatal("the parent did not say ready")
	}
	require.Len(t, fields, 5, "ready SEQ URL USERNAME PASSWORD")
	readySeq, err := strconv.ParseUint(fields[1], 10, 64)
	require.NoError(t, err)
	url, user, password := fields[2], fields[3], fields[4]

	require.NoError(t, parent.Process.Kill(), "SIGKILL: the parent cannot stop anything")
	_ = parent.Wait()
	get := func() int {
		req, err := http.NewRequestWithContext(timeout(t, 10*time.Second), http.MethodGet, url+"/global/health", nil)
		require.NoError(t, err)
		req.SetBasicAuth(user, password)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	assert.Equal(t, http.StatusOK, get(), "the sandbox outlived its parent, with the password the parent made")

	ctx := timeout(t, time.Minute)
	s, err := client.Attach(ctx, client.AttachOptions{Shim: bins.shim, Name: name, From: client.FromSeq(readySeq), Stderr: testWriter{t}})
	require.NoError(t, err)
	defer s.Kill()
	var first api.Event
	for e, err := range s.Events(ctx, client.From{}) {
		require.NoError(t, err)
		first = e
		break
	}
	assert.Equal(t, readySeq, first.Seq, "the events since the parent's last")
	assert.Equal(t, api.StateReady, first.State)
	assert.Equal(t, url, first.URL)
	st, err := s.Status(ctx)
	require.NoError(t, err, "the control API through the attach")
	assert.Equal(t, api.StateReady, st.State)
	assert.Equal(t, "sandbox:"+name, st.ServerID)

	require.NoError(t, s.Stop(ctx), "the attached stop stops the sandbox; the attach exits 0 after the final state")
	h := s.History()
	assert.Equal(t, "stopped: stop command", h[len(h)-1].Message)
	noneLeft(t, name)

	gone, err := client.Attach(ctx, client.AttachOptions{Shim: bins.shim, Name: name})
	require.NoError(t, err)
	_, err = gone.WaitState(ctx, api.StateReady)
	var xe *client.ExitedError
	require.ErrorAs(t, err, &xe, "nothing runs it any more")
	assert.Equal(t, api.ExitNotRunning, xe.Status)
}
