//go:build linux

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/protocol"
)

// ctl sends one command on the control socket and returns its answer.
func ctl(t *testing.T, sock string, cmd map[string]any) map[string]any {
	t.Helper()
	c, err := net.DialTimeout("unix", sock, 5*time.Second)
	require.NoError(t, err)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(15 * time.Second))
	line, err := json.Marshal(cmd)
	require.NoError(t, err)
	_, err = c.Write(append(line, '\n'))
	require.NoError(t, err)
	reply, err := bufio.NewReader(c).ReadBytes('\n')
	require.NoError(t, err)
	validLine(t, bytes.TrimSpace(reply))
	var a map[string]any
	require.NoError(t, json.Unmarshal(reply, &a), "%s", reply)
	assert.Equal(t, "answer", a["event"])
	return a
}

// notifySocket is a stand-in for systemd's NOTIFY_SOCKET.
func notifySocket(t *testing.T) (string, func() []string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	require.NoError(t, err)
	var mu sync.Mutex
	var msgs []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			mu.Lock()
			msgs = append(msgs, string(buf[:n]))
			mu.Unlock()
		}
	}()
	t.Cleanup(func() { c.Close(); <-done })
	return path, func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), msgs...) }
}

func get(t *testing.T, client *http.Client, url, user, pass string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	if user != "" {
		req.SetBasicAuth(user, pass)
	}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The daemon stand-in reached from the host through a forward with its
// Basic auth; status, forwards and stop through the control socket; what
// systemd hears on NOTIFY_SOCKET.
func TestForwardToTheDaemonControlSocketAndSystemdNotify(t *testing.T) {
	needBwrap(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "ctl.sock")
	pwFile := filepath.Join(dir, "password")
	notifyPath, notified := notifySocket(t)
	b := contract("link.example.com")
	s := startShim(t, sandboxSpec{
		bootstrap: encode(t, b),
		env:       []string{"NOTIFY_SOCKET=" + notifyPath, "WATCHDOG_USEC=400000"},
		args: append(identityArgs(), "--password-file", pwFile,
			"--forward", "127.0.0.1:0=4096", "--control-socket", sock),
	})
	fwd := s.waitFor(func(e api.Event) bool { return e.Event == api.KindForward && e.Message == "listening" }, bootTimeout, "forward listening")
	assert.Equal(t, daemonPort, fwd.GuestPort)
	ready := s.waitState(api.StateReady, bootTimeout)
	assert.Equal(t, "http://"+fwd.Listen, ready.URL, "ready carries the host's URL of the daemon")
	assert.Equal(t, "http://127.0.0.1:4096", ready.GuestURL)
	assert.Equal(t, uint64(1), ready.Attempt)

	st, err := os.Stat(sock)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm(), "the control socket is the owner's only")

	password, err := os.ReadFile(pwFile)
	require.NoError(t, err)
	hc := &http.Client{Timeout: 10 * time.Second}
	code, body := get(t, hc, ready.URL+"/global/health", ready.Username, string(password))
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, `{"healthy":true}`, body)
	code, _ = get(t, hc, ready.URL+"/global/health", ready.Username, "wrong")
	assert.Equal(t, http.StatusUnauthorized, code, "the daemon's own Basic auth, through the forward")

	a := ctl(t, sock, map[string]any{"id": "s1", "cmd": "status"})
	assert.Equal(t, true, a["ok"], a)
	assert.Equal(t, "s1", a["id"])
	res := a["result"].(map[string]any)
	assert.Equal(t, "ready", res["state"])
	assert.Equal(t, "sandbox:"+s.name, res["server_id"])
	assert.Equal(t, ready.URL, res["url"])
	assert.Equal(t, true, res["guest_connected"])
	assert.Len(t, res["forwards"], 1)
	assert.NotContains(t, fmt.Sprint(a), string(password), "no answer carries the password")

	// A unix socket forward added at run time.
	usock := filepath.Join(dir, "daemon.sock")
	a = ctl(t, sock, map[string]any{"cmd": "add_forward", "listen": usock, "guest_port": daemonPort})
	require.Equal(t, true, a["ok"], a)
	uc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", usock)
		}}}
	code, _ = get(t, uc, "http://daemon/global/health", ready.Username, string(password))
	assert.Equal(t, http.StatusOK, code, "through the unix socket forward")
	a = ctl(t, sock, map[string]any{"cmd": "remove_forward", "listen": usock})
	assert.Equal(t, true, a["ok"], a)
	a = ctl(t, sock, map[string]any{"cmd": "push_time"})
	assert.Equal(t, false, a["ok"])
	assert.Contains(t, a["error"], "only VM guests")
	a = ctl(t, sock, map[string]any{"cmd": "status", "Cmd": "stop"})
	assert.Equal(t, false, a["ok"])
	assert.Contains(t, a["error"], `bad command: status takes no key "Cmd"`)

	a = ctl(t, sock, map[string]any{"id": "bye", "cmd": "stop"})
	assert.Equal(t, true, a["ok"], a)
	stopped := s.waitState(api.StateStopped, 15*time.Second)
	assert.Equal(t, "stopped: stop command", stopped.Message)
	assert.Equal(t, 0, s.exit(10*time.Second))
	_, err = os.Stat(sock)
	assert.True(t, os.IsNotExist(err), "the control socket is removed")

	msgs := notified()
	joined := strings.Join(msgs, "\n|")
	assert.Contains(t, msgs, "READY=1\nSTATUS=ready "+ready.URL+": "+ready.Message)
	assert.Contains(t, joined, "STATUS=starting: start requested")
	assert.Contains(t, joined, "STOPPING=1\nSTATUS=stopping: stop command")
	assert.Contains(t, msgs, "WATCHDOG=1")
	readyAt, stoppingAt := -1, -1
	for i, m := range msgs {
		if strings.HasPrefix(m, "READY=1") && readyAt < 0 {
			readyAt = i
		}
		if strings.HasPrefix(m, "STOPPING=1") {
			stoppingAt = i
		}
	}
	assert.True(t, readyAt >= 0 && stoppingAt > readyAt, "READY before STOPPING: %q", msgs)
}

// An egress policy replaced at run time through the control socket
// decides the next connection.
func TestPolicyReplacedAtRunTimeDecidesTheNextConnection(t *testing.T) {
	needBwrap(t)
	needCurl(t)
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "hello")
	}))
	defer web.Close()
	sock := filepath.Join(t.TempDir(), "ctl.sock")
	script := `n=0; while :; do n=$((n+1)); echo "try $n: $(curl -sS -m 5 -o /dev/null -w '%{http_code}' http://web.test/ 2>&1)"; sleep 0.2; done`
	s := startShim(t, sandboxSpec{bootstrap: egressBootstrap(script), args: []string{"--control-socket", sock}})
	s.waitState(api.StateReady, bootTimeout)

	isEgress := func(decision string, after int) func(api.Event) bool {
		return func(e api.Event) bool {
			return e.Event == api.KindEgress && e.Target == "web.test:80" && e.Decision == decision && e.Conn > uint64(after)
		}
	}
	denied := s.waitFor(isEgress("denied", 0), 30*time.Second, "a denied connection under the initial policy")
	assert.Equal(t, "Denied", denied.Code)

	a := ctl(t, sock, map[string]any{"cmd": "set_policy", "upstreams": []string{"web.test:80=" + web.Listener.Addr().String()}})
	require.Equal(t, true, a["ok"], a)
	assert.Equal(t, []any{"upstream web.test:80=" + web.Listener.Addr().String()}, a["result"].(map[string]any)["egress"])
	replaced := s.waitFor(func(e api.Event) bool {
		return e.Event == api.KindEgressPolicy && strings.Contains(e.Message, "replaced by a control command")
	}, 5*time.Second, "egress_policy event")
	assert.NotEmpty(t, replaced.Rules)
	last := s.find(func(e api.Event) bool { return e.Event == api.KindEgress })
	allowed := s.waitFor(isEgress("allowed", int(last[len(last)-1].Conn)), 30*time.Second, "an allowed connection under the new policy")
	assert.Equal(t, "upstream web.test:80="+web.Listener.Addr().String(), allowed.Rule)

	a = ctl(t, sock, map[string]any{"cmd": "set_policy", "allow": []string{"*:443"}})
	assert.Equal(t, false, a["ok"], "a bad policy is refused and the old one kept")
	a = ctl(t, sock, map[string]any{"cmd": "set_policy"})
	require.Equal(t, true, a["ok"], a)
	last = s.find(func(e api.Event) bool { return e.Event == api.KindEgress })
	s.waitFor(isEgress("denied", int(last[len(last)-1].Conn)), 30*time.Second, "denied again under the empty policy")
	s.waitLog("try ", time.Second)
	found200 := false
	for _, e := range s.find(func(e api.Event) bool { return e.Event == api.KindLog && strings.HasPrefix(e.Line, "try ") }) {
		found200 = found200 || strings.HasSuffix(e.Line, ": 200")
	}
	assert.True(t, found200, "the daemon's curl got through while the policy allowed it")

	a = ctl(t, sock, map[string]any{"cmd": "stop"})
	require.Equal(t, true, a["ok"], a)
	s.waitState(api.StateStopped, 15*time.Second)
	assert.Equal(t, 0, s.exit(10*time.Second))
}

// A restart through the control API: attempt 2 runs, attempt 1's late
// results are not reported as the sandbox's state.
func TestStartCommandRestartsWithANewAttempt(t *testing.T) {
	needBwrap(t)
	sock := filepath.Join(t.TempDir(), "ctl.sock")
	s := startShim(t, sandboxSpec{bootstrap: daemon("exec sleep 1000", `"stop_grace":"1s"`), args: []string{"--control-socket", sock}})
	s.waitState(api.StateReady, bootTimeout)
	a := ctl(t, sock, map[string]any{"cmd": "start"})
	require.Equal(t, true, a["ok"], a)
	assert.Equal(t, float64(2), a["result"].(map[string]any)["attempt"])
	ready2 := s.waitFor(func(e api.Event) bool {
		return e.Event == api.KindState && e.State == api.StateReady && e.Attempt == 2
	}, bootTimeout, "ready of attempt 2")
	assert.Equal(t, uint64(2), ready2.Attempt)
	for _, e := range s.find(func(e api.Event) bool { return e.Event == api.KindState && e.Attempt == 1 }) {
		assert.NotEqual(t, api.StateStopped, e.State, "attempt 1's stop is stale once attempt 2 started")
	}
	st := ctl(t, sock, map[string]any{"cmd": "status"})["result"].(map[string]any)
	assert.Equal(t, "ready", st["state"])
	assert.Equal(t, float64(2), st["attempt"])
	s.signal(15)
	s.waitState(api.StateStopped, 15*time.Second)
	assert.Equal(t, 0, s.exit(10*time.Second))
}

// A reset through the control API starts attempt 2 with a password of its
// own: --password-file is replaced with it (the first attempt created it),
// and the second daemon got that one.
func TestThePasswordFileFollowsEachAttempt(t *testing.T) {
	needBwrap(t)
	dir := t.TempDir()
	sock, pwFile := filepath.Join(dir, "ctl.sock"), filepath.Join(dir, "password")
	s := startShim(t, sandboxSpec{bootstrap: encode(t, contract("link.example.com")),
		args: append(identityArgs(), "--password-file", pwFile, "--control-socket", sock)})
	s.waitState(api.StateReady, bootTimeout)
	first, err := os.ReadFile(pwFile)
	require.NoError(t, err)
	daemonSaw := func(attempt uint64) string {
		return s.waitFor(func(e api.Event) bool {
			return e.Event == api.KindLog && e.Attempt == attempt && strings.HasPrefix(e.Line, "daemon: password-sha256=")
		}, bootTimeout, "the daemon's password digest").Line
	}
	assert.Equal(t, "daemon: password-sha256="+sha(string(first)), daemonSaw(1))

	a := ctl(t, sock, map[string]any{"cmd": "reset"})
	require.Equal(t, true, a["ok"], a)
	assert.Equal(t, float64(2), a["result"].(map[string]any)["attempt"])
	s.waitFor(func(e api.Event) bool {
		return e.Event == api.KindState && e.State == api.StateReady && e.Attempt == 2
	}, bootTimeout, "ready of attempt 2")
	second, err := os.ReadFile(pwFile)
	require.NoError(t, err)
	assert.NotEqual(t, string(first), string(second), "attempt 2 generated its own password")
	assert.Equal(t, "daemon: password-sha256="+sha(string(second)), daemonSaw(2), "the file holds the running daemon's password")
	st, err := os.Stat(pwFile)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode())
	s.signal(15)
	s.waitState(api.StateStopped, 15*time.Second)
	assert.Equal(t, 0, s.exit(10*time.Second))
}

// The Go parent of docs/events-and-control.md (examples/shim-client) against a real guest.
func TestGoExampleDrivesStartReadyForwardStop(t *testing.T) {
	needBwrap(t)
	bootFile := filepath.Join(t.TempDir(), "bootstrap.json")
	require.NoError(t, os.WriteFile(bootFile, []byte(encode(t, contract("link.example.com"))), 0o600))
	args := append([]string{"-shim", bins.shim, "-name", uniqueName("goex"), "-bootstrap", bootFile, "--", "--provider", "bwrap", "--agent", bins.guest},
		identityArgs()...)
	out, err := exec.Command(bins.shimClient, args...).CombinedOutput()
	require.NoError(t, err, "%s", out)
	text := string(out)
	assert.Regexp(t, `forward: 127\.0\.0\.1:\d+ -> guest 127\.0\.0\.1:4096`, text)
	assert.Regexp(t, `ready: attempt 1, url http://127\.0\.0\.1:\d+ \(in the guest http://127\.0\.0\.1:4096\), user runtime`, text)
	assert.Contains(t, text, `GET /global/health: 200 {"healthy":true}`)
	assert.Contains(t, text, "stopped: stopped: stop command")
}

// The README's "From Go", as written there (examples/readme-go): the
// shim it finds through OAC_SHIM is this run's, given the stand-ins and
// the identity the way a product's image would carry them.
func TestTheREADMEsGoSnippetStartsUseAndStopsASandbox(t *testing.T) {
	needBwrap(t)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "bootstrap.json"), []byte(encode(t, contract("link.example.com"))), 0o600))
	wrapper := filepath.Join(dir, "oac-shim")
	script := "#!/bin/sh\nexec " + shellQuote(bins.shim) + ` "$@" --provider bwrap --agent ` + shellQuote(bins.guest)
	for _, a := range identityArgs() {
		script += " " + shellQuote(a)
	}
	require.NoError(t, os.WriteFile(wrapper, []byte(script+"\n"), 0o755))
	cmd := exec.Command(bins.readmeGo)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "OAC_SHIM="+wrapper)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "stderr:\n%s", stderr.String())
	assert.Equal(t, "200\n", string(out), "the daemon answered its health check to the client's password")
	noneLeft(t, "hello")
}

// The shell one-liner of docs/events-and-control.md.
func TestShellOneLinerDrivesStartReadyForwardStop(t *testing.T) {
	needBwrap(t)
	needCurl(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	dir := t.TempDir()
	bootFile := filepath.Join(dir, "bootstrap.json")
	require.NoError(t, os.WriteFile(bootFile, []byte(encode(t, contract("link.example.com"))), 0o600))
	pw := filepath.Join(dir, "pw")
	// As in docs/events-and-control.md, with this test's paths and port.
	line := `( until curl -sf -u "runtime:$(cat $PW 2>/dev/null)" http://127.0.0.1:$PORT/global/health >&2; do sleep 0.2; done;
  echo '{"cmd":"status"}'; echo '{"cmd":"stop"}' ) |
  $SHIM run --name $NAME --bootstrap $BOOT $IDENTITY --password-file $PW --forward 127.0.0.1:$PORT=4096 --control stdin --agent $AGENT`
	cmd := exec.Command("bash", "-c", line)
	cmd.Env = append(os.Environ(), "PW="+pw, fmt.Sprintf("PORT=%d", port), "SHIM="+bins.shim, "NAME="+uniqueName("oneliner"),
		"BOOT="+bootFile, "IDENTITY="+strings.Join(identityArgs(), " "), "AGENT="+bins.guest)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	done := make(chan struct{})
	var out []byte
	go func() { out, err = cmd.Output(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("the one-liner did not finish; stderr:\n%s", stderr.String())
	}
	require.NoError(t, err, "stderr:\n%s", stderr.String())
	assert.Contains(t, stderr.String(), `{"healthy":true}`, "curl reached the daemon through the forward")
	var answers, states []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		validLine(t, []byte(l))
		var e map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &e), l)
		switch e["event"] {
		case "answer":
			answers = append(answers, fmt.Sprint(e["command"], " ", e["ok"]))
		case "state":
			states = append(states, fmt.Sprint(e["state"]))
		}
	}
	assert.Equal(t, []string{"status true", "stop true"}, answers)
	// Not necessarily "ready": curl's request can reach the daemon before
	// the guest's own health poll does, and the stop may come first.
	assert.Equal(t, "stopped", states[len(states)-1])
}

// oac-guest as a service in a systemd guest (not PID 1): READY=1 when it
// reports ready, STOPPING=1 when it stops; and forward streams from the
// host reach a loopback port (here the host's, as a stdio guest shares it).
func TestGuestServiceNotifiesSystemdAndServesForwards(t *testing.T) {
	notifyPath, notified := notifySocket(t)
	cmd, sess, stderr := guestOverStdio(t, "NOTIFY_SOCKET="+notifyPath)
	ctl, hello, _, err := protocol.HostHandshake(sess, protocol.MinVersion, protocol.MaxVersion,
		protocol.Welcome{HostVersion: "e2e"}, 10*time.Second)
	require.NoError(t, err)
	assert.Contains(t, hello.Capabilities, protocol.CapForward)
	assert.NotContains(t, hello.Capabilities, protocol.CapTime, "only a VM guest sets its clock")
	require.NoError(t, ctl.Send(protocol.TypeBootstrap, map[string]any{"version": 1}))
	var st protocol.State
	require.NoError(t, ctl.RecvMessage(protocol.TypeState, &st))
	require.NoError(t, ctl.RecvMessage(protocol.TypeState, &st), stderr.String())
	require.Equal(t, protocol.StateReady, st.State)

	ln := listen(t)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_, _ = c.Write([]byte("hello from a guest port"))
			c.Close()
		}
	}()
	fs, err := protocol.OpenStream(sess, protocol.StreamHeader{Kind: protocol.KindForward, Port: portOf(ln)})
	require.NoError(t, err)
	_ = fs.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(fs)
	require.NoError(t, err)
	assert.Equal(t, "hello from a guest port", string(got))
	fs.Close()

	require.NoError(t, ctl.Send(protocol.TypeShutdown, protocol.Shutdown{Reason: "test over", GraceMS: 1000}))
	require.NoError(t, ctl.RecvMessage(protocol.TypeState, &st))
	sess.Close()
	assert.Equal(t, 0, exitCode(t, cmd, 10*time.Second), stderr.String())
	msgs := notified()
	assert.Contains(t, msgs, "STATUS=starting: applying bootstrap")
	assert.Contains(t, msgs, "READY=1\nSTATUS=ready")
	assert.Contains(t, msgs, "STOPPING=1\nSTATUS=stopped: test over")
}
