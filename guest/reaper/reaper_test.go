//go:build linux

package reaper

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/internal/proctree"
)

// One reaper serves the whole test binary, as it serves the whole agent.
var testReaper = func() *Reaper {
	if err := BecomeSubreaper(); err != nil {
		panic(err)
	}
	return New()
}()

func wait(t *testing.T, ch <-chan Exit) Exit {
	t.Helper()
	select {
	case e := <-ch:
		return e
	case <-time.After(10 * time.Second):
		t.Fatal("no exit status delivered within 10s")
		return Exit{}
	}
}

func TestOwnerGetsItsExitStatus(t *testing.T) {
	ch, err := testReaper.Start(exec.Command("/bin/sh", "-c", "exit 3"), Options{})
	require.NoError(t, err)
	e := wait(t, ch)
	assert.Equal(t, 3, e.Code())
	assert.Equal(t, "exit status 3", e.String())
}

func TestSignalledChildReportsSignal(t *testing.T) {
	ch, err := testReaper.Start(exec.Command("/bin/sh", "-c", "kill -KILL $$"), Options{})
	require.NoError(t, err)
	e := wait(t, ch)
	assert.Equal(t, -1, e.Code())
	assert.Equal(t, "killed by signal killed", e.String())
}

func TestManyConcurrentChildrenEachGetTheirOwnStatus(t *testing.T) {
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code := i % 7
			ch, err := testReaper.Start(exec.Command("/bin/sh", "-c", fmt.Sprintf("exit %d", code)), Options{})
			if !assert.NoError(t, err) {
				return
			}
			assert.Equal(t, code, wait(t, ch).Code())
		}()
	}
	wg.Wait()
}

func TestOrphansAreReapedAndLeaveNoZombie(t *testing.T) {
	before := testReaper.Orphans()
	// The shell exits at once; its background child is re-parented to us.
	ch, err := testReaper.Start(exec.Command("/bin/sh", "-c", "sleep 0.2 & exit 0"), Options{})
	require.NoError(t, err)
	assert.Equal(t, 0, wait(t, ch).Code())
	require.Eventually(t, func() bool { return testReaper.Orphans() > before }, 10*time.Second, 20*time.Millisecond)
	assert.Empty(t, zombieChildren(t))
}

func TestNoNewPrivsIsSetForTheChildOnly(t *testing.T) {
	r, w, err := os.Pipe()
	require.NoError(t, err)
	cmd := exec.Command("/bin/sh", "-c", "grep NoNewPrivs /proc/self/status")
	cmd.Stdout = w
	ch, err := testReaper.Start(cmd, Options{NoNewPrivs: true})
	w.Close()
	require.NoError(t, err)
	out := make([]byte, 256)
	n, _ := r.Read(out)
	r.Close()
	assert.Equal(t, 0, wait(t, ch).Code())
	assert.Contains(t, string(out[:n]), "NoNewPrivs:\t1")

	self, err := os.ReadFile("/proc/self/status")
	require.NoError(t, err)
	assert.Contains(t, string(self), "NoNewPrivs:\t0", "the agent itself must keep its privileges")
}

func TestRefusesNonFileStdio(t *testing.T) {
	cmd := exec.Command("/bin/true")
	cmd.Stdout = &strings.Builder{}
	_, err := testReaper.Start(cmd, Options{})
	assert.ErrorContains(t, err, "must be nil or *os.File")
}

func zombieChildren(t *testing.T) []int {
	t.Helper()
	var z []int
	for _, p := range proctree.Descendants(proctree.All(), os.Getpid()) {
		if p.PPID == os.Getpid() && p.State == "Z" {
			z = append(z, p.PID)
		}
	}
	return z
}
