//go:build unix

package provider

import (
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// lockedBuffer is a bytes.Buffer safe for the copier and the test.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestAPipedRuntimesExitIsNotHeldBackByWhatItLeftHoldingItsOutput(t *testing.T) {
	// The runtime says its last words and exits; what it ran keeps the
	// pipe while it dies (here: a grandchild sleeping).
	p := NewProcess(phrase, errStuck)
	var out lockedBuffer
	cmd := exec.Command("/bin/sh", "-c", "sleep 30 & echo last words; exit 0")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, p.StartPiped(cmd, &out))
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	select {
	case <-p.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done waited for the grandchild that holds the output pipe")
	}
	assert.Equal(t, "last words\n", out.String(), "the runtime's own last output is there when Done closes")
}
