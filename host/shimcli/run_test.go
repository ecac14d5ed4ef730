package shimcli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/egress"
	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/sandbox"
)

func TestRunUsageErrorsForControlAndForwardFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		err  string
	}{
		{[]string{"run", "--name", "x", "--control", "socket"}, `--control takes "stdin"`},
		{[]string{"run", "--name", "x", "--forward", "0.0.0.0:80=4096"}, "only host loopback"},
		{[]string{"run", "--name", "x", "--forward", "127.0.0.1:80"}, "LISTEN=GUESTPORT"},
		{[]string{"run", "--name", "x", "--forward-max-streams", "0"}, "--forward-max-streams"},
		{[]string{"run", "--name", "x", "--tenant", "a"}, "go together"},
	} {
		var stdout, stderr bytes.Buffer
		assert.Equal(t, 2, Main(tc.args, nil, &stdout, &stderr), tc.args)
		assert.Contains(t, stderr.String(), tc.err, tc.args)
	}
}

// failingProvider fails every Create.
type failingProvider struct{}

func (failingProvider) Name() string                        { return "failing" }
func (failingProvider) Capabilities() provider.Capabilities { return provider.Capabilities{} }
func (failingProvider) Check(context.Context) error         { return nil }
func (failingProvider) Create(context.Context, provider.Spec) (provider.Instance, error) {
	return nil, errors.New("no runtime here")
}

// registerFailing registers failingProvider as provider failing-test for
// the test.
func registerFailing(t *testing.T) {
	provider.Register(provider.Driver[struct{}]{Name: "failing-test", New: func(*struct{}) provider.Provider { return failingProvider{} }})
	t.Cleanup(func() { provider.Unregister("failing-test") })
}

func TestAFailedStartExitsWithItsCodesStatusAndAttemptedEvents(t *testing.T) {
	registerFailing(t)
	var stdout, stderr bytes.Buffer
	code := Main([]string{"run", "--provider", "failing-test", "--name", "x", "--agent", "/nonexistent"}, nil, &stdout, &stderr)
	assert.Equal(t, api.FailureOf(api.CodeRuntimeFailed).Exit, code)
	assert.Contains(t, stderr.String(), "oac-shim: create failing sandbox: no runtime here")
	var states []api.Event
	for _, l := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		var e api.Event
		require.NoError(t, json.Unmarshal([]byte(l), &e))
		if e.Event == api.KindState {
			states = append(states, e)
		}
	}
	require.Len(t, states, 2)
	assert.Equal(t, "creating sandbox", states[0].Message, "the first start is reported by the sandbox")
	assert.Equal(t, api.StateFailed, states[1].State)
	assert.Equal(t, api.CodeRuntimeFailed, states[1].Code)
	for _, e := range states {
		assert.Equal(t, uint64(1), e.Attempt)
	}
}

func TestControlStdinAnswersShareTheEventStreamAndEndWithTheShim(t *testing.T) {
	// The provider never creates anything: the shim fails at once while
	// the stdin reader is still running; nothing is written after Main
	// returned (the race detector watches the buffer).
	registerFailing(t)
	var stdout, stderr bytes.Buffer
	r, w := io.Pipe()
	defer w.Close()
	go func() {
		for i := 0; i < 100; i++ {
			if _, err := w.Write([]byte(`{"id":"1","cmd":"status"}` + "\n")); err != nil {
				return
			}
		}
	}()
	code := Main([]string{"run", "--provider", "failing-test", "--name", "x", "--agent", "/nonexistent", "--control", "stdin"}, r, &stdout, &stderr)
	assert.Equal(t, api.FailureOf(api.CodeRuntimeFailed).Exit, code)
	r.Close()
	for _, l := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		assert.True(t, json.Valid([]byte(l)), l)
	}
}

func newTestShim(t *testing.T) (*shim, *bytes.Buffer) {
	t.Helper()
	var out bytes.Buffer
	f, code := parseRunFlags("run", []string{"--name", "unit"}, &out)
	require.Zero(t, code)
	b := egress.New(egress.Config{Policy: mustPolicy(t)})
	s := newShim(f, api.NewJSONLines(&out), slog.New(slog.DiscardHandler), b)
	s.broker = b
	t.Cleanup(s.fwd.Close)
	return s, &out
}

func mustPolicy(t *testing.T) *egress.Policy {
	p, err := egress.ParsePolicy(nil, nil)
	require.NoError(t, err)
	return p
}

func TestHandlerStatusPolicyForwardsAndTime(t *testing.T) {
	s, out := newTestShim(t)
	ctx := context.Background()
	res, err := s.Handle(ctx, api.Command{Cmd: api.CmdStatus})
	require.NoError(t, err)
	st := res.(api.StatusResult)
	assert.Equal(t, "sandbox:unit", st.ServerID)
	assert.Equal(t, api.StateStopped, st.State)
	assert.False(t, st.GuestConnected)
	assert.Equal(t, []string{}, st.Egress)

	res, err = s.Handle(ctx, api.Command{Cmd: api.CmdSetPolicy, Allow: []string{"a.example.com:443"}})
	require.NoError(t, err)
	assert.Equal(t, []string{"a.example.com:443"}, res.(api.PolicyResult).Egress)
	assert.Equal(t, []string{"a.example.com:443"}, s.broker.Policy().Rules())
	_, err = s.Handle(ctx, api.Command{Cmd: api.CmdSetPolicy, Allow: []string{"0.0.0.0/0:443"}})
	assert.Error(t, err)
	assert.Equal(t, []string{"a.example.com:443"}, s.broker.Policy().Rules(), "a refused policy keeps the old one")
	assert.Contains(t, out.String(), `"event":"egress_policy","schema_version":`+strconv.Itoa(api.SchemaVersion)+`,"seq":1,"message":"egress policy replaced by a control command`)
	assert.Contains(t, out.String(), "policy replacement refused, previous policy kept")

	res, err = s.Handle(ctx, api.Command{Cmd: api.CmdAddForward, Listen: "127.0.0.1:0", GuestPort: 4096})
	require.NoError(t, err)
	fr := res.(api.ForwardResult)
	assert.Equal(t, "http://"+fr.Listen, fr.URL)
	c, err := net.Dial("tcp", fr.Listen)
	require.NoError(t, err, "listening")
	c.Close()
	_, err = s.Handle(ctx, api.Command{Cmd: api.CmdRemoveForward, Listen: fr.Listen})
	require.NoError(t, err)
	_, err = s.Handle(ctx, api.Command{Cmd: api.CmdRemoveForward, Listen: fr.Listen})
	assert.Error(t, err)

	_, err = s.Handle(ctx, api.Command{Cmd: api.CmdPushTime})
	assert.EqualError(t, err, "no guest is connected")

	_, err = s.Handle(ctx, api.Command{Cmd: api.CmdStop})
	require.NoError(t, err)
	_, err = s.Handle(ctx, api.Command{Cmd: api.CmdStart})
	assert.EqualError(t, err, "the shim is stopping", "no start once a stop was asked for")
}

// resettingProvider fails every Create and records its resets.
type resettingProvider struct {
	failingProvider
	mu     sync.Mutex
	resets []string
}

func (p *resettingProvider) Reset(_ context.Context, name string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.resets = append(p.resets, name)
	return nil
}

func TestResetRemovesWhatTheProviderLeftBeforeTheFreshStart(t *testing.T) {
	s, _ := newTestShim(t)
	p := &resettingProvider{}
	s.base = sandbox.Config{Name: "unit", Provider: p, AgentPath: "/nonexistent", Log: slog.New(slog.DiscardHandler)}
	ctx := context.Background()
	res, err := s.Handle(ctx, api.Command{Cmd: api.CmdStart})
	require.NoError(t, err)
	assert.Equal(t, uint64(1), res.(api.StartResult).Attempt)
	res, err = s.Handle(ctx, api.Command{Cmd: api.CmdReset})
	require.NoError(t, err)
	assert.Equal(t, uint64(2), res.(api.StartResult).Attempt)
	s.ctrl.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	assert.Equal(t, []string{"unit"}, p.resets, "a start does not reset; a reset does, once")
}

func TestHandlerErrorsCarryTheirAnswerCodes(t *testing.T) {
	s, _ := newTestShim(t)
	ctx := context.Background()
	code := func(c api.Command) string {
		t.Helper()
		_, err := s.Handle(ctx, c)
		require.Error(t, err, c.Cmd)
		return api.AnswerCode(err)
	}
	assert.Equal(t, api.AnswerNotReady, code(api.Command{Cmd: api.CmdPushTime}), "no guest is connected")
	assert.Equal(t, api.AnswerInvalidArgument, code(api.Command{Cmd: api.CmdSetPolicy, Allow: []string{"0.0.0.0/0:443"}}))
	assert.Equal(t, api.AnswerInvalidArgument, code(api.Command{Cmd: api.CmdAddForward, Listen: "0.0.0.0:80", GuestPort: 4096}), "only loopback")
	assert.Equal(t, api.AnswerNotFound, code(api.Command{Cmd: api.CmdRemoveForward, Listen: "127.0.0.1:1"}))
	res, err := s.Handle(ctx, api.Command{Cmd: api.CmdAddForward, Listen: "127.0.0.1:0", GuestPort: 4096})
	require.NoError(t, err)
	listen := res.(api.ForwardResult).Listen
	assert.Equal(t, api.AnswerConflict, code(api.Command{Cmd: api.CmdAddForward, Listen: listen, GuestPort: 4096}))
	assert.Equal(t, api.AnswerUnknownCommand, code(api.Command{Cmd: "bogus"}))
	_, err = s.Handle(ctx, api.Command{Cmd: api.CmdStop})
	require.NoError(t, err)
	assert.Equal(t, api.AnswerStopping, code(api.Command{Cmd: api.CmdStart}))
	assert.Equal(t, api.AnswerStopping, code(api.Command{Cmd: api.CmdReset}))
	s.fwd.Close()
	assert.Equal(t, api.AnswerStopping, code(api.Command{Cmd: api.CmdAddForward, Listen: "127.0.0.1:0", GuestPort: 4096}), "forwards are closed")
}
