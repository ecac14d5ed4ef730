//go:build linux

package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

// pipeWith returns the read end of a pipe that holds data and is closed.
func pipeWith(t *testing.T, data string) *os.File {
	t.Helper()
	r, w, err := os.Pipe()
	require.NoError(t, err)
	go func() {
		_, _ = io.WriteString(w, data)
		w.Close()
	}()
	t.Cleanup(func() { r.Close() })
	return r
}

// The Link credential and the daemon's password travel on descriptors the
// parent holds: no file on the host's disk has either.
func TestBootstrapOnADescriptorAndThePasswordOnAnother(t *testing.T) {
	needBwrap(t)
	b := contract("link.example.com")
	pwR, pwW, err := os.Pipe()
	require.NoError(t, err)
	defer pwR.Close()
	s := startShim(t, sandboxSpec{
		extraFiles: []*os.File{pipeWith(t, encode(t, b)), pwW},
		args:       append(identityArgs(), "--bootstrap", "fd:3", "--password-fd", "4"),
	})
	pwW.Close() // the shim holds its own copy
	s.waitState(api.StateReady, bootTimeout)
	line, err := bufio.NewReader(pwR).ReadString('\n')
	require.NoError(t, err)
	attempt, password, ok := strings.Cut(strings.TrimSuffix(line, "\n"), " ")
	require.True(t, ok, "%q is ATTEMPT PASSWORD", line)
	assert.Equal(t, "1", attempt)
	assert.Len(t, password, 43, "a generated 32-byte password")
	assert.Equal(t, sha(password), s.waitLog("daemon: password-sha256=", bootTimeout), "the daemon got the password the parent read")
	assert.Equal(t, bootstrap.CredentialDigest(linkCredential), s.waitLog("sandbox-io: credential-sha256=", bootTimeout))
	_, raw := s.allEvents()
	for _, l := range append(raw, s.stderr.String()) {
		assert.NotContains(t, l, password)
		assert.NotContains(t, l, linkCredential)
	}
	s.signal(syscall.SIGTERM)
	s.waitState(api.StateStopped, 15*time.Second)
	assert.Equal(t, 0, s.exit(10*time.Second))
}

// Core's sandbox.Bootstrap on stdin, ahead of the control commands, boots
// the same sandbox as the bootstrap it maps to.
func TestCoresBootstrapOnStdinBeforeTheCommands(t *testing.T) {
	needBwrap(t)
	b := contract("link.example.com")
	core, err := bootstrap.ToCore(b)
	require.NoError(t, err)
	doc, err := json.Marshal(core)
	require.NoError(t, err)
	in, stdin, err := os.Pipe() // an *os.File: exec copies no goroutine to wait for
	require.NoError(t, err)
	defer stdin.Close()
	s := startShim(t, sandboxSpec{
		stdin: in,
		args:  append(identityArgs(), "--bootstrap", "-", "--bootstrap-format", "core", "--control", "stdin"),
	})
	in.Close()
	_, err = stdin.Write(append(doc, '\n'))
	require.NoError(t, err)
	ready := s.waitState(api.StateReady, bootTimeout)
	assert.Equal(t, "http://127.0.0.1:4096", ready.URL)
	want, err := b.SandboxIO.Bootstrap.Encode()
	require.NoError(t, err)
	assert.Equal(t, sha(string(want)), s.waitLog("sandbox-io: file-sha256=", bootTimeout), "the private file is the Core input, exactly")
	assert.Equal(t, "ALL_PROXY,HOME,HTTPS_PROXY,HTTP_PROXY,NO_PROXY,OAC_EGRESS_REFUSALS,OAC_SERVER_PASSWORD,OAC_SERVER_USERNAME,PATH,XDG_STATE_HOME,all_proxy,http_proxy,https_proxy,no_proxy",
		s.waitLog("daemon: env-names=", bootTimeout))
	_, err = io.WriteString(stdin, `{"id":"s","cmd":"stop"}`+"\n")
	require.NoError(t, err)
	answer := s.waitFor(func(e api.Event) bool { return e.Event == api.KindAnswer }, 10*time.Second, "the stop answer")
	assert.Equal(t, api.KindAnswer, answer.Event)
	s.waitState(api.StateStopped, 15*time.Second)
	assert.Equal(t, 0, s.exit(10*time.Second))
}

// stdinPasswordShim starts a shim whose stdin is a pipe the test writes:
// the daemon's password line, then what args say follows it.
func stdinPasswordShim(t *testing.T, spec sandboxSpec) (*shim, *os.File) {
	t.Helper()
	in, stdin, err := os.Pipe() // an *os.File: exec copies no goroutine to wait for
	require.NoError(t, err)
	t.Cleanup(func() { stdin.Close() })
	spec.stdin = in
	s := startShim(t, spec)
	in.Close()
	return s, stdin
}

// The caller makes the daemon's password and hands it in on stdin, ahead
// of the bootstrap and the commands: the way that works on every OS. The
// daemon gets exactly it, on the first attempt and after a reset; the
// ready URL answers to it; it is in no argv, no environment of the shim,
// no event and no diagnostic.
func TestThePasswordOnStdinIsTheDaemonsOnEveryAttempt(t *testing.T) {
	needBwrap(t)
	const password = "caller-made_Pa55word-e2e-4b1d7c0a9e"
	s, stdin := stdinPasswordShim(t, sandboxSpec{
		args: append(identityArgs(), "--password-stdin", "--bootstrap", "-", "--control", "stdin",
			"--forward", "127.0.0.1:0=4096"),
	})
	_, err := io.WriteString(stdin, password+"\n"+encode(t, contract("link.example.com"))+"\n")
	require.NoError(t, err)

	ready := s.waitState(api.StateReady, bootTimeout)
	daemonSaw := func(attempt uint64) string {
		return s.waitFor(func(e api.Event) bool {
			return e.Event == api.KindLog && e.Attempt == attempt && strings.HasPrefix(e.Line, "daemon: password-sha256=")
		}, bootTimeout, "the daemon's password digest").Line
	}
	assert.Equal(t, "daemon: password-sha256="+sha(password), daemonSaw(1))
	hc := &http.Client{Timeout: 10 * time.Second}
	code, body := get(t, hc, ready.URL+"/global/health", ready.Username, password)
	assert.Equal(t, http.StatusOK, code, "the ready URL answers to the caller's password")
	assert.Equal(t, `{"healthy":true}`, body)
	code, _ = get(t, hc, ready.URL+"/global/health", ready.Username, password+"x")
	assert.Equal(t, http.StatusUnauthorized, code)

	// Nowhere a process listing or another user could read it.
	for _, pid := range append([]int{s.cmd.Process.Pid}, descendants(s.cmd.Process.Pid)...) {
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err == nil {
			assert.NotContains(t, string(cmdline), password, "argv of pid %d", pid)
		}
	}
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", s.cmd.Process.Pid))
	require.NoError(t, err)
	assert.NotContains(t, string(environ), password, "the shim's environment")

	// A reset is a new attempt with the same password: the caller made it.
	_, err = io.WriteString(stdin, `{"id":"r","cmd":"reset"}`+"\n")
	require.NoError(t, err)
	again := s.waitFor(func(e api.Event) bool {
		return e.Event == api.KindState && e.State == api.StateReady && e.Attempt == 2
	}, bootTimeout, "ready of attempt 2")
	assert.Equal(t, "daemon: password-sha256="+sha(password), daemonSaw(2), "attempt 2's daemon has the same password")
	code, _ = get(t, hc, again.URL+"/global/health", again.Username, password)
	assert.Equal(t, http.StatusOK, code)

	_, err = io.WriteString(stdin, `{"id":"s","cmd":"stop"}`+"\n")
	require.NoError(t, err)
	s.waitState(api.StateStopped, 15*time.Second)
	assert.Equal(t, 0, s.exit(10*time.Second))
	_, raw := s.allEvents()
	for _, l := range append(raw, s.stderr.String()) {
		assert.NotContains(t, l, password)
	}
}

// A password line that breaks the rules: one failed event saying which
// rule, without the line, and nothing created (the bootstrap is a file
// here: stdin is the password line alone).
func TestABadPasswordLineOnStdinCreatesNothing(t *testing.T) {
	needBwrap(t)
	const bad = "has spaces in-the-password-line"
	s, stdin := stdinPasswordShim(t, sandboxSpec{
		bootstrap: encode(t, contract("link.example.com")),
		args:      append(identityArgs(), "--password-stdin"),
	})
	_, err := io.WriteString(stdin, bad+"\n")
	require.NoError(t, err)
	require.NoError(t, stdin.Close())
	failed := s.exitFailed(api.CodeInvalidConfig, 15*time.Second)
	assert.Equal(t, "nothing created: --password-stdin: character 4 of the password line is a space (the first line of stdin is the daemon's password: 16 to 1024 printable ASCII characters without spaces, then a newline)", failed.Message)
	evs, raw := s.allEvents()
	assert.Len(t, evs, 1, "the failed event alone: no sandbox was created")
	for _, l := range append(raw, s.stderr.String()) {
		assert.NotContains(t, l, "in-the-password-line")
	}
}
