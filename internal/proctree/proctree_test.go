//go:build linux

package proctree

import (
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAStatLineWithSpacesAndParenthesesInItsNameIsRead(t *testing.T) {
	p, ok := parse(42, []byte("42 (a (b) c) S 7 42 42 0 -1 4194560 100 0 0 0 11 22 33 44 20 0 1 0 5 0 0"))
	require.True(t, ok)
	assert.Equal(t, Proc{PID: 42, PPID: 7, Comm: "a (b) c", State: "S", CPUTicks: 11 + 22 + 33 + 44}, p)
	for _, bad := range []string{"", "42 (x", "42 (x) S 7", "42 ) S 7 42 42 0 -1 4194560 100 0 0 0 11 22 33 44 20 0 1 0 5 0 0 ("} {
		_, ok := parse(42, []byte(bad))
		assert.False(t, ok, "%q", bad)
	}
}

func TestDescendantsFindsAGrandchildAndNothingElse(t *testing.T) {
	cmd := exec.Command("sh", "-c", "sleep 30 & wait")
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var below []Proc
	require.Eventually(t, func() bool {
		below = Descendants(All(), os.Getpid())
		return len(below) == 2
	}, 10*time.Second, 10*time.Millisecond)
	assert.Equal(t, cmd.Process.Pid, below[0].PID, "the child first")
	assert.Equal(t, cmd.Process.Pid, below[1].PPID, "then its child")
	assert.Empty(t, Descendants(All(), below[1].PID))
}
