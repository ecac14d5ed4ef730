package client

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/host/apiserver"
)

// The test binary doubles as a fake oac-shim ($FAKE_SHIM says how it
// behaves): it speaks the events and the control API on stdio without any
// sandbox, reading stdin as the real one does (the password line, the
// bootstrap, then commands).
func TestMain(m *testing.M) {
	switch os.Getenv("FAKE_SHIM") {
	case "ok", "fail", "slow", "mute", "usage", "chatty", "warm":
		os.Exit(fakeShim(os.Getenv("FAKE_SHIM"), os.Args[1:]))
	case "short":
		os.Exit(fakeShort(os.Args[1:]))
	}
	goleak.VerifyTestMain(m)
}

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// fakeShim plays oac-shim run: ok gets ready and serves commands; fail
// fails with boot_timeout; slow serves commands but never gets ready; mute gets ready and
// answers no command (nor stop); usage refuses its command line as the
// real one does (status 2, no event); chatty writes $FAKE_CHATTY log
// events before ready (with $FAKE_GATE, the first, then the rest once
// that file exists); warm waits in state warm for a claim (refused with
// conflict once claimed, and one with volumes with unsupported when
// $FAKE_VOLUMES is "unsupported", as a provider that cannot mount them
// does; the volumes taken are a fake/volumes log event), then gets ready; with $FAKE_WARM_GATE, only
// once a file of its name (or "all") is in that directory, serving
// commands meanwhile; with --warm-max-age it stops at that age unclaimed,
// as the real one does.
func fakeShim(mode string, args []string) int {
	if mode == "usage" {
		fmt.Fprintln(os.Stderr, "flag provided but not defined: -frobnicate")
		fmt.Fprintln(os.Stderr, "Usage of oac-shim run: ...")
		return api.ExitUsage
	}
	sink := api.NewJSONLines(os.Stdout) // numbers the lines (seq), as the shim's
	out := func(a api.Answer) { _ = sink.Encode(a) }
	ev := func(e api.Event) {
		e.Time, e.Sandbox, e.SchemaVersion = time.Now().UTC(), "fake", api.SchemaVersion
		if v := os.Getenv("FAKE_SCHEMA"); v != "" {
			fmt.Sscan(v, &e.SchemaVersion)
		}
		sink.Emit(e)
	}
	attempt := uint64(1)
	state := func(st api.State, msg, url string, a uint64) {
		ev(api.Event{Event: api.KindState, State: st, Message: msg, URL: url, Attempt: a, PID: os.Getpid(), Username: map[bool]string{true: "runtime"}[url != ""]})
	}
	in := bufio.NewReader(os.Stdin)
	var rest io.Reader = in
	if slices.Contains(args, "--password-stdin") {
		pw, err := in.ReadString('\n')
		if err != nil {
			fmt.Fprintln(os.Stderr, "oac-shim: --password-stdin: no password line on stdin")
			return 4
		}
		ev(api.Event{Event: api.KindLog, Stream: "daemon/stdout", Line: "daemon: password-sha256=" + sha(strings.TrimSuffix(pw, "\n"))})
	}
	if i := slices.Index(args, "--bootstrap"); i >= 0 && args[i+1] == "-" {
		dec := json.NewDecoder(in)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			fmt.Fprintln(os.Stderr, "oac-shim: no bootstrap on stdin before the commands")
			return 3
		}
		ev(api.Event{Event: api.KindLog, Stream: "fake/bootstrap", Line: string(raw)})
		rest = io.MultiReader(dec.Buffered(), in)
	}
	ev(api.Event{Event: api.KindLog, Stream: "fake/argv", Line: strings.Join(args, " ")})
	state("starting", "start requested", "", attempt)
	switch mode {
	case "fail":
		ev(api.Event{Event: api.KindState, State: "failed", Message: "guest not ready within 1s", Code: api.CodeBootTimeout, Attempt: attempt})
		fmt.Fprintln(os.Stderr, "oac-shim: guest not ready within 1s")
		return api.FailureOf(api.CodeBootTimeout).Exit
	case "chatty":
		var n int
		fmt.Sscan(os.Getenv("FAKE_CHATTY"), &n)
		for i := range n {
			ev(api.Event{Event: api.KindLog, Stream: "daemon/stdout", Line: fmt.Sprint("line ", i), Attempt: attempt})
			if gate := os.Getenv("FAKE_GATE"); i == 0 && gate != "" {
				// The rest only once the test says so (it creates gate).
				for _, err := os.Stat(gate); err != nil; _, err = os.Stat(gate) {
					time.Sleep(2 * time.Millisecond)
				}
			}
		}
	}
	var mu sync.Mutex
	current := api.StateReady
	switch mode {
	case "warm":
		current = api.StateStarting
		name := args[slices.Index(args, "--name")+1]
		var maxAge time.Duration
		if i := slices.Index(args, "--warm-max-age"); i >= 0 {
			maxAge, _ = time.ParseDuration(args[i+1])
		}
		go func() {
			if gate := os.Getenv("FAKE_WARM_GATE"); gate != "" {
				for {
					_, err1 := os.Stat(filepath.Join(gate, name))
					_, err2 := os.Stat(filepath.Join(gate, "all"))
					if err1 == nil || err2 == nil {
						break
					}
					time.Sleep(2 * time.Millisecond)
				}
			}
			mu.Lock()
			if current == api.StateStarting {
				current = api.StateWarm
				state(current, "warm: guest agent connected, waiting for a claim", "", attempt)
			}
			mu.Unlock()
			if maxAge > 0 {
				time.AfterFunc(maxAge, func() {
					mu.Lock()
					defer mu.Unlock()
					if current == api.StateWarm {
						why := fmt.Sprintf("warm for its maximum age (%s) and never claimed", maxAge)
						ev(api.Event{Event: api.KindWarmExpired, Message: why, Attempt: attempt})
						state("stopped", "stopped while warm: "+why, "", attempt)
						os.Exit(0)
					}
				})
			}
		}()
	case "slow":
		current = api.StateStarting
	default:
		state("ready", "guest ready", "http://127.0.0.1:4096", attempt)
	}
	if mode == "mute" {
		_, _ = io.Copy(io.Discard, rest)
		select {} // only a kill ends it
	}
	srv := &apiserver.Server{Sandbox: "fake", Handler: apiserver.HandlerFunc(func(_ context.Context, c api.Command) (any, error) {
		switch c.Cmd {
		case api.CmdStatus:
			mu.Lock()
			defer mu.Unlock()
			return api.StatusResult{Status: api.Status{ServerID: "sandbox:fake", State: current, Attempt: attempt}, Forwards: []api.ForwardInfo{}}, nil
		case api.CmdClaim:
			mu.Lock()
			defer mu.Unlock()
			if current != api.StateWarm {
				return nil, api.Refuse(api.AnswerConflict, fmt.Errorf("the sandbox is %s, not warm", current))
			}
			if len(c.Volumes) > 0 && os.Getenv("FAKE_VOLUMES") == "unsupported" {
				return nil, api.Refuse(api.AnswerUnsupported, errors.New("this provider cannot mount a volume into a running guest"))
			}
			current, attempt = api.StateReady, attempt+1
			ev(api.Event{Event: api.KindLog, Stream: "fake/claim", Line: string(c.Bootstrap)})
			if len(c.Volumes) > 0 {
				vols, _ := json.Marshal(c.Volumes)
				ev(api.Event{Event: api.KindLog, Stream: "fake/volumes", Line: string(vols)})
			}
			res := api.ClaimResult{Attempt: attempt, Forwards: []api.ForwardResult{}, Egress: append(append([]string{}, c.Allow...), c.Upstreams...)}
			for i, f := range c.Forwards {
				l := fmt.Sprintf("127.0.0.1:%d", 6000+i)
				res.Forwards = append(res.Forwards, api.ForwardResult{ForwardInfo: api.ForwardInfo{Listen: l, GuestPort: f.GuestPort}, URL: "http://" + l})
			}
			go func(a uint64) {
				state("starting", "claimed", "", a)
				state("ready", "guest ready", "http://127.0.0.1:4096", a)
			}(attempt)
			return res, nil
		case api.CmdAddForward:
			return api.ForwardResult{ForwardInfo: api.ForwardInfo{Listen: "127.0.0.1:5555", GuestPort: c.GuestPort}, URL: "http://127.0.0.1:5555"}, nil
		case api.CmdStart:
			attempt++
			go func(a uint64) { state("starting", "start requested", "", a); state("ready", "guest ready", "", a) }(attempt)
			return api.StartResult{Attempt: attempt}, nil
		case api.CmdStop:
			mu.Lock()
			current = api.StateStopped // a warm one waiting at its gate is never warm now
			mu.Unlock()
			go func() {
				time.Sleep(10 * time.Millisecond)
				state("stopped", "stopped: stop command", "", attempt)
				os.Exit(0)
			}()
			return nil, nil
		}
		return nil, api.Refuse(api.AnswerUnsupported, errors.New("the guest does not support this"))
	})}
	_ = srv.ServeLines(context.Background(), rest, func(a api.Answer) error { out(a); return nil })
	state("stopped", "stopped: control input closed", "", attempt)
	return 0
}

func fake(mode string) Options {
	return Options{Shim: os.Args[0], Name: "fake", Env: append(os.Environ(), "FAKE_SHIM="+mode)}
}

func start(t *testing.T, mode string, onEvent func(api.Event)) *Shim {
	t.Helper()
	o := fake(mode)
	o.OnEvent = onEvent
	s, err := Start(context.Background(), o)
	require.NoError(t, err)
	t.Cleanup(s.Kill)
	return s
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

// logOf is the line of the first log event of stream.
func logOf(t *testing.T, s *Shim, stream string) string {
	t.Helper()
	e, err := s.WaitEvent(ctx(t), func(e api.Event) bool { return e.Event == api.KindLog && e.Stream == stream })
	require.NoError(t, err)
	return e.Line
}

func TestDriveAShimFromStartToReadyToForwardToStop(t *testing.T) {
	var mu sync.Mutex
	var seen []api.State
	s := start(t, "ok", func(e api.Event) {
		if e.Event == api.KindState {
			mu.Lock()
			seen = append(seen, e.State)
			mu.Unlock()
		}
	})
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

	a, err := s.Restart(ctx(t))
	require.NoError(t, err)
	assert.Equal(t, uint64(2), a)
	_, err = s.WaitEvent(ctx(t), func(e api.Event) bool { return e.State == api.StateReady && e.Attempt == 2 })
	require.NoError(t, err)

	require.NoError(t, s.Stop(ctx(t)))
	h := s.History()
	assert.Equal(t, api.StateStopped, h[len(h)-1].State)
	mu.Lock()
	assert.Equal(t, []api.State{"starting", "ready", "starting", "ready", "stopped"}, seen)
	mu.Unlock()
	_, err = s.Status(ctx(t))
	assert.ErrorIs(t, err, ErrExited)
	assert.Equal(t, "exited", Code(err))
}

func TestAWarmSandboxIsNotReadyUntilClaimedAndIsClaimedOnce(t *testing.T) {
	o := fake("warm")
	o.Args = []string{"--warm"}
	s, err := Start(context.Background(), o)
	require.NoError(t, err)
	t.Cleanup(s.Kill)
	warm, err := s.WaitState(ctx(t), api.StateWarm)
	require.NoError(t, err)
	assert.Equal(t, uint64(1), warm.Attempt)

	// Waiting for ready sees warm go by: not ready yet, not a failure.
	readyC := make(chan api.Event, 1)
	errC := make(chan error, 1)
	go func() {
		e, err := s.WaitState(ctx(t), api.StateReady)
		readyC <- e
		errC <- err
	}()
	select {
	case err := <-errC:
		t.Fatalf("WaitState(ready) returned before the claim: %v", err)
	case <-time.After(100 * time.Millisecond):
	}

	// Bad input: refused with invalid_argument by the decoder, and the
	// sandbox stays warm.
	_, err = s.Claim(ctx(t), ClaimRequest{Bootstrap: json.RawMessage(`{"version":1}`), Forwards: []api.ForwardSpec{{Listen: "127.0.0.1:0"}}})
	var ce *CommandError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, api.CmdClaim, ce.Command)
	assert.Equal(t, api.AnswerInvalidArgument, Code(err), "a forward without its guest port")
	assert.False(t, Retryable(err))
	_, err = s.Claim(ctx(t), ClaimRequest{Allow: []string{"api.example.com:443"}})
	assert.Equal(t, api.AnswerInvalidArgument, Code(err), "no bootstrap")
	st, err := s.Status(ctx(t))
	require.NoError(t, err)
	assert.Equal(t, api.StateWarm, st.State)

	res, err := s.Claim(ctx(t), ClaimRequest{
		Bootstrap: json.RawMessage(`{"version":1,"hostname":"tenant"}`),
		Allow:     []string{"api.example.com:443"},
		Forwards:  []api.ForwardSpec{{Listen: "127.0.0.1:0", GuestPort: 4096}, {Listen: "127.0.0.1:0", GuestPort: 22}},
	})
	require.NoError(t, err)
	assert.Equal(t, uint64(2), res.Attempt)
	assert.Equal(t, []string{"api.example.com:443"}, res.Egress)
	require.Len(t, res.Forwards, 2)
	assert.Equal(t, 22, res.Forwards[1].GuestPort)
	assert.Equal(t, `{"version":1,"hostname":"tenant"}`, logOf(t, s, "fake/claim"), "the bootstrap went as given")

	require.NoError(t, <-errC)
	ready := <-readyC
	assert.Equal(t, api.StateReady, ready.State)
	assert.Equal(t, res.Attempt, ready.Attempt)

	_, err = s.Claim(ctx(t), ClaimRequest{Bootstrap: json.RawMessage(`{"version":1}`)})
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, api.AnswerConflict, ce.Code, "a claimed sandbox is not warm")

	require.NoError(t, s.Stop(ctx(t)))
	var seen []api.State
	for _, e := range s.History() {
		if e.Event == api.KindState {
			seen = append(seen, e.State)
		}
	}
	assert.Equal(t, []api.State{"starting", "warm", "starting", "ready", "stopped"}, seen)
}

func TestARefusedCommandCarriesItsAnswerCodeAndWhetherARetryHelps(t *testing.T) {
	s := start(t, "ok", nil)
	err := s.PushTime(ctx(t))
	assert.EqualError(t, err, "push_time: the guest does not support this")
	var ce *CommandError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, api.AnswerUnsupported, ce.Code)
	assert.Equal(t, api.AnswerUnsupported, Code(err))
	assert.Equal(t, api.AnswerUnsupported, api.AnswerCode(err), "the api's reading of the code agrees")
	assert.False(t, Retryable(err), "unsupported never becomes supported")
	assert.True(t, (&CommandError{Code: api.AnswerNotReady}).Retryable())
}

func TestTypedOptionsBecomeFlagsWithArgsLastAndThePasswordAndBootstrapGoOnStdin(t *testing.T) {
	o := fake("ok")
	o.Provider, o.Agent, o.KeepRoot = "bwrap", "/bin/oac-guest", "/keep"
	o.SandboxIO, o.Install = "/bin/sio", []string{"d=/bin/d"}
	o.Bootstrap, o.CoreBootstrap = strings.NewReader(`{"runtime": {}}`), true
	o.Identity = &Identity{Tenant: "t", Environment: "e", Allocation: "a", AllowLoopbackLink: true}
	o.Forwards, o.Allow, o.Upstreams = []string{"127.0.0.1:0=4096"}, []string{"api.example.com:443"}, []string{"gw:443=127.0.0.1:8443"}
	o.BootTimeout, o.Timeout, o.Outlive = 5*time.Second, time.Minute, true
	o.Args = []string{"--debug"}
	s, err := Start(context.Background(), o)
	require.NoError(t, err)
	defer s.Kill()
	assert.Equal(t, "run --name fake --control stdin --password-stdin --keep-root /keep --provider bwrap --agent /bin/oac-guest "+
		"--sandbox-io /bin/sio --install d=/bin/d --bootstrap - --bootstrap-format core --tenant t --environment e --allocation a "+
		"--allow-loopback-link --forward 127.0.0.1:0=4096 --allow api.example.com:443 --upstream gw:443=127.0.0.1:8443 "+
		"--boot-timeout 5s --timeout 1m0s --outlive-parent --debug", logOf(t, s, "fake/argv"))
	assert.Equal(t, `{"runtime": {}}`, logOf(t, s, "fake/bootstrap"), "the bootstrap came after the password line")
	assert.Equal(t, "daemon: password-sha256="+sha(s.Password()), logOf(t, s, "daemon/stdout"))
	assert.Len(t, s.Password(), 43, "32 random bytes, base64url")
	st, err := s.Status(ctx(t))
	require.NoError(t, err, "commands follow the bootstrap")
	assert.Equal(t, "sandbox:fake", st.ServerID)

	k := Options{Shim: os.Args[0], Name: "work", Kept: true, Password: "a-password-of-the-callers", Env: o.Env, Bootstrap: strings.NewReader("{}")}
	s2, err := Start(context.Background(), k)
	require.NoError(t, err)
	defer s2.Kill()
	assert.Equal(t, "start --name work --control stdin --password-stdin --bootstrap -", logOf(t, s2, "fake/argv"))
	assert.Equal(t, "a-password-of-the-callers", s2.Password())
	assert.Equal(t, "daemon: password-sha256="+sha("a-password-of-the-callers"), logOf(t, s2, "daemon/stdout"))
	assert.NotEqual(t, s.Password(), NewPassword())

	// No bootstrap: no daemon, no password; stdin carries commands only.
	s3 := start(t, "ok", nil)
	assert.Equal(t, "run --name fake --control stdin", logOf(t, s3, "fake/argv"))
	assert.Empty(t, s3.Password())
	_, err = s3.Status(ctx(t))
	require.NoError(t, err)
}

func TestWhatCannotWorkIsRefusedBeforeAnythingIsLaunched(t *testing.T) {
	never := Options{Shim: "/nonexistent/oac-shim", Name: "x"}
	cases := map[string]func(o *Options){
		"no name":                func(o *Options) { o.Name = "" },
		"short password":         func(o *Options) { o.Password, o.Bootstrap = "short", strings.NewReader("{}") },
		"password with space":    func(o *Options) { o.Password, o.Bootstrap = "sixteen chars or more", strings.NewReader("{}") },
		"password, no bootstrap": func(o *Options) { o.Password = "a-password-of-the-callers" },
		"huge bootstrap":         func(o *Options) { o.Bootstrap = strings.NewReader(strings.Repeat(" ", maxBootstrap+1)) },
		"kept with provider":     func(o *Options) { o.Kept, o.Provider = true, "bwrap" },
		"bootstrap read fails": func(o *Options) {
			o.Bootstrap = io.MultiReader(strings.NewReader("{"), iotestErr{})
		},
	}
	for name, change := range cases {
		t.Run(name, func(t *testing.T) {
			o := never
			change(&o)
			_, err := Start(context.Background(), o)
			require.Error(t, err)
			assert.NotErrorIs(t, err, fs.ErrNotExist, "refused before the binary was looked for")
			assert.NotContains(t, err.Error(), "sixteen chars", "a password is never in an error")
		})
	}
	_, err := Start(context.Background(), never)
	assert.ErrorIs(t, err, fs.ErrNotExist, "a wrong binary path is the OS's own error")
	assert.Contains(t, err.Error(), "give Options.Shim, set OAC_SHIM or put oac-shim in PATH")
	_, err = Start(context.Background(), Options{Shim: "oac-shim-not-in-path", Name: "x"})
	assert.ErrorIs(t, err, exec.ErrNotFound)
}

type iotestErr struct{}

func (iotestErr) Read([]byte) (int, error) { return 0, errors.New("disk on fire") }

func TestStartReadyReturnsTheReadyEventAndThePassword(t *testing.T) {
	o := fake("ok")
	o.Bootstrap = strings.NewReader(`{"version": 1}`)
	s, ready, err := StartReady(ctx(t), o)
	require.NoError(t, err)
	assert.Equal(t, "http://127.0.0.1:4096", ready.URL)
	assert.Equal(t, "runtime", ready.Username)
	assert.Equal(t, "daemon: password-sha256="+sha(s.Password()), logOf(t, s, "daemon/stdout"))
	require.NoError(t, s.Stop(ctx(t)))
}

func TestAFailedSandboxIsATypedErrorAndNothingIsLeftRunning(t *testing.T) {
	o := fake("fail")
	var pid int
	o.OnEvent = func(e api.Event) {
		if e.State == api.StateStarting {
			pid = e.PID
		}
	}
	s, _, err := StartReady(ctx(t), o)
	assert.Nil(t, s)
	assert.EqualError(t, err, "sandbox failed (boot_timeout): guest not ready within 1s")
	var fe *FailedError
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, api.CodeBootTimeout, fe.Code)
	assert.True(t, Retryable(err), "a boot timeout may pass on a less loaded host")
	assert.Equal(t, api.CodeBootTimeout, Code(err))
	assert.True(t, gone(pid), "the shim has exited and been reaped")

	s = start(t, "fail", nil)
	err = s.Wait()
	require.ErrorAs(t, err, &fe, "Wait says why too")
	assert.Equal(t, api.CodeBootTimeout, fe.Code)
}

func TestAShimThatRefusesItsCommandLineIsAnExitedErrorWithWhatItSaid(t *testing.T) {
	s, _, err := StartReady(ctx(t), fake("usage"))
	assert.Nil(t, s)
	assert.ErrorIs(t, err, ErrExited)
	var xe *ExitedError
	require.ErrorAs(t, err, &xe)
	assert.Equal(t, api.ExitUsage, xe.Status)
	assert.Equal(t, "oac-shim exited before state ready (exit status 2): flag provided but not defined: -frobnicate\nUsage of oac-shim run: ...", err.Error())
	assert.False(t, Retryable(err))
}

func TestEveryWaitEndsWithItsContext(t *testing.T) {
	short := func() context.Context {
		c, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		t.Cleanup(cancel)
		return c
	}
	t.Run("start until ready", func(t *testing.T) {
		o := fake("slow")
		var pid int
		o.OnEvent = func(e api.Event) {
			if e.State == api.StateStarting {
				pid = e.PID
			}
		}
		s, _, err := StartReady(short(), o)
		assert.Nil(t, s)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Equal(t, "timeout", Code(err))
		assert.True(t, Retryable(err))
		assert.True(t, gone(pid), "the shim was stopped and reaped")
	})
	t.Run("a command", func(t *testing.T) {
		s := start(t, "mute", nil)
		_, err := s.WaitState(ctx(t), api.StateReady)
		require.NoError(t, err)
		_, err = s.Status(short())
		assert.ErrorIs(t, err, context.DeadlineExceeded)
	})
	t.Run("an event", func(t *testing.T) {
		s := start(t, "slow", nil)
		_, err := s.WaitState(short(), api.StateReady)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		c, cancel := context.WithCancel(context.Background())
		cancel()
		_, err = s.WaitEvent(c, func(api.Event) bool { return false })
		assert.ErrorIs(t, err, context.Canceled)
		assert.Equal(t, "cancelled", Code(err))
	})
	t.Run("stop", func(t *testing.T) {
		s := start(t, "mute", nil)
		_, err := s.WaitState(ctx(t), api.StateReady)
		require.NoError(t, err)
		err = s.Stop(short())
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		select {
		case <-s.Done():
		default:
			t.Fatal("a stop whose context ended kills the shim")
		}
	})
}

func TestEventsIterateFromTheOldestKeptOrFromNowAndSayWhatTheyMissed(t *testing.T) {
	o := fake("chatty")
	o.Env = append(o.Env, "FAKE_CHATTY=50")
	o.History = 16
	s, err := Start(context.Background(), o)
	require.NoError(t, err)
	defer s.Kill()
	_, err = s.WaitState(ctx(t), api.StateReady)
	require.NoError(t, err)
	h := s.History()
	require.Len(t, h, 16, "the history is bounded")
	assert.Equal(t, api.StateReady, h[15].State)
	assert.Equal(t, "line 35", h[0].Line, "the oldest were dropped first")

	var got []string
	for e, err := range s.Events(ctx(t), From{}) {
		require.NoError(t, err)
		got = append(got, e.Line)
		if e.State == api.StateReady {
			break
		}
	}
	assert.Equal(t, "line 35", got[0])
	assert.Len(t, got, 16)

	// From a seq: from that event on; one the history dropped is missed.
	var seqs []uint64
	for e, err := range s.Events(ctx(t), FromSeq(h[3].Seq)) {
		require.NoError(t, err)
		seqs = append(seqs, e.Seq)
		if e.State == api.StateReady {
			break
		}
	}
	assert.Equal(t, h[3].Seq, seqs[0])
	assert.Len(t, seqs, 13)
	for e, err := range s.Events(ctx(t), FromSeq(h[0].Seq-5)) {
		var missed *MissedError
		require.ErrorAs(t, err, &missed, "the five before the oldest kept were dropped")
		assert.Equal(t, uint64(5), missed.Missed)
		_ = e
		break
	}

	// From now: the next event is the stop's.
	next, stop := iterPull(s.Events(ctx(t), FromNow()))
	defer stop()
	_, err = s.Status(ctx(t))
	require.NoError(t, err, "answers are no events")
	require.NoError(t, s.Close(10*time.Second))
	e, err, ok := next()
	require.True(t, ok)
	require.NoError(t, err)
	assert.Equal(t, "stopped: control input closed", e.Message)
	_, _, ok = next()
	assert.False(t, ok, "the iteration ends with the shim's output")

	// An iteration that falls behind is told how far: the shim writes
	// the rest of its events only once the iteration has its first.
	gate := filepath.Join(t.TempDir(), "gate")
	o.Env = append(o.Env, "FAKE_GATE="+gate)
	s2, err := Start(context.Background(), o)
	require.NoError(t, err)
	defer s2.Kill()
	first := true
	var missed *MissedError
	for e, err := range s2.Events(ctx(t), From{}) {
		if first {
			first = false
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(gate, nil, 0o600))
			_, werr := s2.WaitState(ctx(t), api.StateReady) // the history turns over meanwhile
			require.NoError(t, werr)
			continue
		}
		if errors.As(err, &missed) {
			continue
		}
		require.NoError(t, err)
		if e.State == api.StateReady {
			break
		}
	}
	require.NotNil(t, missed, "it fell behind the bounded history")
	assert.Positive(t, missed.Missed)

	c, cancel := context.WithCancel(context.Background())
	cancel()
	for _, err := range s2.Events(c, FromNow()) {
		assert.ErrorIs(t, err, context.Canceled, "an iteration waiting for an event ends with its context")
	}
}

func TestClosingStdinStopsTheShim(t *testing.T) {
	s := start(t, "ok", nil)
	_, err := s.WaitState(ctx(t), api.StateReady)
	require.NoError(t, err)
	require.NoError(t, s.Close(10*time.Second))
	h := s.History()
	assert.Equal(t, "stopped: control input closed", h[len(h)-1].Message)
	_, err = s.WaitState(ctx(t), "never")
	assert.ErrorIs(t, err, ErrExited)
}

func TestTheStderrTailKeepsWholeFirstAndLastLines(t *testing.T) {
	var tl tail
	fmt.Fprintln(&tl, "flag provided but not defined: -frobnicate")
	assert.Equal(t, "flag provided but not defined: -frobnicate", tl.String())
	for i := range 1000 {
		fmt.Fprintf(&tl, "line %d\n", i)
	}
	s := tl.String()
	assert.True(t, strings.HasPrefix(s, "flag provided but not defined: -frobnicate\nline 0\n"), "%q", s[:60])
	assert.Contains(t, s, "\n...\nline ")
	assert.True(t, strings.HasSuffix(s, "line 999"))
	assert.LessOrEqual(t, len(s), headMax+tailMax+5)
}

func TestAShimOfAnotherSchemaVersionIsRefusedAndStopped(t *testing.T) {
	o := fake("ok")
	o.Env = append(o.Env, "FAKE_SCHEMA=99")
	var pid int
	o.OnEvent = func(e api.Event) {
		if e.State == api.StateStarting {
			pid = e.PID
		}
	}
	s, _, err := StartReady(ctx(t), o)
	assert.Nil(t, s)
	var se *SchemaError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, SchemaError{Shim: 99, Client: api.SchemaVersion}, *se)
	assert.Contains(t, err.Error(), "install the oac-shim of this client's release")
	assert.True(t, gone(pid), "the shim was stopped")
}

func TestAttachRunsOacShimAttachFromWhereItIsToldAndDrivesTheSandbox(t *testing.T) {
	o := fake("ok")
	for from, want := range map[From]string{{}: "attach fake --keep-root /keep", FromNow(): "attach fake --from now --keep-root /keep", FromSeq(7): "attach fake --from 7 --keep-root /keep"} {
		s, err := Attach(context.Background(), AttachOptions{Shim: o.Shim, Name: "fake", KeepRoot: "/keep", From: from, Env: o.Env})
		require.NoError(t, err)
		assert.Equal(t, want, logOf(t, s, "fake/argv"))
		assert.Empty(t, s.Password(), "the parent that started it made the password")
		_, err = s.Status(ctx(t))
		require.NoError(t, err)
		require.NoError(t, s.Stop(ctx(t)))
	}
	_, err := Attach(context.Background(), AttachOptions{})
	assert.Error(t, err)
}

func TestTheShimIsTheOptionsThenOAC_SHIMThenPATHs(t *testing.T) {
	t.Setenv("OAC_SHIM", os.Args[0])
	o := fake("ok")
	o.Shim = ""
	s, err := Start(context.Background(), o)
	require.NoError(t, err, "found by $OAC_SHIM")
	require.NoError(t, s.Stop(ctx(t)))
	o.Shim = "/nonexistent/oac-shim"
	_, err = Start(context.Background(), o)
	assert.ErrorIs(t, err, fs.ErrNotExist, "the option comes first")
	t.Setenv("OAC_SHIM", "")
	o.Shim = ""
	t.Setenv("PATH", t.TempDir())
	_, err = Start(context.Background(), o)
	assert.ErrorIs(t, err, exec.ErrNotFound, "then oac-shim in PATH")
}

func TestAClaimCarriesItsVolumesWithRelativeHostDirectoriesMadeAbsolute(t *testing.T) {
	wd := t.TempDir()
	t.Chdir(wd)
	o := fake("warm")
	o.Args = []string{"--warm"}
	s, err := Start(context.Background(), o)
	require.NoError(t, err)
	t.Cleanup(s.Kill)
	_, err = s.WaitState(ctx(t), api.StateWarm)
	require.NoError(t, err)

	// A volume without its host directory is bad input: refused, still warm.
	_, err = s.Claim(ctx(t), ClaimRequest{Bootstrap: tenantBoot, Volumes: []api.VolumeSpec{{Guest: "/home"}}})
	assert.Equal(t, api.AnswerInvalidArgument, Code(err), "a volume without its host directory")
	st, err := s.Status(ctx(t))
	require.NoError(t, err)
	assert.Equal(t, api.StateWarm, st.State)

	env := filepath.Join(t.TempDir(), "env")
	given := []api.VolumeSpec{{Guest: "/home", Host: filepath.Join("tenant", "home")}, {Guest: "/environment", Host: env}}
	_, err = s.Claim(ctx(t), ClaimRequest{Bootstrap: tenantBoot, Volumes: given})
	require.NoError(t, err)
	var got []api.VolumeSpec
	require.NoError(t, json.Unmarshal([]byte(logOf(t, s, "fake/volumes")), &got))
	assert.Equal(t, []api.VolumeSpec{{Guest: "/home", Host: filepath.Join(wd, "tenant", "home")}, {Guest: "/environment", Host: env}}, got,
		"the shim got absolute host directories")
	assert.Equal(t, filepath.Join("tenant", "home"), given[0].Host, "the caller's request is left as given")
	_, err = s.WaitState(ctx(t), api.StateReady)
	require.NoError(t, err)
}

func TestAClaimWhoseVolumesTheProviderCannotMountLeavesTheSandboxWarm(t *testing.T) {
	t.Setenv("FAKE_VOLUMES", "unsupported")
	o := fake("warm")
	o.Args = []string{"--warm"}
	s, err := Start(context.Background(), o)
	require.NoError(t, err)
	t.Cleanup(s.Kill)
	_, err = s.WaitState(ctx(t), api.StateWarm)
	require.NoError(t, err)

	_, err = s.Claim(ctx(t), ClaimRequest{Bootstrap: tenantBoot, Volumes: []api.VolumeSpec{{Guest: "/home", Host: "/srv/home"}}})
	var ce *CommandError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, api.AnswerUnsupported, ce.Code)
	assert.False(t, Retryable(err), "the same claim fails the same way on this provider")
	st, err := s.Status(ctx(t))
	require.NoError(t, err)
	assert.Equal(t, api.StateWarm, st.State)

	res, err := s.Claim(ctx(t), ClaimRequest{Bootstrap: tenantBoot})
	require.NoError(t, err, "the same sandbox, claimed without volumes")
	assert.Equal(t, uint64(2), res.Attempt)
}
