package dataplane

import (
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// A child started with a parent-death signal gets it when the thread that
// forked it ends. The pair maker's thread may be one that started a
// sandbox's runtime earlier (docker, qemu and bwrap run with one), so the
// maker must give its thread back instead of ending it. The test forks a
// child from the very thread the maker then runs on.
func TestThePairMakersThreadOutlivesItSoChildrenOfThatThreadLive(t *testing.T) {
	needRoot(t)
	child := exec.Command("sleep", "60")
	child.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	errs := make(chan error, 1)
	body := func() { // runs locked to a thread other than the main one
		if err := child.Start(); err != nil {
			runtime.UnlockOSThread()
			errs <- err
			return
		}
		nsfd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errs <- err
			return
		}
		pm := &pairMaker{ready: make(chan [2]int, pairsAhead), need: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
		started := make(chan error, 1)
		close(pm.quit)
		pm.run(nsfd, started)
		runtime.UnlockOSThread()
		errs <- <-started
		// The goroutine ends here: its thread ends with it only if the
		// maker left the thread locked.
	}
	// The main thread is never ended, only parked, so the test holds it
	// while another thread runs the body.
	var onThread func()
	onThread = func() {
		runtime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			done := make(chan struct{})
			go func() { defer close(done); onThread() }()
			<-done
			runtime.UnlockOSThread()
			return
		}
		body()
	}
	go onThread()
	require.NoError(t, <-errs)
	exited := make(chan error, 1)
	go func() { exited <- child.Wait() }()
	select {
	case err := <-exited:
		t.Fatalf("the child forked from the maker's thread died when the maker stopped: %v", err)
	case <-time.After(500 * time.Millisecond):
		// alive: the maker gave its thread back
	}
	require.NoError(t, child.Process.Kill())
	<-exited
}
