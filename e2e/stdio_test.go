//go:build linux

package e2e

import (
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/internal/yamux"
	"github.com/oac/sandbox-agent/protocol"
	"github.com/oac/sandbox-agent/protocol/transport"
)

// guestOverStdio starts the real oac-guest with the stdio transport (as the
// WSL provider runs it) and returns the host end of its session.
func guestOverStdio(t *testing.T, env ...string) (*exec.Cmd, *yamux.Session, *lockedBuffer) {
	t.Helper()
	cmd := exec.Command(bins.guest, "--transport", "stdio://")
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sess, err := yamux.Server(transport.StreamConn(stdout, stdin, "oac-guest"), protocol.MuxConfig(nil))
	require.NoError(t, err)
	t.Cleanup(func() { sess.Close() })
	return cmd, sess, &stderr
}

func exitCode(t *testing.T, cmd *exec.Cmd, timeout time.Duration) int {
	t.Helper()
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
		t.Fatalf("oac-guest did not exit within %s", timeout)
	}
	return cmd.ProcessState.ExitCode()
}

func TestGuestOverStdioAppliesABootstrapAndStopsOnShutdown(t *testing.T) {
	cmd, sess, stderr := guestOverStdio(t)
	ctl, hello, welcome, err := protocol.HostHandshake(sess, protocol.MinVersion, protocol.MaxVersion, protocol.Welcome{HostVersion: "e2e"}, 10*time.Second)
	require.NoError(t, err)
	assert.Equal(t, cmd.Process.Pid, hello.PID)
	assert.Equal(t, 1, welcome.Version)

	require.NoError(t, ctl.Send(protocol.TypeBootstrap, map[string]any{"version": 1}))
	var st protocol.State
	require.NoError(t, ctl.RecvMessage(protocol.TypeState, &st))
	assert.Equal(t, protocol.StateStarting, st.State)
	require.NoError(t, ctl.RecvMessage(protocol.TypeState, &st), stderr.String())
	assert.Equal(t, protocol.StateReady, st.State)

	require.NoError(t, ctl.Send(protocol.TypeShutdown, protocol.Shutdown{Reason: "test over", GraceMS: 1000}))
	require.NoError(t, ctl.RecvMessage(protocol.TypeState, &st))
	assert.Equal(t, protocol.StateStopped, st.State)
	assert.Equal(t, "test over", st.Message)
	sess.Close() // as oac-shim does once it read "stopped"
	assert.Equal(t, 0, exitCode(t, cmd, 10*time.Second), stderr.String())
}

func TestGuestRefusesAHostOfAnotherProtocolVersion(t *testing.T) {
	cmd, sess, stderr := guestOverStdio(t)
	_, _, _, err := protocol.HostHandshake(sess, 2, 3, protocol.Welcome{HostVersion: "e2e"}, 10*time.Second)
	require.ErrorIs(t, err, protocol.ErrVersionMismatch)
	assert.EqualError(t, err, "protocol version mismatch: guest speaks 1..1, host 2..3")
	assert.Equal(t, 1, exitCode(t, cmd, 10*time.Second))
	assert.Contains(t, stderr.String(), "protocol version mismatch: guest speaks 1..1, host 2..3")
	assert.NotContains(t, stderr.String(), "panic")
}

func TestGuestRefusesAnInvalidBootstrap(t *testing.T) {
	cmd, sess, stderr := guestOverStdio(t)
	ctl, _, _, err := protocol.HostHandshake(sess, protocol.MinVersion, protocol.MaxVersion, protocol.Welcome{HostVersion: "e2e"}, 10*time.Second)
	require.NoError(t, err)
	// The guest validates again: the host is not trusted either.
	require.NoError(t, ctl.Send(protocol.TypeBootstrap, map[string]any{"version": 1, "daemon": map[string]any{"argv": []string{"sh"}}}))
	var st protocol.State
	require.NoError(t, ctl.RecvMessage(protocol.TypeState, &st))
	assert.Equal(t, protocol.StateFailed, st.State)
	assert.Contains(t, st.Message, "argv")
	sess.Close()
	assert.Equal(t, 1, exitCode(t, cmd, 10*time.Second))
	assert.Contains(t, stderr.String(), "bootstrap refused")
}
