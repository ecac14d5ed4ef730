package bwrap

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A killed shim's bwrap, orphaned before its --die-with-parent took hold,
// names its sandbox's state directory in its arguments; the next create
// of the name kills it, and nothing else. The test binary stands in for
// bwrap: a process of one executable that never forks.
func TestTheNextCreateKillsWhatAKilledShimsSandboxLeftRunning(t *testing.T) {
	self, err := os.Executable()
	require.NoError(t, err)
	root := t.TempDir()
	dir := filepath.Join(root, "sandboxes", "box")
	start := func(exe string, args ...string) *exec.Cmd {
		cmd := exec.Command(exe, args...)
		cmd.Env = append(os.Environ(), "OAC_BWRAP_TEST_LEFTOVER=1")
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	leftover := start(self, "--ro-bind", dir+"/hosts", "/etc/hosts")
	other := start(self, "--ro-bind", filepath.Join(root, "sandboxes", "box2")+"/hosts", "/etc/hosts")
	sleep, err := exec.LookPath("sleep")
	require.NoError(t, err)

	n, err := killLeftovers(dir, sleep)
	require.NoError(t, err)
	assert.Zero(t, n, "a process of another executable is never killed, whatever its arguments")
	assert.NoError(t, leftover.Process.Signal(syscall.Signal(0)))

	n, err = killLeftovers(dir, self)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	st, _ := leftover.Process.Wait()
	assert.Equal(t, "signal: killed", st.String(), "the sandbox's leftover is killed")
	assert.NoError(t, other.Process.Signal(syscall.Signal(0)), "another sandbox's process lives")

	n, err = killLeftovers(dir, self)
	require.NoError(t, err)
	assert.Zero(t, n, "nothing left to kill")
}
