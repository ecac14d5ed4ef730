package sandbox

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/egress"
	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/internal/yamux"
	"github.com/oac/sandbox-agent/protocol"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction(egress.WatcherFunction))
}

// fakeProvider hands the sandbox one end of a net.Pipe; the test plays the
// guest on the other end.
type fakeProvider struct {
	guest   chan net.Conn
	created int
	inst    *fakeInstance
	// stderr is where the runtime's output goes (Spec.Stderr).
	stderr io.Writer
}

func newFakeProvider() *fakeProvider { return &fakeProvider{guest: make(chan net.Conn, 1)} }

func (p *fakeProvider) Name() string                        { return "fake" }
func (p *fakeProvider) Capabilities() provider.Capabilities { return provider.Capabilities{} }
func (p *fakeProvider) Check(context.Context) error         { return nil }
func (p *fakeProvider) Create(_ context.Context, s provider.Spec) (provider.Instance, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	p.created++
	p.stderr = s.Stderr
	p.inst = &fakeInstance{p: p, done: make(chan struct{})}
	return p.inst, nil
}

type fakeInstance struct {
	p         *fakeProvider
	done      chan struct{}
	once      sync.Once
	host      net.Conn
	destroyed bool
}

func (i *fakeInstance) Start(context.Context) error {
	host, guest := net.Pipe()
	i.host = host
	i.p.guest <- guest
	return nil
}
func (i *fakeInstance) Accept(ctx context.Context) (net.Conn, error) { return i.host, nil }
func (i *fakeInstance) Done() <-chan struct{}                        { return i.done }
func (i *fakeInstance) Err() error                                   { return errors.New("fake runtime exited") }
func (i *fakeInstance) Kill() error                                  { i.once.Do(func() { close(i.done) }); return nil }
func (i *fakeInstance) Destroy() error                               { i.destroyed = true; return i.Kill() }

// recorder collects events.
type recorder struct {
	mu sync.Mutex
	ev []api.Event
	ch chan api.Event
}

func newRecorder() *recorder { return &recorder{ch: make(chan api.Event, 4096)} }
func (r *recorder) Emit(e api.Event) {
	r.mu.Lock()
	r.ev = append(r.ev, e)
	r.mu.Unlock()
	select {
	case r.ch <- e:
	default:
	}
}

func (r *recorder) waitState(t *testing.T, state api.State) api.Event {
	t.Helper()
	for {
		select {
		case e := <-r.ch:
			if e.Event == api.KindState && e.State == state {
				return e
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no %s state event", state)
		}
	}
}

// fakeGuest is the guest end of a session, driven by the test.
type fakeGuest struct {
	p    *fakeProvider
	sess *yamux.Session
	ctl  *protocol.Control
	boot bootstrap.Bootstrap
}

func connectGuest(t *testing.T, p *fakeProvider) *fakeGuest {
	t.Helper()
	conn := <-p.guest
	sess, err := yamux.Client(conn, protocol.MuxConfig(nil))
	require.NoError(t, err)
	t.Cleanup(func() { sess.Close() })
	ctl, _, err := protocol.GuestHandshake(sess, protocol.Hello{MinVersion: 1, MaxVersion: 1, AgentVersion: "fake", PID: 1}, 5*time.Second)
	require.NoError(t, err)
	g := &fakeGuest{p: p, sess: sess, ctl: ctl}
	require.NoError(t, ctl.RecvMessage(protocol.TypeBootstrap, &g.boot))
	return g
}

// exit ends the guest like a PID 1 that exits: the connection closes and
// the runtime is gone.
func (g *fakeGuest) exit() {
	g.sess.Close()
	_ = g.p.inst.Kill()
}

func (g *fakeGuest) send(t *testing.T, st protocol.State) {
	t.Helper()
	require.NoError(t, g.ctl.Send(protocol.TypeState, st))
}

type result struct{ err error }

func runSandbox(t *testing.T, cfg Config) (context.CancelCauseFunc, chan result) {
	t.Helper()
	ctx, cancel := context.WithCancelCause(context.Background())
	t.Cleanup(func() { cancel(nil) })
	if cfg.Name == "" {
		cfg.Name = "unit"
	}
	cfg.AgentPath = "/nonexistent/oac-guest"
	done := make(chan result, 1)
	go func() { done <- result{Run(ctx, cfg)} }()
	return cancel, done
}

func wait(t *testing.T, done chan result) error {
	t.Helper()
	select {
	case r := <-done:
		return r.err
	case <-time.After(15 * time.Second):
		t.Fatal("sandbox.Run did not return")
		return nil
	}
}

func TestReadyThenOrderlyStopOnCancel(t *testing.T) {
	p, rec := newFakeProvider(), newRecorder()
	grace := bootstrap.Duration(2 * time.Second)
	cancel, done := runSandbox(t, Config{Provider: p, Events: rec, Bootstrap: &bootstrap.Bootstrap{Version: 1, StopGrace: &grace}})
	g := connectGuest(t, p)
	assert.Equal(t, bootstrap.Duration(2*time.Second), *g.boot.StopGrace, "the bootstrap reaches the guest as given")
	g.send(t, protocol.State{State: protocol.StateStarting})
	g.send(t, protocol.State{State: protocol.StateReady})
	rec.waitState(t, api.StateReady)

	cancel(errors.New("operator asked"))
	var sd protocol.Shutdown
	require.NoError(t, g.ctl.RecvMessage(protocol.TypeShutdown, &sd))
	assert.Equal(t, int64(2000), sd.GraceMS)
	assert.Equal(t, "operator asked", sd.Reason)
	// The host closes the session as soon as it has read "stopped", so
	// yamux may report the shutdown to this last write although it went
	// out: its error says nothing here.
	_ = g.ctl.Send(protocol.TypeState, protocol.State{State: protocol.StateStopped, Message: sd.Reason})
	g.exit()
	require.NoError(t, wait(t, done))
	last := rec.ev[len(rec.ev)-1]
	assert.Equal(t, api.StateStopped, last.State)
	assert.Equal(t, "stopped: operator asked", last.Message)
}

func TestInvalidBootstrapFailsBeforeTheProviderCreatesAnything(t *testing.T) {
	p, rec := newFakeProvider(), newRecorder()
	_, done := runSandbox(t, Config{Provider: p, Events: rec, Bootstrap: &bootstrap.Bootstrap{Version: 7}})
	err := wait(t, done)
	require.ErrorIs(t, err, bootstrap.ErrVersion)
	assert.Equal(t, 0, p.created)
	require.Len(t, rec.ev, 1)
	assert.Equal(t, api.StateFailed, rec.ev[0].State)
}

func TestInvalidNameFailsBeforeTheProviderCreatesAnything(t *testing.T) {
	p, rec := newFakeProvider(), newRecorder()
	_, done := runSandbox(t, Config{Name: "../etc", Provider: p, Events: rec})
	require.ErrorIs(t, wait(t, done), provider.ErrInvalidSpec)
	assert.Equal(t, 0, p.created)
}

func TestAKeptSandboxOfAProviderThatCannotKeepIsRefusedBeforeItCreatesAnything(t *testing.T) {
	p, rec := newFakeProvider(), newRecorder()
	_, done := runSandbox(t, Config{Provider: p, Events: rec, Keep: &provider.Keep{Dir: t.TempDir()}})
	err := wait(t, done)
	require.ErrorIs(t, err, provider.ErrInvalidSpec)
	assert.ErrorContains(t, err, "the fake provider cannot keep a sandbox")
	assert.Equal(t, 0, p.created)
}

func TestAFlagTheProviderWouldIgnoreIsRefusedBeforeItCreatesAnything(t *testing.T) {
	p, rec := newFakeProvider(), newRecorder()
	_, done := runSandbox(t, Config{Provider: p, Events: rec, Install: map[string]string{"tool": "/bin/true"}})
	err := wait(t, done)
	require.ErrorIs(t, err, provider.ErrUnsupported)
	assert.ErrorContains(t, err, "nothing created: invalid sandbox spec: --install: not supported by this provider: the fake provider does not honour --install")
	assert.Equal(t, 0, p.created)
	require.Len(t, rec.ev, 1)
	assert.Equal(t, api.StateFailed, rec.ev[0].State)
}

func TestGuestReportingFailureFailsTheSandboxAndIsAskedToStop(t *testing.T) {
	p, rec := newFakeProvider(), newRecorder()
	_, done := runSandbox(t, Config{Provider: p, Events: rec})
	g := connectGuest(t, p)
	g.send(t, protocol.State{State: protocol.StateReady})
	code := 3
	g.send(t, protocol.State{State: protocol.StateFailed, Message: "daemon exited: exit status 3\x1b[31m",
		Process: &protocol.ProcessStatus{Name: "daemon", PID: 9, ExitCode: &code}})
	var sd protocol.Shutdown
	require.NoError(t, g.ctl.RecvMessage(protocol.TypeShutdown, &sd))
	g.exit()
	err := wait(t, done)
	require.Error(t, err)
	failed := rec.waitState(t, api.StateFailed)
	assert.Equal(t, "guest: daemon exited: exit status 3 [31m", failed.Message, "control characters from the guest are neutralised")
}

func TestGuestThatNeverGetsReadyFailsAtTheBootTimeout(t *testing.T) {
	p, rec := newFakeProvider(), newRecorder()
	_, done := runSandbox(t, Config{Provider: p, Events: rec, BootTimeout: 300 * time.Millisecond})
	g := connectGuest(t, p)
	g.send(t, protocol.State{State: protocol.StateStarting})
	go func() { // answer the Shutdown the host sends after failing
		var sd protocol.Shutdown
		_ = g.ctl.RecvMessage(protocol.TypeShutdown, &sd)
		g.exit()
	}()
	err := wait(t, done)
	assert.EqualError(t, err, "guest not ready within 300ms")
}

func TestGuestSendingAnUnknownStateFails(t *testing.T) {
	p, rec := newFakeProvider(), newRecorder()
	_, done := runSandbox(t, Config{Provider: p, Events: rec})
	g := connectGuest(t, p)
	g.send(t, protocol.State{State: strings.Repeat("x", 500)})
	var sd protocol.Shutdown
	require.NoError(t, g.ctl.RecvMessage(protocol.TypeShutdown, &sd))
	g.exit()
	err := wait(t, done)
	assert.ErrorContains(t, err, "guest sent an unknown state")
	assert.LessOrEqual(t, len(err.Error()), 100, "guest text in errors is bounded")
}

func TestGuestSendingAHostOnlyMessageFails(t *testing.T) {
	p, rec := newFakeProvider(), newRecorder()
	_, done := runSandbox(t, Config{Provider: p, Events: rec})
	g := connectGuest(t, p)
	require.NoError(t, g.ctl.Send(protocol.TypeBootstrap, map[string]int{"version": 1}))
	var sd protocol.Shutdown
	require.NoError(t, g.ctl.RecvMessage(protocol.TypeShutdown, &sd))
	g.exit()
	require.ErrorIs(t, wait(t, done), protocol.ErrUnexpectedType)
}

func TestLostGuestConnectionIsFailed(t *testing.T) {
	p, rec := newFakeProvider(), newRecorder()
	_, done := runSandbox(t, Config{Provider: p, Events: rec})
	g := connectGuest(t, p)
	g.send(t, protocol.State{State: protocol.StateReady})
	rec.waitState(t, api.StateReady)
	g.sess.Close() // the connection drops; the runtime is still there
	err := wait(t, done)
	assert.ErrorContains(t, err, "guest connection lost")
	assert.True(t, g.p.inst.destroyed, "the runtime is killed and destroyed")
}

func TestLogStreamsBecomeLogEventsAndLongLinesAreSplit(t *testing.T) {
	p, rec := newFakeProvider(), newRecorder()
	cancel, done := runSandbox(t, Config{Provider: p, Events: rec})
	g := connectGuest(t, p)
	g.send(t, protocol.State{State: protocol.StateReady})
	st, err := protocol.OpenStream(g.sess, protocol.StreamHeader{Kind: protocol.KindLog, Name: "daemon/stdout"})
	require.NoError(t, err)
	_, err = st.Write([]byte("hello\n" + strings.Repeat("a", MaxLogLine+10) + "\nbad \xff utf8\n"))
	require.NoError(t, err)
	st.Close()
	var lines []api.Event
	require.Eventually(t, func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		lines = lines[:0]
		for _, e := range rec.ev {
			if e.Event == api.KindLog {
				lines = append(lines, e)
			}
		}
		return len(lines) == 4
	}, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, "hello", lines[0].Line)
	assert.Equal(t, "daemon/stdout", lines[0].Stream)
	assert.Len(t, lines[1].Line, MaxLogLine)
	assert.Equal(t, strings.Repeat("a", 10), lines[2].Line)
	assert.Equal(t, "bad \uFFFD utf8", lines[3].Line)
	cancel(nil)
	var sd protocol.Shutdown
	require.NoError(t, g.ctl.RecvMessage(protocol.TypeShutdown, &sd))
	g.exit()
	require.NoError(t, wait(t, done))
}

func TestLogBudgetDropsOutputOverTheRateAndCountsIt(t *testing.T) {
	now := time.Unix(0, 0)
	b := newLogBudget(func() time.Time { return now })
	assert.True(t, b.take(LogBurst), "a full burst is allowed at once")
	assert.False(t, b.take(1), "then nothing until tokens refill")
	now = now.Add(time.Second)
	assert.True(t, b.take(LogRate), "one second refills LogRate bytes")
	assert.False(t, b.take(1))
	assert.Equal(t, int64(2), b.takeDropped())
	assert.Equal(t, int64(0), b.takeDropped(), "the count resets when reported")
}

func TestDiagWriterPrefixesCapsAndKeepsTheTail(t *testing.T) {
	var out strings.Builder
	d := newDiagWriter(&out, "[x] ")
	_, _ = d.Write([]byte("one\ntw"))
	_, _ = d.Write([]byte("o\n"))
	assert.Equal(t, "[x] one\n[x] two\n", out.String())
	assert.Equal(t, "one | two", d.lastLines())
	big := strings.Repeat("z", 1000) + "\n"
	for range MaxDiagBytes/len(big) + 10 {
		_, _ = d.Write([]byte(big))
	}
	assert.LessOrEqual(t, out.Len(), MaxDiagBytes+2000, "diagnostics are capped")
	assert.Contains(t, out.String(), "diagnostic output limit")
}

func TestGuestTextIsBoundedAndPrintable(t *testing.T) {
	assert.Equal(t, "a b", guestText("a\nb", 10))
	assert.Equal(t, "abc...", guestText("abcdef", 3))
	assert.Equal(t, "\uFFFD", guestText("\xff", 10))
	assert.Equal(t, "...", guestText("é", 1), "never cuts a rune in half")
	assert.Equal(t, " [31mred  [2J", guestText("\x1b[31mred \u009b[2J", 64), "ESC and C1 (CSI) never reach an event")
}

// A VM's serial transport is connected before the guest boots: a guest
// that speaks long after the connection (longer than the session's
// keepalive and write timeout) still gets its session, until the boot
// timeout.
func TestAGuestThatSpeaksLongAfterItsConnectionGetsItsSession(t *testing.T) {
	p, rec := newFakeProvider(), newRecorder()
	_, done := runSandbox(t, Config{Provider: p, Events: rec, BootTimeout: 10 * time.Second,
		KeepAliveInterval: 50 * time.Millisecond, ConnectionWriteTimeout: 50 * time.Millisecond})
	conn := <-p.guest
	time.Sleep(500 * time.Millisecond) // the kernel boots; nothing is said yet
	p.guest <- conn
	g := connectGuest(t, p)
	g.send(t, protocol.State{State: protocol.StateReady})
	rec.waitState(t, api.StateReady)
	g.exit()
	assert.Error(t, wait(t, done))
}

func TestTheLinkIsAllowedWithoutARuleAndTheStartingEventSaysSo(t *testing.T) {
	const (
		tenant = "11111111-1111-4111-8111-111111111111"
		env    = "22222222-2222-4222-8222-222222222222"
		alloc  = "33333333-3333-4333-8333-333333333333"
	)
	p, rec := newFakeProvider(), newRecorder()
	broker := egress.New(egress.Config{HostAddrs: egress.NewAddrSet()})
	b := &bootstrap.Bootstrap{
		Version: 1,
		Sandbox: &bootstrap.Identity{TenantID: tenant, EnvironmentID: env, AllocationID: alloc},
		SandboxIO: &bootstrap.SandboxIOSpec{Bootstrap: &bootstrap.SandboxIO{
			Version: 1, LinkURL: "wss://link.example.com/api/v1/sandbox-link", Credential: "link-credential",
			Resource: bootstrap.Resource{TenantID: tenant, EnvironmentID: env, Kind: "allocation", ID: alloc, Generation: 1},
		}},
	}
	require.NoError(t, b.Validate())
	cancel, done := runSandbox(t, Config{Provider: p, Events: rec, Bootstrap: b, Egress: broker})
	g := connectGuest(t, p)
	assert.Equal(t, []string{"link link.example.com:443"}, broker.Policy().Describe(), "no rule of the operator's, the Link's own")
	cancel(errors.New("done"))
	_ = g.ctl.Send(protocol.TypeState, protocol.State{State: protocol.StateStopped})
	g.exit()
	require.NoError(t, wait(t, done))
	var said []string
	for _, e := range rec.ev {
		if e.Event == api.KindState && e.State == api.StateStarting {
			said = append(said, e.Message)
		}
	}
	require.GreaterOrEqual(t, len(said), 2)
	assert.Equal(t, "creating sandbox", said[0])
	assert.Contains(t, said[1], "the Link is allowed by default (link link.example.com:443)")
	for _, e := range rec.ev {
		assert.NotContains(t, e.Message, "link-credential", "the Link's credential is in no event")
	}
}
