package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/host/apiserver"
)

// The test binary doubles as a fake oac-shim (FAKE_SHIM=ok or fail): it
// speaks the events and the control API on stdio without any sandbox.
func TestMain(m *testing.M) {
	switch os.Getenv("FAKE_SHIM") {
	case "ok", "fail":
		os.Exit(fakeShim(os.Getenv("FAKE_SHIM")))
	case "short":
		os.Exit(fakeShort(os.Args[1:]))
	}
	goleak.VerifyTestMain(m)
}

func fakeShim(mode string) int {
	enc := json.NewEncoder(os.Stdout)
	var mu sync.Mutex
	out := func(v any) { mu.Lock(); _ = enc.Encode(v); mu.Unlock() }
	state := func(st api.State, msg, url string, attempt uint64) {
		out(api.Event{Time: time.Now().UTC(), Sandbox: "fake", Event: api.KindState, State: st, Message: msg, URL: url, Attempt: attempt})
	}
	attempt := uint64(1)
	state("starting", "start requested", "", attempt)
	if mode == "fail" {
		out(api.Event{Time: time.Now().UTC(), Sandbox: "fake", Event: api.KindState, State: "failed",
			Message: "guest not ready within 1s", Code: api.CodeBootTimeout, Attempt: attempt})
		fmt.Fprintln(os.Stderr, "oac-shim: guest not ready within 1s")
		return api.FailureOf(api.CodeBootTimeout).Exit
	}
	state("ready", "guest ready", "http://127.0.0.1:4096", attempt)
	srv := &apiserver.Server{Sandbox: "fake", Handler: apiserver.HandlerFunc(func(_ context.Context, c api.Command) (any, error) {
		switch c.Cmd {
		case api.CmdStatus:
			return api.StatusResult{Status: api.Status{ServerID: "sandbox:fake", State: "ready", Attempt: attempt}, Forwards: []api.ForwardInfo{}}, nil
		case api.CmdAddForward:
			return api.ForwardResult{ForwardInfo: api.ForwardInfo{Listen: "127.0.0.1:5555", GuestPort: c.GuestPort}, URL: "http://127.0.0.1:5555"}, nil
		case api.CmdStart:
			attempt++
			go func(a uint64) { state("starting", "start requested", "", a); state("ready", "guest ready", "", a) }(attempt)
			return api.StartResult{Attempt: attempt}, nil
		case api.CmdStop:
			go func() {
				time.Sleep(10 * time.Millisecond)
				state("stopped", "stopped: stop command", "", attempt)
				os.Exit(0)
			}()
			return nil, nil
		}
		return nil, api.Refuse(api.AnswerUnsupported, errors.New("the guest does not support this"))
	})}
	_ = srv.ServeLines(context.Background(), bufio.NewReader(os.Stdin), func(a api.Answer) error { out(a); return nil })
	state("stopped", "stopped: control input closed", "", attempt)
	return 0
}

func start(t *testing.T, mode string, onEvent func(api.Event)) *Shim {
	t.Helper()
	s, err := Start(context.Background(), Options{Shim: os.Args[0], Name: "fake", Env: append(os.Environ(), "FAKE_SHIM="+mode), OnEvent: onEvent})
	require.NoError(t, err)
	return s
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestDriveAShimFromStartToReadyToForwardToStop(t *testing.T) {
	var mu sync.Mutex
	var seen []api.State
	s := start(t, "ok", func(e api.Event) { mu.Lock(); seen = append(seen, e.State); mu.Unlock() })
	ready, err := s.WaitState(ctx(t), api.StateReady)
	require.NoError(t, err)
	assert.Equal(t, "http://127.0.0.1:4096", ready.URL)

	st, err := s.Status(ctx(t))
	require.NoError(t, err)
	assert.Equal(t, "sandbox:fake", st.ServerID)
	assert.Equal(t, api.StateReady, st.State)

	fw, err := s.AddForward(ctx(t), "127.0.0.1:0", 4096)
	require.NoError(t, err)
	assert.Equal(t, "http://127.0.0.1:5555", fw.URL)
	assert.Equal(t, 4096, fw.GuestPort)

	err = s.PushTime(ctx(t))
	assert.EqualError(t, err, "push_time: the guest does not support this")
	assert.Equal(t, api.AnswerUnsupported, api.AnswerCode(err), "the answer's code travels with the error")

	a, err := s.Restart(ctx(t))
	require.NoError(t, err)
	assert.Equal(t, uint64(2), a)
	_, err = s.WaitEvent(ctx(t), func(e api.Event) bool { return e.State == api.StateReady && e.Attempt == 2 })
	require.NoError(t, err)

	require.NoError(t, s.Stop(ctx(t)))
	last := s.Events()[len(s.Events())-1]
	assert.Equal(t, api.StateStopped, last.State)
	mu.Lock()
	assert.Equal(t, []api.State{"starting", "ready", "starting", "ready", "stopped"}, seen)
	mu.Unlock()
	_, err = s.Status(ctx(t))
	assert.ErrorIs(t, err, ErrExited)
}

func TestAFailedSandboxIsAnErrorWithItsCodeAndExitStatus(t *testing.T) {
	s := start(t, "fail", nil)
	_, err := s.WaitState(ctx(t), api.StateReady)
	assert.EqualError(t, err, "sandbox failed (boot_timeout): guest not ready within 1s")
	var fe *FailedError
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, api.CodeBootTimeout, fe.Code)
	err = s.Wait()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, api.FailureOf(api.CodeBootTimeout).Exit, ee.ExitCode())
}

func TestClosingStdinStopsTheShim(t *testing.T) {
	s := start(t, "ok", nil)
	_, err := s.WaitState(ctx(t), api.StateReady)
	require.NoError(t, err)
	require.NoError(t, s.Close(10*time.Second))
	assert.Equal(t, "stopped: control input closed", s.Events()[len(s.Events())-1].Message)
	_, err = s.WaitState(ctx(t), "never")
	assert.ErrorIs(t, err, ErrExited)
}

func TestStartNeedsAName(t *testing.T) {
	_, err := Start(context.Background(), Options{})
	assert.Error(t, err)
	_, err = Start(context.Background(), Options{Name: "x", Shim: "/nonexistent/oac-shim"})
	assert.Error(t, err)
}
