package lifecycle

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oac/sandbox-agent/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeJob is one attempt driven by the test.
type fakeJob struct {
	attempt uint64
	ctx     context.Context
	r       Reporter
	// result ends the job with this error (nil: as if stopped).
	result chan error
}

// fakes hands each attempt's job to the test as it starts.
type fakes struct {
	jobs    chan *fakeJob
	hold    atomic.Bool
	mu      sync.Mutex
	changes []api.Status
}

func newFakes() *fakes { return &fakes{jobs: make(chan *fakeJob, 16)} }

func (f *fakes) job(ctx context.Context, attempt uint64, r Reporter) error {
	j := &fakeJob{attempt: attempt, ctx: ctx, r: r, result: make(chan error, 1)}
	f.jobs <- j
	select {
	case err := <-j.result:
		return err
	case <-ctx.Done():
		// A real job takes time to stop in order: with hold set, the job
		// ends only when the test sends its result.
		if f.hold.Load() {
			return <-j.result
		}
		return nil
	}
}

func (f *fakes) onChange(s api.Status) { f.mu.Lock(); f.changes = append(f.changes, s); f.mu.Unlock() }

func (f *fakes) states() []api.State {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []api.State
	for _, s := range f.changes {
		out = append(out, s.State)
	}
	return out
}

func (f *fakes) next(t *testing.T) *fakeJob {
	t.Helper()
	select {
	case j := <-f.jobs:
		return j
	case <-time.After(5 * time.Second):
		t.Fatal("no job started")
		return nil
	}
}

func (f *fakes) noJob(t *testing.T) {
	t.Helper()
	select {
	case j := <-f.jobs:
		t.Fatalf("unexpected job for attempt %d", j.attempt)
	case <-time.After(50 * time.Millisecond):
	}
}

func newController(f *fakes, destroy func(context.Context) error) *Controller {
	return New(Config{Name: "demo", Job: f.job, OnChange: f.onChange, Destroy: destroy})
}

func waitState(t *testing.T, c *Controller, state api.State) api.Status {
	t.Helper()
	require.Eventually(t, func() bool { return c.Status().State == state }, 5*time.Second, time.Millisecond, "state %s", state)
	return c.Status()
}

func TestInitialStateIsStoppedAtAttemptZero(t *testing.T) {
	c := newController(newFakes(), nil)
	assert.Equal(t, api.Status{ServerID: "sandbox:demo", State: api.StateStopped}, c.Status())
	select {
	case <-c.Done():
	default:
		t.Fatal("nothing runs: Done is closed")
	}
	require.NoError(t, c.Stop(context.Background()), "stopping what does not run does nothing")
}

func TestStartingReadyStopped(t *testing.T) {
	f := newFakes()
	c := newController(f, nil)
	a, err := c.Start()
	require.NoError(t, err)
	assert.Equal(t, uint64(1), a)
	assert.Equal(t, api.StateStarting, c.Status().State)
	j := f.next(t)
	assert.Equal(t, uint64(1), j.attempt)
	assert.True(t, j.r.Report(Update{State: api.StateStarting, Message: "creating sandbox"}))
	assert.True(t, j.r.Report(Update{State: api.StateReady, URL: "http://127.0.0.1:1", Username: "runtime", Password: "pw"}))
	st := c.Status()
	assert.Equal(t, api.Status{ServerID: "sandbox:demo", State: api.StateReady, URL: "http://127.0.0.1:1", Username: "runtime", Password: "pw", Attempt: 1}, st)

	require.NoError(t, c.Stop(context.Background()))
	st = c.Status()
	assert.Equal(t, api.StateStopped, st.State)
	assert.Equal(t, "stopped: stop requested", st.Message)
	assert.Empty(t, st.Password, "a stopped sandbox has no credentials")
	assert.Equal(t, []api.State{api.StateStarting, api.StateStarting, api.StateReady, api.StateStopped}, f.states())
	c.Wait()
}

func TestJobErrorIsFailedAlsoAfterReady(t *testing.T) {
	f := newFakes()
	c := newController(f, nil)
	_, _ = c.Start()
	j := f.next(t)
	j.r.Report(Update{State: api.StateReady})
	j.result <- errors.New("daemon exited: exit status 1")
	st := waitState(t, c, api.StateFailed)
	assert.Equal(t, "daemon exited: exit status 1", st.Message)
	assert.Equal(t, uint64(1), st.Attempt)
	c.Wait()
}

func TestJobReturningNilByItselfIsStopped(t *testing.T) {
	f := newFakes()
	c := newController(f, nil)
	_, _ = c.Start()
	f.next(t).result <- nil
	assert.Equal(t, "stopped on its own", waitState(t, c, api.StateStopped).Message)
	c.Wait()
}

func TestTransitionsWithinAnAttempt(t *testing.T) {
	for _, tc := range []struct {
		from, to api.State
		ok       bool
	}{
		{api.StateStarting, api.StateStarting, true},
		{api.StateStarting, api.StateReady, true},
		{api.StateStarting, api.StateFailed, true},
		{api.StateStarting, api.StateStopped, true},
		{api.StateReady, api.StateFailed, true},
		{api.StateReady, api.StateStopped, true},
		{api.StateReady, api.StateStarting, false},
		{api.StateReady, api.StateReady, false},
		{api.StateFailed, api.StateReady, false},
		{api.StateFailed, api.StateStarting, false},
		{api.StateFailed, api.StateStopped, false},
		{api.StateStopped, api.StateReady, false},
		{api.StateStopped, api.StateFailed, false},
		{api.StateStarting, "bogus", false},
		{api.StateStarting, api.StateWarm, true},
		{api.StateWarm, api.StateStarting, true},
		{api.StateWarm, api.StateFailed, true},
		{api.StateWarm, api.StateStopped, true},
		{api.StateWarm, api.StateReady, false},
		{api.StateWarm, api.StateWarm, false},
		{api.StateReady, api.StateWarm, false},
	} {
		t.Run(string(tc.from+"->"+tc.to), func(t *testing.T) {
			f := newFakes()
			c := newController(f, nil)
			_, _ = c.Start()
			j := f.next(t)
			if tc.from != api.StateStarting {
				if tc.from != api.StateReady && tc.from != api.StateWarm {
					require.True(t, j.r.Report(Update{State: api.StateReady}))
				}
				require.True(t, j.r.Report(Update{State: tc.from}))
			}
			before := c.Dropped()
			assert.Equal(t, tc.ok, j.r.Report(Update{State: tc.to}))
			if tc.ok {
				assert.Equal(t, tc.to, c.Status().State)
			} else {
				assert.Equal(t, tc.from, c.Status().State)
				assert.Equal(t, before+1, c.Dropped())
			}
			require.NoError(t, c.Stop(context.Background()))
			c.Wait()
		})
	}
}

func TestNewStartAbortsTheOneInFlightAndRunsAfterIt(t *testing.T) {
	f := newFakes()
	c := newController(f, nil)
	f.hold.Store(true)
	_, _ = c.Start()
	j1 := f.next(t)
	j1.r.Report(Update{State: api.StateStarting, Message: "booting"})

	// Hold attempt 1 in its orderly stop: the new start must wait for it.
	hold := make(chan struct{})
	j1Done := make(chan struct{})
	go func() {
		<-j1.ctx.Done()
		<-hold
		j1.result <- nil
		close(j1Done)
	}()
	a2, err := c.Start()
	require.NoError(t, err)
	assert.Equal(t, uint64(2), a2)
	<-j1.ctx.Done()
	assert.Equal(t, "superseded by attempt 2", context.Cause(j1.ctx).Error())
	st := c.Status()
	assert.Equal(t, api.StateStarting, st.State)
	assert.Equal(t, uint64(2), st.Attempt)
	assert.Equal(t, "start requested (attempt 2)", st.Message)
	f.noJob(t) // single flight: attempt 2 waits for attempt 1

	close(hold)
	<-j1Done
	j2 := f.next(t)
	assert.Equal(t, uint64(2), j2.attempt)
	assert.Equal(t, api.StateStarting, c.Status().State, "attempt 1's stopped was stale and dropped")
	assert.GreaterOrEqual(t, c.Dropped(), uint64(1))
	f.hold.Store(false)
	require.NoError(t, c.Stop(context.Background()))
	c.Wait()
}

func TestLateResultsOfAnOldAttemptAreDropped(t *testing.T) {
	f := newFakes()
	c := newController(f, nil)
	_, _ = c.Start()
	j1 := f.next(t)
	_, _ = c.Start()
	j2 := f.next(t)
	require.True(t, j2.r.Report(Update{State: api.StateStarting, Message: "attempt 2 booting"}))

	assert.False(t, j1.r.Report(Update{State: api.StateReady, URL: "http://old"}), "a late ready of attempt 1")
	assert.False(t, j1.r.Report(Update{State: api.StateFailed, Message: "old failure"}))
	st := c.Status()
	assert.Equal(t, api.StateStarting, st.State)
	assert.Equal(t, uint64(2), st.Attempt)
	assert.Empty(t, st.URL)
	for _, s := range f.changes {
		assert.NotEqual(t, "http://old", s.URL)
	}
	require.True(t, j2.r.Report(Update{State: api.StateReady, URL: "http://new"}))
	assert.Equal(t, "http://new", c.Status().URL)
	require.NoError(t, c.Stop(context.Background()))
	c.Wait()
}

func TestStartsInARowRunOnlyTheLast(t *testing.T) {
	f := newFakes()
	c := newController(f, nil)
	f.hold.Store(true)
	_, _ = c.Start()
	j1 := f.next(t)
	hold := make(chan struct{})
	go func() { <-j1.ctx.Done(); <-hold; j1.result <- nil }()
	_, _ = c.Start() // attempt 2 waits for 1
	a3, _ := c.Start()
	close(hold)
	j := f.next(t)
	assert.Equal(t, a3, j.attempt, "attempt 2 was aborted before it ran")
	f.noJob(t)
	f.hold.Store(false)
	require.NoError(t, c.Stop(context.Background()))
	c.Wait()
	assert.NotContains(t, f.states()[len(f.states())-1:], api.StateReady)
}

func TestStopBeforeTheJobStartedIsStopped(t *testing.T) {
	f := newFakes()
	c := newController(f, nil)
	f.hold.Store(true)
	_, _ = c.Start()
	j1 := f.next(t)
	hold := make(chan struct{})
	go func() { <-j1.ctx.Done(); <-hold; j1.result <- nil }()
	_, _ = c.Start()
	// The stop aborts attempt 2 while attempt 1 still holds the flight.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	assert.Error(t, c.Stop(ctx), "attempt 1 has not ended yet")
	close(hold)
	require.NoError(t, c.Stop(context.Background()))
	st := c.Status()
	assert.Equal(t, api.StateStopped, st.State)
	assert.Equal(t, uint64(2), st.Attempt)
	assert.Equal(t, "stopped before it started: stop requested", st.Message)
	f.noJob(t)
	c.Wait()
}

func TestStopGivesUpWithItsContext(t *testing.T) {
	f := newFakes()
	c := newController(f, nil)
	f.hold.Store(true)
	_, _ = c.Start()
	j := f.next(t)
	release := make(chan struct{})
	go func() { <-j.ctx.Done(); <-release; j.result <- nil }()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	assert.Error(t, c.Stop(ctx), "the job has not ended")
	close(release)
	<-c.Done()
	c.Wait()
}

func TestResetStopsRemovesAndStartsAfresh(t *testing.T) {
	f := newFakes()
	var order []string
	var mu sync.Mutex
	c := newController(f, func(context.Context) error {
		mu.Lock()
		order = append(order, "destroy:"+string(c0(f)))
		mu.Unlock()
		return nil
	})
	_, _ = c.Start()
	j1 := f.next(t)
	j1.r.Report(Update{State: api.StateReady})
	a, err := c.Reset(context.Background())
	require.NoError(t, err)
	assert.Equal(t, uint64(2), a)
	j2 := f.next(t)
	assert.Equal(t, uint64(2), j2.attempt)
	mu.Lock()
	assert.Equal(t, []string{"destroy:" + string(api.StateStopped)}, order, "persistent state is removed after attempt 1 stopped")
	mu.Unlock()
	require.NoError(t, c.Stop(context.Background()))
	c.Wait()
}

// c0 returns the last state OnChange saw.
func c0(f *fakes) api.State {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.changes[len(f.changes)-1].State
}

func TestResetFailsWhenRemovalFails(t *testing.T) {
	f := newFakes()
	c := newController(f, func(context.Context) error { return errors.New("volume busy") })
	_, _ = c.Start()
	f.next(t)
	_, err := c.Reset(context.Background())
	assert.ErrorContains(t, err, "reset: volume busy")
	f.noJob(t)
	assert.Equal(t, api.StateStopped, c.Status().State)
	c.Wait()
}

func TestDestroyStopsRemovesAndRefusesStarts(t *testing.T) {
	f := newFakes()
	removed := false
	c := newController(f, func(context.Context) error { removed = true; return nil })
	_, _ = c.Start()
	f.next(t).r.Report(Update{State: api.StateReady})
	require.NoError(t, c.Destroy(context.Background()))
	assert.True(t, removed)
	st := c.Status()
	assert.Equal(t, api.StateStopped, st.State)
	assert.Equal(t, "destroyed", st.Message)
	_, err := c.Start()
	assert.ErrorIs(t, err, ErrDestroyed)
	_, err = c.Reset(context.Background())
	assert.ErrorIs(t, err, ErrDestroyed)
	f.noJob(t)
	c.Wait()
}

func TestOnChangeSeesChangesInOrderWithoutThePasswordInJSON(t *testing.T) {
	f := newFakes()
	c := newController(f, nil)
	_, _ = c.Start()
	j := f.next(t)
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); j.r.Report(Update{State: api.StateStarting}) }()
	}
	wg.Wait()
	j.r.Report(Update{State: api.StateReady, Password: "SECRET"})
	require.NoError(t, c.Stop(context.Background()))
	c.Wait()
	states := f.states()
	assert.Equal(t, api.StateStopped, states[len(states)-1])
	assert.Equal(t, api.StateReady, states[len(states)-2])
	b, err := jsonMarshal(c.Status())
	require.NoError(t, err)
	assert.NotContains(t, string(b), "SECRET")
}
