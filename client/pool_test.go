package client

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
)

// poolLog records a pool's events for the test to wait on.
type poolLog struct {
	mu     sync.Mutex
	all    []PoolEvent
	notify chan struct{}
}

func newPoolLog() *poolLog { return &poolLog{notify: make(chan struct{})} }

func (l *poolLog) on(e PoolEvent) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all = append(l.all, e)
	close(l.notify)
	l.notify = make(chan struct{})
}

func (l *poolLog) events() []PoolEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]PoolEvent(nil), l.all...)
}

// wait returns the n-th (from 1) event of kind, waiting for it.
func (l *poolLog) wait(t *testing.T, kind PoolEventKind, n int) PoolEvent {
	t.Helper()
	c := ctx(t)
	for {
		l.mu.Lock()
		seen := 0
		for _, e := range l.all {
			if e.Kind == kind {
				if seen++; seen == n {
					l.mu.Unlock()
					return e
				}
			}
		}
		notify := l.notify
		l.mu.Unlock()
		select {
		case <-notify:
		case <-c.Done():
			t.Fatalf("no %s event #%d: %+v", kind, n, l.events())
		}
	}
}

func (l *poolLog) count(kind PoolEventKind) int {
	n := 0
	for _, e := range l.events() {
		if e.Kind == kind {
			n++
		}
	}
	return n
}

// fakePool starts a pool of fake warm shims, which wait for their gate
// file in the returned directory before they are warm (gated) or not.
func fakePool(t *testing.T, o PoolOptions, gated bool) (*Pool, *poolLog, string) {
	t.Helper()
	gate := t.TempDir()
	if !gated {
		require.NoError(t, os.WriteFile(filepath.Join(gate, "all"), nil, 0o600))
	}
	log := newPoolLog()
	o.Options = fake("warm")
	o.Options.Name = "p"
	o.Options.Env = append(o.Options.Env, "FAKE_WARM_GATE="+gate)
	o.OnEvent = log.on
	p, err := NewPool(ctx(t), o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p, log, gate
}

func open(t *testing.T, gate, name string) {
	t.Helper()
	require.NoError(t, os.WriteFile(filepath.Join(gate, name), nil, 0o600))
}

func startedNames(log *poolLog) []string {
	var out []string
	for _, e := range log.events() {
		if e.Kind == PoolRefillStarted {
			out = append(out, e.Sandbox)
		}
	}
	return out
}

var tenantBoot = json.RawMessage(`{"version":1}`)

func TestAPoolClaimsItsOldestWarmSandboxFirstAndRefills(t *testing.T) {
	p, log, gate := fakePool(t, PoolOptions{Size: 3, MaxBoots: 3}, true)
	names := startedNames(log)
	require.Len(t, names, 3, "NewPool starts the first refills at once")
	// They become warm in another order than they were started.
	order := []string{names[2], names[0], names[1]}
	for i, n := range order {
		open(t, gate, n)
		assert.Equal(t, n, log.wait(t, PoolRefillWarm, i+1).Sandbox)
	}
	assert.Equal(t, 3, p.Warm())

	for i, want := range order {
		s, info, err := p.Claim(ctx(t), ClaimRequest{Bootstrap: tenantBoot})
		require.NoError(t, err)
		assert.True(t, info.Hit)
		assert.Equal(t, want, info.Sandbox, "claim %d takes the oldest warm", i)
		assert.Equal(t, want, s.Name())
		assert.Equal(t, api.StateReady, info.Ready.State)
		assert.Equal(t, info.Result.Attempt, info.Ready.Attempt)
		assert.Positive(t, info.Age)
		hit := log.wait(t, PoolHit, i+1)
		assert.Equal(t, want, hit.Sandbox)
		assert.Equal(t, info.Age, hit.Age)
		assert.Equal(t, 4+i, log.count(PoolRefillStarted), "each claim starts a refill")
		require.NoError(t, s.Stop(ctx(t)))
	}
	assert.Equal(t, 0, p.Warm())
	for _, n := range startedNames(log)[3:] {
		open(t, gate, n)
	}
	log.wait(t, PoolRefillWarm, 6)
	assert.Equal(t, 3, p.Warm(), "back to Size")
	assert.Zero(t, log.count(PoolMiss))
}

func TestAPoolNeverBootsMoreThanMaxBootsAtOnce(t *testing.T) {
	p, log, gate := fakePool(t, PoolOptions{Size: 5, MaxBoots: 2}, true)
	require.Len(t, startedNames(log), 2, "two boots at once, not five")
	open(t, gate, "all")
	log.wait(t, PoolRefillWarm, 5)
	assert.Equal(t, 5, p.Warm())
	inFlight, most := 0, 0
	for _, e := range log.events() {
		switch e.Kind {
		case PoolRefillStarted:
			inFlight++
		case PoolRefillWarm, PoolFailed:
			inFlight--
		}
		most = max(most, inFlight)
		assert.LessOrEqual(t, e.Booting, 2, "%+v", e)
	}
	assert.Equal(t, 2, most)
	assert.Equal(t, 5, log.count(PoolRefillStarted), "no more than Size")
}

func TestAClaimWithNoneWarmBootsOneForItselfAndSaysItMissed(t *testing.T) {
	p, log, gate := fakePool(t, PoolOptions{Size: 1, MaxBoots: 1}, true)
	refill := startedNames(log)[0]
	type claimed struct {
		s    *Shim
		info ClaimInfo
		err  error
	}
	got := make(chan claimed, 1)
	go func() {
		s, info, err := p.Claim(ctx(t), ClaimRequest{Bootstrap: tenantBoot})
		got <- claimed{s, info, err}
	}()
	miss := log.wait(t, PoolMiss, 1)
	assert.Empty(t, miss.Sandbox)
	open(t, gate, "all")
	c := <-got
	require.NoError(t, c.err)
	t.Cleanup(c.s.Kill)
	assert.False(t, c.info.Hit)
	assert.NotEqual(t, refill, c.info.Sandbox, "the miss booted its own sandbox")
	assert.Equal(t, api.StateReady, c.info.Ready.State)
	assert.Positive(t, c.info.Age, "a miss's age is its boot")

	assert.Equal(t, refill, log.wait(t, PoolRefillWarm, 1).Sandbox)
	s, info, err := p.Claim(ctx(t), ClaimRequest{Bootstrap: tenantBoot})
	require.NoError(t, err)
	assert.True(t, info.Hit)
	assert.Equal(t, refill, s.Name())
	require.NoError(t, s.Stop(ctx(t)))
	require.NoError(t, c.s.Stop(ctx(t)))
}

func TestAPoolPutsTheDaemonsPasswordInTheClaimsCredentialsNeverInAnEvent(t *testing.T) {
	p, log, _ := fakePool(t, PoolOptions{Size: 1}, false)
	log.wait(t, PoolRefillWarm, 1)
	s, _, err := p.Claim(ctx(t), ClaimRequest{Bootstrap: json.RawMessage(`{"version":1,"daemon":{"argv":["/d"]},"credentials":{"username_env":"U","password_env":"P"}}`)})
	require.NoError(t, err)
	t.Cleanup(s.Kill)
	pw := s.Password()
	require.Len(t, pw, 43, "made with crypto/rand")
	var sent struct {
		Credentials map[string]string `json:"credentials"`
	}
	require.NoError(t, json.Unmarshal([]byte(logOf(t, s, "fake/claim")), &sent))
	assert.Equal(t, map[string]string{"username_env": "U", "password_env": "P", "password": pw}, sent.Credentials)
	for _, e := range log.events() {
		assert.NotContains(t, fmt.Sprintf("%+v", e), pw)
	}

	log.wait(t, PoolRefillWarm, 2)
	mine := "my-own-password-0123456789"
	s2, _, err := p.Claim(ctx(t), ClaimRequest{Bootstrap: json.RawMessage(`{"version":1,"credentials":{"password":"` + mine + `"}}`)})
	require.NoError(t, err)
	t.Cleanup(s2.Kill)
	assert.Equal(t, mine, s2.Password(), "a bootstrap's own password is kept")

	log.wait(t, PoolRefillWarm, 3)
	_, _, err = p.Claim(ctx(t), ClaimRequest{Bootstrap: json.RawMessage(`{"version":1,"credentials":{"password":"has a space in it, sadly"}}`)})
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "sadly", "the error does not repeat the password")
	assert.Equal(t, 1, p.Warm(), "nothing was taken")
	assert.Equal(t, 2, log.count(PoolHit))
}

func TestAClaimRefusedForItsInputLeavesTheSandboxWarmInThePool(t *testing.T) {
	p, log, _ := fakePool(t, PoolOptions{Size: 1}, false)
	warm := log.wait(t, PoolRefillWarm, 1).Sandbox
	_, info, err := p.Claim(ctx(t), ClaimRequest{Bootstrap: tenantBoot, Forwards: []api.ForwardSpec{{Listen: "127.0.0.1:0"}}})
	assert.Equal(t, api.AnswerInvalidArgument, Code(err), "a forward without its guest port")
	assert.Equal(t, warm, info.Sandbox)
	assert.Equal(t, 1, p.Warm())
	assert.Equal(t, 1, log.count(PoolRefillStarted), "nothing was used up")

	s, info, err := p.Claim(ctx(t), ClaimRequest{Bootstrap: tenantBoot})
	require.NoError(t, err)
	assert.True(t, info.Hit)
	assert.Equal(t, warm, s.Name(), "the same sandbox, claimed for good")
	require.NoError(t, s.Stop(ctx(t)))
}

func TestAWarmSandboxPastItsMaximumAgeIsReplaced(t *testing.T) {
	p, log, _ := fakePool(t, PoolOptions{Size: 1, MaxAge: 200 * time.Millisecond}, false)
	first := log.wait(t, PoolRefillWarm, 1).Sandbox
	expired := log.wait(t, PoolExpired, 1)
	assert.Equal(t, first, expired.Sandbox)
	assert.GreaterOrEqual(t, expired.Age, 200*time.Millisecond)
	second := log.wait(t, PoolRefillStarted, 2) // its replacement
	assert.NotEqual(t, first, second.Sandbox)
	assert.Equal(t, second.Sandbox, log.wait(t, PoolRefillWarm, 2).Sandbox)
	require.NoError(t, p.Close(ctx(t)))
	assert.Zero(t, log.count(PoolFailed))
}

func TestABootThatFailsIsReportedAndRetriedLater(t *testing.T) {
	log := newPoolLog()
	o := fake("fail")
	o.Name = "p"
	p, err := NewPool(ctx(t), PoolOptions{Options: o, Size: 1, OnEvent: log.on})
	require.NoError(t, err)
	first := log.wait(t, PoolFailed, 1)
	assert.Equal(t, api.CodeBootTimeout, Code(first.Err))
	second := log.wait(t, PoolFailed, 2)
	started := log.wait(t, PoolRefillStarted, 2)
	assert.GreaterOrEqual(t, started.Time.Sub(first.Time), backoffMin, "the next boot waits")
	assert.NotEqual(t, first.Sandbox, second.Sandbox)
	require.NoError(t, p.Close(ctx(t)))
	_, _, err = p.Claim(ctx(t), ClaimRequest{Bootstrap: tenantBoot})
	assert.ErrorIs(t, err, ErrPoolClosed)
}

func TestClosingAPoolStopsWhatItHoldsAndNotWhatWasClaimed(t *testing.T) {
	p, log, gate := fakePool(t, PoolOptions{Size: 3}, true)
	names := startedNames(log)
	open(t, gate, names[0])
	open(t, gate, names[1])
	log.wait(t, PoolRefillWarm, 2)
	s, _, err := p.Claim(ctx(t), ClaimRequest{Bootstrap: tenantBoot})
	require.NoError(t, err)
	t.Cleanup(s.Kill)
	p.mu.Lock()
	var held []*Shim
	for _, m := range p.warm {
		held = append(held, m.s)
	}
	p.mu.Unlock()
	require.Len(t, held, 1)

	// One warm, two booting (never let through their gate): Close stops
	// them all and waits for their shims.
	require.NoError(t, p.Close(ctx(t)))
	for _, h := range held {
		select {
		case <-h.Done():
		default:
			t.Errorf("the warm shim %s still runs after Close", h.Name())
		}
	}
	p.mu.Lock()
	assert.Empty(t, p.live, "no shim of the pool is left")
	p.mu.Unlock()
	st, err := s.Status(ctx(t))
	require.NoError(t, err)
	assert.Equal(t, api.StateReady, st.State, "the claimed sandbox is its caller's")
	require.NoError(t, s.Stop(ctx(t)))
	_, _, err = p.Claim(ctx(t), ClaimRequest{Bootstrap: tenantBoot})
	assert.ErrorIs(t, err, ErrPoolClosed)
}

func TestNewPoolRefusesWhatIsTheTenants(t *testing.T) {
	for _, o := range []Options{
		{Bootstrap: os.Stdin}, {Password: "x"}, {Identity: &Identity{}}, {Allow: []string{"a:1"}},
		{Forwards: []string{"x"}}, {Upstreams: []string{"x"}}, {Kept: true}, {Outlive: true},
	} {
		_, err := NewPool(ctx(t), PoolOptions{Options: o, Size: 1})
		assert.Error(t, err, "%+v", o)
	}
	_, err := NewPool(ctx(t), PoolOptions{Size: 0})
	assert.Error(t, err)
}

func TestAPoolPassesAClaimsVolumesThrough(t *testing.T) {
	p, log, _ := fakePool(t, PoolOptions{Size: 1}, false)
	log.wait(t, PoolRefillWarm, 1)
	host := t.TempDir()
	s, info, err := p.Claim(ctx(t), ClaimRequest{Bootstrap: tenantBoot, Volumes: []api.VolumeSpec{{Guest: "/environment", Host: host}}})
	require.NoError(t, err)
	assert.True(t, info.Hit)
	var got []api.VolumeSpec
	require.NoError(t, json.Unmarshal([]byte(logOf(t, s, "fake/volumes")), &got))
	assert.Equal(t, []api.VolumeSpec{{Guest: "/environment", Host: host}}, got)
	require.NoError(t, s.Stop(ctx(t)))
}

func TestAClaimWhoseVolumesTheProviderCannotMountLeavesThePoolAsItWas(t *testing.T) {
	t.Setenv("FAKE_VOLUMES", "unsupported")
	p, log, _ := fakePool(t, PoolOptions{Size: 2, MaxBoots: 2}, false)
	log.wait(t, PoolRefillWarm, 2)
	_, info, err := p.Claim(ctx(t), ClaimRequest{Bootstrap: tenantBoot, Volumes: []api.VolumeSpec{{Guest: "/home", Host: "/srv/home"}}})
	assert.Equal(t, api.AnswerUnsupported, Code(err))
	assert.True(t, info.Hit)
	assert.Equal(t, 2, p.Warm(), "the refused sandbox is back, the other never tried")
	assert.Equal(t, 2, log.count(PoolRefillStarted), "nothing was used up")
	assert.Zero(t, log.count(PoolFailed))
	assert.Equal(t, 1, log.count(PoolHit))

	s, info, err := p.Claim(ctx(t), ClaimRequest{Bootstrap: tenantBoot})
	require.NoError(t, err)
	assert.True(t, info.Hit)
	require.NoError(t, s.Stop(ctx(t)))
}
