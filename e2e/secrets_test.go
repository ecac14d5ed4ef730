//go:build linux

package e2e

import (
	"bufio"
	"encoding/json"
	"io"
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
