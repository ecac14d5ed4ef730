package provider

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// childEnv makes the test binary a child process: "exit N" exits with N,
// "sleep" sleeps until it is killed.
const childEnv = "OAC_PROVIDER_TEST_CHILD"

func TestMain(m *testing.M) {
	switch v := os.Getenv(childEnv); {
	case v == "sleep":
		time.Sleep(time.Hour)
		os.Exit(0)
	case v != "":
		n, _ := strconv.Atoi(v)
		os.Exit(n)
	}
	goleak.VerifyTestMain(m)
}

func child(t *testing.T, what string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+what)
	return cmd
}

func phrase(err error) error {
	if err == nil {
		return errors.New("runtime exited with status 0")
	}
	return fmt.Errorf("runtime exited: %w", err)
}

var errStuck = errors.New("runtime did not exit within 10s of SIGKILL")

func waitDone(t *testing.T, p *Process) {
	t.Helper()
	select {
	case <-p.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done was not closed")
	}
}

// fakeWaiter is a runtime whose exit the test decides.
type fakeWaiter struct {
	exit       chan error // Wait returns what is sent here
	ignoreKill bool       // Kill does not end it
	kills      atomic.Int32
}

func newFake() *fakeWaiter { return &fakeWaiter{exit: make(chan error, 1)} }

func (f *fakeWaiter) Wait() error { return <-f.exit }
func (f *fakeWaiter) Pid() int    { return 4242 }
func (f *fakeWaiter) Kill() error {
	f.kills.Add(1)
	if !f.ignoreKill {
		f.end(errors.New("signal: killed"))
	}
	return nil
}

func (f *fakeWaiter) end(err error) {
	select {
	case f.exit <- err:
	default:
	}
}

func TestProcessNotStarted(t *testing.T) {
	p := NewProcess(phrase, errStuck)
	assert.False(t, p.Started())
	assert.Zero(t, p.HostPID())
	assert.NoError(t, p.Err())
	assert.NoError(t, p.Kill(), "nothing to kill")
	select {
	case <-p.Done():
		t.Fatal("Done closed before Start")
	default:
	}
}

func TestProcessRecordsExit(t *testing.T) {
	p := NewProcess(phrase, errStuck)
	require.NoError(t, p.Start(child(t, "0")))
	assert.True(t, p.Started())
	waitDone(t, p)
	assert.EqualError(t, p.Err(), "runtime exited with status 0")

	p = NewProcess(phrase, errStuck)
	cmd := child(t, "3")
	require.NoError(t, p.Start(cmd))
	assert.Equal(t, cmd.Process.Pid, p.HostPID())
	waitDone(t, p)
	var ee *exec.ExitError
	require.ErrorAs(t, p.Err(), &ee, "Wait's error is wrapped")
	assert.Equal(t, 3, ee.ExitCode())
	assert.EqualError(t, p.Err(), "runtime exited: exit status 3")
	assert.Equal(t, cmd.Process.Pid, p.HostPID(), "the pid stays known after the exit")
}

func TestProcessStartFailure(t *testing.T) {
	p := NewProcess(phrase, errStuck)
	err := p.Start(exec.Command(t.TempDir() + "/missing"))
	require.Error(t, err)
	assert.False(t, p.Started())
	assert.Zero(t, p.HostPID())
	assert.NoError(t, p.Kill())
}

func TestProcessKillRunning(t *testing.T) {
	p := NewProcess(phrase, errStuck)
	require.NoError(t, p.Start(child(t, "sleep")))
	assert.NoError(t, p.Err(), "no error while it runs")
	require.NoError(t, p.Kill())
	waitDone(t, p)
	var ee *exec.ExitError
	assert.ErrorAs(t, p.Err(), &ee)
	assert.ErrorContains(t, p.Err(), "runtime exited: ")
	assert.NoError(t, p.Kill(), "a second Kill finds it exited")
}

func TestProcessErrBeforeAndAfterExit(t *testing.T) {
	p := NewProcess(phrase, errStuck)
	f := newFake()
	p.Watch(f)
	assert.True(t, p.Started())
	assert.Equal(t, 4242, p.HostPID())
	assert.NoError(t, p.Err())
	boom := errors.New("boom")
	f.end(boom)
	waitDone(t, p)
	assert.ErrorIs(t, p.Err(), boom)
	assert.EqualError(t, p.Err(), "runtime exited: boom")
}

func TestProcessKillAfterExit(t *testing.T) {
	p := NewProcess(phrase, errStuck)
	f := newFake()
	p.Watch(f)
	f.end(nil)
	waitDone(t, p)
	assert.NoError(t, p.Kill())
	assert.Zero(t, f.kills.Load(), "an exited runtime is not killed")
	assert.EqualError(t, p.Err(), "runtime exited with status 0", "Kill does not change why it exited")
}

func TestProcessKillOfAFake(t *testing.T) {
	p := NewProcess(phrase, errStuck)
	f := newFake()
	p.Watch(f)
	require.NoError(t, p.Kill())
	assert.Equal(t, int32(1), f.kills.Load())
	waitDone(t, p)
	assert.EqualError(t, p.Err(), "runtime exited: signal: killed")
}

func TestProcessKillGivesUpOnAWaitThatNeverReturns(t *testing.T) {
	p := NewProcess(phrase, errStuck)
	p.killWait = 50 * time.Millisecond
	f := newFake()
	f.ignoreKill = true
	p.Watch(f)
	start := time.Now()
	err := p.Kill()
	assert.Same(t, errStuck, err, "the named error")
	assert.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond)
	assert.Equal(t, int32(1), f.kills.Load())
	assert.NoError(t, p.Err(), "still running")
	// Let the watcher go (goleak checks it ends).
	f.end(nil)
	waitDone(t, p)
}

func TestProcessKillWith(t *testing.T) {
	p := NewProcess(phrase, errStuck)
	p.killWait = 50 * time.Millisecond
	f := newFake()
	f.ignoreKill = true
	p.Watch(f)
	refused := errors.New("cannot stop")
	assert.Same(t, refused, p.KillWith(func() error { return refused }), "kill's error, at once")
	assert.Same(t, errStuck, p.KillWith(func() error { return nil }))
	assert.NoError(t, p.KillWith(func() error { f.end(errors.New("stopped")); return nil }))
	waitDone(t, p)
	assert.EqualError(t, p.Err(), "runtime exited: stopped")
	called := false
	assert.NoError(t, p.KillWith(func() error { called = true; return nil }))
	assert.False(t, called, "not called once the runtime has exited")
	assert.Zero(t, f.kills.Load(), "KillWith does not use the Waiter's Kill")
}

func TestProcessWatchesOneRuntime(t *testing.T) {
	p := NewProcess(phrase, errStuck)
	f := newFake()
	p.Watch(f)
	assert.Panics(t, func() { p.Watch(newFake()) })
	f.end(nil)
	waitDone(t, p)
}

func TestProcessKillAskingLetsTheRuntimeExitFirst(t *testing.T) {
	p := NewProcess(phrase, errStuck)
	f := newFake()
	p.Watch(f)
	asked := 0
	require.NoError(t, p.KillAsking(func() { asked++; f.end(nil) }, 5*time.Second))
	assert.Equal(t, 1, asked)
	assert.Equal(t, int32(0), f.kills.Load(), "the runtime exited when asked: no kill")
	waitDone(t, p)
	assert.NoError(t, p.KillAsking(func() { asked++ }, time.Second), "after the exit nothing is asked")
	assert.Equal(t, 1, asked)
}

func TestProcessKillAskingKillsAfterTheGrace(t *testing.T) {
	p := NewProcess(phrase, errStuck)
	f := newFake()
	p.Watch(f)
	asked := 0
	require.NoError(t, p.KillAsking(func() { asked++ }, 50*time.Millisecond))
	assert.Equal(t, 1, asked)
	assert.Equal(t, int32(1), f.kills.Load(), "ignored: killed after the grace")
	waitDone(t, p)
}

func TestProcessKillAskingBeforeStartAsksNothing(t *testing.T) {
	p := NewProcess(phrase, errStuck)
	require.NoError(t, p.KillAsking(func() { t.Fatal("asked an unstarted runtime") }, time.Second))
}
