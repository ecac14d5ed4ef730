package shimcli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/host/control"
	"github.com/oac/sandbox-agent/host/egress"
	"github.com/oac/sandbox-agent/host/events"
	"github.com/oac/sandbox-agent/host/provider"
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

func (failingProvider) Name() string                { return "failing" }
func (failingProvider) Check(context.Context) error { return nil }
func (failingProvider) Create(context.Context, provider.Spec) (provider.Instance, error) {
	return nil, errors.New("no runtime here")
}

func TestAFailedStartExitsWithItsCodesStatusAndAttemptedEvents(t *testing.T) {
	Providers["failing-test"] = func(ProviderFlags) provider.Provider { return failingProvider{} }
	defer delete(Providers, "failing-test")
	var stdout, stderr bytes.Buffer
	code := Main([]string{"run", "--provider", "failing-test", "--name", "x", "--agent", "/nonexistent"}, nil, &stdout, &stderr)
	assert.Equal(t, events.FailureOf(events.CodeRuntimeFailed).Exit, code)
	assert.Contains(t, stderr.String(), "oac-shim: create failing sandbox: no runtime here")
	var states []events.Event
	for _, l := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		var e events.Event
		require.NoError(t, json.Unmarshal([]byte(l), &e))
		if e.Event == events.KindState {
			states = append(states, e)
		}
	}
	require.Len(t, states, 2)
	assert.Equal(t, "creating sandbox", states[0].Message, "the first start is reported by the sandbox")
	assert.Equal(t, events.StateFailed, states[1].State)
	assert.Equal(t, events.CodeRuntimeFailed, states[1].Code)
	for _, e := range states {
		assert.Equal(t, uint64(1), e.Attempt)
	}
}

func TestControlStdinAnswersShareTheEventStreamAndEndWithTheShim(t *testing.T) {
	// The provider never creates anything: the shim fails at once while
	// the stdin reader is still running; nothing is written after Main
	// returned (the race detector watches the buffer).
	Providers["failing-test"] = func(ProviderFlags) provider.Provider { return failingProvider{} }
	defer delete(Providers, "failing-test")
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
	assert.Equal(t, events.FailureOf(events.CodeRuntimeFailed).Exit, code)
	r.Close()
	for _, l := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		assert.True(t, json.Valid([]byte(l)), l)
	}
}

func newTestShim(t *testing.T) (*shim, *bytes.Buffer) {
	t.Helper()
	var out bytes.Buffer
	f, code := parseRunFlags([]string{"--name", "unit"}, &out)
	require.Zero(t, code)
	b := egress.New(egress.Config{Policy: mustPolicy(t)})
	s := newShim(f, events.NewJSONLines(&out), slog.New(slog.DiscardHandler), b)
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
	res, err := s.Handle(ctx, control.Command{Cmd: control.CmdStatus})
	require.NoError(t, err)
	st := res.(control.StatusResult)
	assert.Equal(t, "sandbox:unit", st.ServerID)
	assert.Equal(t, "stopped", st.State)
	assert.False(t, st.GuestConnected)
	assert.Equal(t, []string{}, st.Egress)

	res, err = s.Handle(ctx, control.Command{Cmd: control.CmdSetPolicy, Allow: []string{"a.example.com:443"}})
	require.NoError(t, err)
	assert.Equal(t, []string{"a.example.com:443"}, res.(control.PolicyResult).Egress)
	assert.Equal(t, []string{"a.example.com:443"}, s.broker.Policy().Rules())
	_, err = s.Handle(ctx, control.Command{Cmd: control.CmdSetPolicy, Allow: []string{"0.0.0.0/0:443"}})
	assert.Error(t, err)
	assert.Equal(t, []string{"a.example.com:443"}, s.broker.Policy().Rules(), "a refused policy keeps the old one")
	assert.Contains(t, out.String(), `"event":"egress_policy","schema_version":1,"message":"egress policy replaced by a control command`)
	assert.Contains(t, out.String(), "policy replacement refused, previous policy kept")

	res, err = s.Handle(ctx, control.Command{Cmd: control.CmdAddForward, Listen: "127.0.0.1:0", GuestPort: 4096})
	require.NoError(t, err)
	fr := res.(control.ForwardResult)
	assert.Equal(t, "http://"+fr.Listen, fr.URL)
	c, err := net.Dial("tcp", fr.Listen)
	require.NoError(t, err, "listening")
	c.Close()
	_, err = s.Handle(ctx, control.Command{Cmd: control.CmdRemoveForward, Listen: fr.Listen})
	require.NoError(t, err)
	_, err = s.Handle(ctx, control.Command{Cmd: control.CmdRemoveForward, Listen: fr.Listen})
	assert.Error(t, err)

	_, err = s.Handle(ctx, control.Command{Cmd: control.CmdPushTime})
	assert.EqualError(t, err, "no guest is connected")

	_, err = s.Handle(ctx, control.Command{Cmd: control.CmdStop})
	require.NoError(t, err)
	_, err = s.Handle(ctx, control.Command{Cmd: control.CmdStart})
	assert.EqualError(t, err, "the shim is stopping", "no start once a stop was asked for")
}
