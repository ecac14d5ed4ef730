package osthread

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestTheMainThreadNeverKeepsWhatTheWorkDid(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (CAP_SYS_ADMIN) to make a mount namespace: run the tests as root")
	}
	process, err := os.Readlink("/proc/self/ns/mnt")
	require.NoError(t, err)
	var ranOn int
	var workers string
	runOnMainThread(func() {
		if !assert.Equal(t, unix.Getpid(), unix.Gettid(), "this runs on the main thread") {
			return
		}
		err = throwawayBody(func() error {
			ranOn = unix.Gettid()
			if err := unix.Unshare(unix.CLONE_FS | unix.CLONE_NEWNS); err != nil {
				return err
			}
			var err error
			workers, err = os.Readlink("/proc/thread-self/ns/mnt")
			return err
		})
		now, _ := os.Readlink("/proc/thread-self/ns/mnt")
		assert.Equal(t, process, now, "the main thread did not move")
	})
	require.NoError(t, err)
	assert.NotEqual(t, unix.Getpid(), ranOn, "the work moved off the main thread")
	assert.NotEqual(t, process, workers, "the work had a namespace of its own")
	assert.Equal(t, process, readlink(t, "/proc/self/ns/mnt"), "the process reads as its own namespace still")
}

func TestTheWorksThreadEndsWithIt(t *testing.T) {
	var tid int
	require.NoError(t, Throwaway(func() error { tid = unix.Gettid(); return nil }))
	assert.Eventually(t, func() bool {
		_, err := os.Stat("/proc/self/task/" + strconv.Itoa(tid))
		return os.IsNotExist(err)
	}, 5*time.Second, time.Millisecond, "thread %d is gone", tid)
}

func TestTheWorksErrorIsReturned(t *testing.T) {
	want := os.ErrDeadlineExceeded
	assert.ErrorIs(t, Throwaway(func() error { return want }), want)
}

func readlink(t *testing.T, p string) string {
	s, err := os.Readlink(p)
	require.NoError(t, err)
	return s
}
