//go:build linux

package reaper

import (
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The runtime never destroys the main thread; a no-new-privs start that ran
// there would leave the agent's main thread marked. Many starts in a row
// give the scheduler every chance to pick it.
func TestManyNoNewPrivsStartsNeverMarkTheMainThread(t *testing.T) {
	for range 200 {
		ch, err := testReaper.Start(exec.Command("/bin/true"), Options{NoNewPrivs: true})
		require.NoError(t, err)
		wait(t, ch)
	}
	self, err := os.ReadFile("/proc/self/status")
	require.NoError(t, err)
	assert.Contains(t, string(self), "NoNewPrivs:\t0")
}
