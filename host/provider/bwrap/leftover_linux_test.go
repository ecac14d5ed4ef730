package bwrap

import (
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A killed shim's bwrap, orphaned before its --die-with-parent took hold,
// names its sandbox's state directory in its arguments; the next create
// of the name kills it, and nothing else.
func TestTheNextCreateKillsWhatAKilledShimsSandboxLeftRunning(t *testing.T) {
	sh, err := exec.LookPath("sh")
	require.NoError(t, err)
	root := t.TempDir()
	dir := filepath.Join(root, "sandboxes", "box")
	start := func(args ...string) *exec.Cmd {
		cmd := exec.Command(sh, append([]string{"-c", "sleep 1000; :"}, args...)...)
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	leftover := start("--ro-bind", dir+"/hosts", "/etc/hosts")
	other := start("--ro-bind", filepath.Join(root, "sandboxes", "box2")+"/hosts", "/etc/hosts")
	sleep, err := exec.LookPath("sleep")
	require.NoError(t, err)
	notBwrap := exec.Command(sleep, "1000", dir+"/hosts")
	require.NoError(t, notBwrap.Start())
	t.Cleanup(func() { _ = notBwrap.Process.Kill(); _ = notBwrap.Wait() })

	n, err := killLeftovers(dir, sh)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	st, _ := leftover.Process.Wait()
	assert.Equal(t, "signal: killed", st.String(), "the sandbox's leftover is killed")
	assert.NoError(t, other.Process.Signal(syscall.Signal(0)), "another sandbox's process lives")
	assert.NoError(t, notBwrap.Process.Signal(syscall.Signal(0)), "a process that is not bwrap lives, whatever its arguments")

	n, err = killLeftovers(dir, sh)
	require.NoError(t, err)
	assert.Zero(t, n, "nothing left to kill")
}
