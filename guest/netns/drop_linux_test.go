package netns

import (
	"os"
	"os/exec"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestDropOthersLeavesOnlyLo runs in a network namespace of its own with
// a veth pair and a dummy interface, as a Pod's is given one.
func TestDropOthersLeavesOnlyLo(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make a network namespace (run as root)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs ip (apt-get install iproute2)")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		// Back to the process's namespace before the thread is reused (it
		// may be the main thread, which the runtime never ends).
		orig, err := os.Open(threadNS)
		require.NoError(t, err)
		defer orig.Close()
		defer func() {
			if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
				runtime.UnlockOSThread()
			}
		}()
		require.NoError(t, unix.Unshare(unix.CLONE_NEWNET))
		for _, args := range [][]string{
			{"link", "add", "eth0", "type", "veth", "peer", "name", "eth1"},
			{"link", "add", "veth-a", "type", "veth", "peer", "name", "veth-b"},
			{"link", "set", "eth0", "up"},
		} {
			out, err := exec.Command("ip", args...).CombinedOutput()
			require.NoError(t, err, "ip %v: %s", args, out)
		}
		dropped, err := DropOthers()
		require.NoError(t, err)
		assert.NotEmpty(t, dropped)
		left, err := Others()
		require.NoError(t, err)
		assert.Empty(t, left, "only lo is left")
		again, err := DropOthers()
		assert.NoError(t, err)
		assert.Empty(t, again, "nothing more to drop")
	}()
	<-done
}
