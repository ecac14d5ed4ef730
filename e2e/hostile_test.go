//go:build linux

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unicode"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/host/sandbox"
)

// hostileBootstrap gives the hostile guests a short stop grace: they
// ignore Shutdown, and the stop waits for the grace before the kill.
var hostileBootstrap = `{"version":1,"stop_grace":"100ms"}`

// hostileModes are the badguest modes built for the hostile tests.
var hostileModes = []string{"window", "pings", "streams", "process", "denied", "halfopen", "escapes", "slowread", "upload", "warmtalk", "warmpings"}

// shimCeiling is the memory a shim may hold for one sandbox whatever its
// guest does (docs/threat-model.md): its peak RSS (VmHWM). oac-shim's is
// sandbox.MemoryCeiling; the tests' default shim carries the kubernetes
// provider, whose client library's code and tables are its own share.
func shimCeiling(bin string) int64 {
	if bin == bins.plainShim {
		return sandbox.MemoryCeiling
	}
	return sandbox.MemoryCeilingKubernetes
}

// stopBound is the time the shim may take to exit after a stop (SIGTERM)
// or after the sandbox failed on its own: the code kills the runtime at
// the latest the guest's stop grace + 1 s after the stop (at once after a
// violation), then bwrap exits; 2 s more are margin for a busy machine.
func stopBound(grace time.Duration) time.Duration { return grace + 3*time.Second }

// hostileGrace is the stop grace the hostile runs give their guest
// (which ignores Shutdown).
const hostileGrace = 100 * time.Millisecond

// watched is a shim under attack: its peak RSS and thread count sampled
// from /proc, its control API asked for status every 100 ms.
type watched struct {
	s           *shim
	sock        string
	peakRSS     atomic.Int64 // bytes (VmHWM)
	peakThreads atomic.Int64
	// peakAnon and peakFile (KiB, sampled): what the shim allocated and
	// the pages of its executable it touched.
	peakAnon, peakFile atomic.Int64
	asked, unanswered  atomic.Int64
	// stopping is set once the test stopped the shim or saw it fail: the
	// control socket goes with the run, and the final line may still be
	// on its way.
	stopping atomic.Bool
	stop     chan struct{}
	done     sync.WaitGroup
}

func watch(t *testing.T, s *shim, sock string) *watched {
	w := &watched{s: s, sock: sock, stop: make(chan struct{})}
	pid := s.cmd.Process.Pid
	w.asked.Add(1)
	if !statusAnswers(sock) && !w.ended() {
		w.unanswered.Add(1)
	}
	w.done.Add(2)
	go func() {
		defer w.done.Done()
		for {
			if v := procStatusKB(pid, "VmHWM"); v > 0 {
				w.peakRSS.Store(v << 10)
			}
			if v := procStatusKB(pid, "RssAnon"); v > w.peakAnon.Load() {
				w.peakAnon.Store(v)
			}
			if v := procStatusKB(pid, "RssFile"); v > w.peakFile.Load() {
				w.peakFile.Store(v)
			}
			if v := procStatusKB(pid, "Threads"); v > w.peakThreads.Load() {
				w.peakThreads.Store(v)
			}
			select {
			case <-w.stop:
				return
			case <-s.done:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	go func() {
		defer w.done.Done()
		for {
			select {
			case <-w.stop:
				return
			case <-s.done:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if w.final() {
				return // the control socket goes with the run
			}
			if w.stopping.Load() {
				return
			}
			w.asked.Add(1)
			if !statusAnswers(sock) && !w.ended() {
				w.unanswered.Add(1)
			}
		}
	}()
	t.Cleanup(func() { close(w.stop); w.done.Wait() })
	return w
}

// sigterm stops the shim.
func (w *watched) sigterm() {
	w.stopping.Store(true)
	w.s.signal(syscall.SIGTERM)
}

// ended reports whether the run was ending when a status went
// unanswered: the socket goes with the run, just before the final line is
// printed and the shim exits, so within a second of it one of those
// happens (or the test had stopped it).
func (w *watched) ended() bool {
	deadline := time.After(time.Second)
	for {
		if w.final() || w.stopping.Load() {
			return true
		}
		select {
		case <-w.s.done:
			return true
		case <-deadline:
			return false
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// final reports whether the final state was printed.
func (w *watched) final() bool {
	e := w.s.lastEvent()
	return e.Event == api.KindState && (e.State == api.StateFailed || e.State == api.StateStopped)
}

// statusAnswers asks status on the control socket and reports whether a
// status answer came within a second.
func statusAnswers(sock string) bool {
	c, err := net.DialTimeout("unix", sock, time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte(`{"cmd":"status"}` + "\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil {
		return false
	}
	var a struct {
		Event  string `json:"event"`
		OK     bool   `json:"ok"`
		Result struct {
			State string `json:"state"`
		} `json:"result"`
	}
	return json.Unmarshal(line, &a) == nil && a.OK && a.Result.State != ""
}

// procStatusKB reads a "Name: N kB" (or count) field of /proc/PID/status.
func procStatusKB(pid int, field string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			n, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return n
		}
	}
	return 0
}

// check asserts the bounds every hostile run keeps, once the shim exited
// at most stopBound after since: the final state is the last line and
// the only final state, the status answered throughout, peak RSS under
// the ceiling.
func (w *watched) check(t *testing.T, since time.Time, stopBound time.Duration) {
	t.Helper()
	select {
	case <-w.s.done:
	case <-time.After(time.Until(since.Add(stopBound))):
		// Late: the Go runtime's dump of every goroutine (SIGQUIT) says
		// where the stop waits; the stderr is logged with the failure.
		_ = w.s.cmd.Process.Signal(syscall.SIGQUIT)
	}
	w.s.exit(stopBound + 10*time.Second)
	ceiling := shimCeiling(w.s.bin)
	took := time.Since(since)
	close(w.stop)
	w.done.Wait()
	w.stop = make(chan struct{})
	t.Logf("BOUND %s: shim exited %s after the stop or the failure (bound %s); peak RSS %.1f MiB (ceiling %d MiB; sampled peaks: %.1f MiB anonymous, %.1f MiB of files); peak threads %d; status asked %d times, unanswered %d",
		t.Name(), took.Round(time.Millisecond), stopBound, float64(w.peakRSS.Load())/(1<<20), ceiling>>20, float64(w.peakAnon.Load())/1024, float64(w.peakFile.Load())/1024, w.peakThreads.Load(), w.asked.Load(), w.unanswered.Load())
	assert.Less(t, took, stopBound, "the shim exits within its bound")
	assert.LessOrEqual(t, w.peakRSS.Load(), ceiling, "peak RSS of %s", filepath.Base(w.s.bin))
	assert.Positive(t, w.asked.Load())
	assert.Zero(t, w.unanswered.Load(), "the control API answers status throughout")
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	require.NotEmpty(t, w.s.all)
	last := w.s.all[len(w.s.all)-1]
	assert.Equal(t, api.KindState, last.Event, "the last line is the final state: %s", w.s.raw[len(w.s.raw)-1])
	finals := 0
	for _, e := range w.s.all {
		if e.Event == api.KindState && (e.State == api.StateFailed || e.State == api.StateStopped) {
			finals++
		}
	}
	assert.Equal(t, 1, finals, "exactly one final state")
}

// A hostile agent (badguest, guest root speaking the transport directly)
// against the real shim on bwrap, one per finding: each run ends within
// its bound with the final state last, the control API answers status
// throughout, and the shim's peak RSS stays under the ceiling.
func TestHostileAgentAgainstTheRealShim(t *testing.T) {
	needBwrap(t)
	cases := []struct {
		mode string
		// fails: the sandbox fails on its own, with this in the reason;
		// else the test stops it with SIGTERM after attack.
		fails  string
		attack time.Duration
		after  func(t *testing.T, s *shim, took time.Duration)
	}{
		{mode: "window", fails: "hostile guest: window update on stream 1 takes the host's send window"},
		{mode: "pings", fails: "hostile guest: pings faster than 4 a second (burst 16)"},
		{mode: "streams", fails: "hostile guest: "},
		{mode: "process", attack: 3 * time.Second, after: func(t *testing.T, s *shim, took time.Duration) {
			n := len(s.find(func(e api.Event) bool { return e.Event == api.KindProcess }))
			t.Logf("process flood: %d process events in %s", n, took.Round(time.Millisecond))
			assert.NotEmpty(t, s.find(func(e api.Event) bool { return e.Event == api.KindProcessDropped }), "drops are counted")
			assert.LessOrEqual(t, n, sandbox.ProcessEventBurst+int(sandbox.ProcessEventRate*(took.Seconds()+1)), "process events stay within their rate")
		}},
		{mode: "denied", attack: 3 * time.Second, after: func(t *testing.T, s *shim, took time.Duration) {
			n := len(s.find(func(e api.Event) bool { return e.Event == api.KindEgress }))
			t.Logf("denied flood: %d egress events in %s", n, took.Round(time.Millisecond))
			assert.NotEmpty(t, s.find(func(e api.Event) bool { return e.Event == api.KindEgressDropped }), "drops are counted")
			assert.LessOrEqual(t, n, sandbox.EgressEventBurst+int(sandbox.EgressEventRate*(took.Seconds()+1)), "egress events stay within their rate")
		}},
		{mode: "escapes", attack: 500 * time.Millisecond, after: func(t *testing.T, s *shim, _ time.Duration) {
			s.mu.Lock()
			defer s.mu.Unlock()
			for _, l := range s.raw {
				var e api.Event
				require.NoError(t, json.Unmarshal([]byte(l), &e))
				for _, f := range []string{e.Message, e.Line, e.AgentVersion} {
					assert.False(t, hasEscape(f), "no terminal escape in an event: %q", f)
				}
			}
			assert.Contains(t, s.stderr.String(), "badguest: stderr")
			assert.False(t, hasEscape(strings.ReplaceAll(s.stderr.String(), "\n", "")), "no terminal escape on the shim's stderr")
		}},
	}
	for _, c := range cases {
		t.Run(c.mode, func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "ctl.sock")
			s := startShim(t, sandboxSpec{shim: bins.plainShim, agent: bins.bad[c.mode], args: []string{"--control-socket", sock}, bootstrap: hostileBootstrap})
			s.waitState(api.StateReady, bootTimeout)
			start := time.Now()
			w := watch(t, s, sock)
			var since time.Time
			if c.fails != "" {
				failed := s.waitState(api.StateFailed, 30*time.Second)
				since = time.Now()
				w.stopping.Store(true)
				assert.Contains(t, failed.Message, c.fails)
				assert.Equal(t, api.CodeHostileGuest, failed.Code)
			} else {
				time.Sleep(c.attack)
				since = time.Now()
				w.sigterm()
			}
			w.check(t, since, stopBound(hostileGrace))
			if c.after != nil {
				c.after(t, s, time.Since(start))
			}
		})
	}
}

func hasEscape(s string) bool {
	return strings.ContainsFunc(s, func(r rune) bool { return unicode.IsControl(r) && r != '\t' })
}

// Finding 3 on the real shim: egress connections whose upstream keeps its
// half open are all closed by SIGTERM, reported before the final state.
func TestSIGTERMClosesUpstreamConnectionsThatKeepTheirHalfOpen(t *testing.T) {
	needBwrap(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	var mu sync.Mutex
	var closedAt []time.Time
	var accepted atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go func() {
				defer c.Close()
				_, _ = io.Copy(io.Discard, c)
				for { // keeps its half open, a byte now and then, until the host closes
					if _, err := c.Write([]byte{'.'}); err != nil {
						mu.Lock()
						closedAt = append(closedAt, time.Now())
						mu.Unlock()
						return
					}
					time.Sleep(20 * time.Millisecond)
				}
			}()
		}
	}()
	sock := filepath.Join(t.TempDir(), "ctl.sock")
	s := startShim(t, sandboxSpec{shim: bins.plainShim, agent: bins.bad["halfopen"], bootstrap: hostileBootstrap,
		args: []string{"--control-socket", sock, "--upstream", "up:80=" + ln.Addr().String()}})
	s.waitState(api.StateReady, bootTimeout)
	w := watch(t, s, sock)
	require.Eventually(t, func() bool { return accepted.Load() == 32 }, 10*time.Second, 10*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	since := time.Now()
	w.sigterm()
	w.check(t, since, stopBound(hostileGrace))
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(closedAt) == 32 }, 5*time.Second, 10*time.Millisecond,
		"every upstream connection is closed")
	mu.Lock()
	for _, at := range closedAt {
		assert.Less(t, at.Sub(since), stopBound(hostileGrace), "closed by the stop")
	}
	mu.Unlock()
	assert.Len(t, s.find(func(e api.Event) bool { return e.Event == api.KindEgressClosed }), 32, "every close is reported (before the final state)")
}

// Finding 4 on a real guest: an unprivileged workload (uid 1000) in a
// connect()/close() loop to a refused address, 64 loops at once, for
// 10 s: the sandbox never fails, and stops in order afterwards.
func TestWorkloadConnectLoopNeverEndsTheSandbox(t *testing.T) {
	needBwrap(t)
	// 192.0.2.1 (TEST-NET-1): captured in the guest and refused by the
	// broker before any dial; nothing leaves the machine.
	script := `echo "uid=$(id -u)"; for i in $(seq 64); do (while :; do (exec 3<>/dev/tcp/192.0.2.1/80) 2>/dev/null; done) & done; wait`
	sock := filepath.Join(t.TempDir(), "ctl.sock")
	s := startShim(t, sandboxSpec{shim: bins.plainShim, bootstrap: egressBootstrap(script), args: []string{"--control-socket", sock}})
	s.waitState(api.StateReady, bootTimeout)
	w := watch(t, s, sock)
	uid := s.waitLog("uid=", 10*time.Second)
	assert.Equal(t, "1000", uid, "the workload runs as uid 1000")
	s.waitFor(func(e api.Event) bool { return e.Event == api.KindEgress && e.Decision == "denied" }, 10*time.Second, "a refused connection")
	time.Sleep(10 * time.Second)
	for _, e := range s.find(func(e api.Event) bool { return e.Event == api.KindState }) {
		require.NotEqual(t, api.StateFailed, e.State, "the workload's connect loop never fails the sandbox: %s", e.Message)
	}
	n := len(s.find(func(e api.Event) bool { return e.Event == api.KindEgress }))
	t.Logf("connect loop: %d egress events in about 10 s", n)
	since := time.Now()
	w.sigterm()
	w.check(t, since, stopBound(time.Second)) // egressBootstrap's stop grace
	assert.Equal(t, api.StateStopped, s.lastEvent().State)
}

// The shim's memory ceiling against the guests that make it hold the most,
// for oac-shim and for oac-shim-kubernetes: 256 egress connections whose
// upstream sends without end while the guest reads nothing (copy buffers,
// the guest's windows), and 256 on which the guest sends 4 MiB to an
// upstream that reads nothing (the host's receive buffers: the session's
// receive budget holds the guest there, so only some are ever dialed).
func TestShimMemoryStaysUnderTheCeiling(t *testing.T) {
	needBwrap(t)
	for _, bin := range []struct{ name, path string }{{"oac-shim", bins.plainShim}, {"oac-shim-kubernetes", bins.shim}} {
		for _, mode := range []string{"slowread", "upload"} {
			t.Run(bin.name+"/"+mode, func(t *testing.T) { shimMemoryUnderAttack(t, bin.path, mode) })
		}
	}
}

func shimMemoryUnderAttack(t *testing.T, bin, mode string) {
	// An upstream that reads nothing keeps a small receive
	// buffer, so what the guest sends stays with the shim.
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { _ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 4096) })
	}}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	var conns sync.WaitGroup
	var accepted atomic.Int64
	hostDone := make(chan struct{}) // the shim exited
	defer func() {
		select {
		case <-hostDone:
		default:
			close(hostDone)
		}
	}()
	go func() {
		chunk := make([]byte, 64<<10)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			conns.Add(1)
			go func() {
				defer conns.Done()
				defer c.Close()
				if mode == "upload" { // reads nothing until the shim is gone
					select {
					case <-hostDone:
					case <-time.After(60 * time.Second):
					}
					return
				}
				_ = c.SetWriteDeadline(time.Now().Add(60 * time.Second))
				for range 1024 { // at most 64 MiB, until the host closes
					if _, err := c.Write(chunk); err != nil {
						return
					}
				}
			}()
		}
	}()
	sock := filepath.Join(t.TempDir(), "ctl.sock")
	s := startShim(t, sandboxSpec{shim: bin, agent: bins.bad[mode], bootstrap: hostileBootstrap,
		args: []string{"--control-socket", sock, "--upstream", "up:80=" + ln.Addr().String()}})
	s.waitState(api.StateReady, bootTimeout)
	w := watch(t, s, sock)
	if mode == "slowread" {
		require.Eventually(t, func() bool { return accepted.Load() == 256 }, 30*time.Second, 10*time.Millisecond)
	} else {
		// Held at the budget: no new connection for 2 s.
		last, still := int64(-1), 0
		require.Eventually(t, func() bool {
			n := accepted.Load()
			if n > 0 && n == last {
				still++
			} else {
				last, still = n, 0
			}
			return still >= 20
		}, 60*time.Second, 100*time.Millisecond)
		assert.Less(t, last, int64(256), "the receive budget holds the guest before it opened every connection")
		t.Logf("the guest was held at the receive budget after %d connections", last)
	}
	time.Sleep(3 * time.Second)
	since := time.Now()
	w.sigterm()
	w.check(t, since, stopBound(hostileGrace))
	close(hostDone)
	ln.Close()
	conns.Wait()
	dialed := s.find(func(e api.Event) bool { return e.Event == api.KindEgress && e.Decision == "allowed" })
	assert.Len(t, s.find(func(e api.Event) bool { return e.Event == api.KindEgressClosed }), len(dialed), "every dialed connection closed")
	assert.EqualValues(t, accepted.Load(), len(dialed))
}

// Finding 6 on a real guest: curl killed mid-download through the guest's
// HTTP proxy (plain HTTP, an endless response): the upstream connection
// ends at once, not after the proxy read the rest or a stream timeout.
func TestAClientKilledMidDownloadEndsTheUpstreamAtOnce(t *testing.T) {
	needBwrap(t)
	needCurl(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	ended := make(chan time.Time, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = bufio.NewReader(c).ReadString('\n')
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 10000000000\r\n\r\n")
		chunk := make([]byte, 32<<10)
		// Until the host closes (a count of bytes would run out first on
		// a fast machine: the handed path moves GB/s), at most a minute.
		_ = c.SetWriteDeadline(time.Now().Add(60 * time.Second))
		for {
			if _, err := c.Write(chunk); err != nil {
				break
			}
		}
		ended <- time.Now()
	}()
	script := `curl -sS -x http://127.0.0.1:3128 -o /dev/null http://big.test/ & pid=$!; sleep 2; kill -9 $pid; echo killed; exec sleep 1000`
	s := startShim(t, sandboxSpec{bootstrap: egressBootstrap(script), args: []string{"--upstream", "big.test:80=" + ln.Addr().String()}})
	s.waitState(api.StateReady, bootTimeout)
	killed := s.waitFor(func(e api.Event) bool { return e.Event == api.KindLog && e.Line == "killed" }, 20*time.Second, "the kill")
	select {
	case at := <-ended:
		t.Logf("the upstream ended %s after the host printed the kill", at.Sub(killed.Time).Round(time.Millisecond))
		assert.Less(t, at.Sub(killed.Time), time.Second, "the abort reaches the upstream at once (the log line and the abort travel separately)")
	case <-time.After(20 * time.Second):
		t.Fatal("the upstream connection outlived the killed client")
	}
	closed := s.waitFor(func(e api.Event) bool { return e.Event == api.KindEgressClosed }, 5*time.Second, "egress_closed")
	assert.Equal(t, "the guest aborted the connection (its client went away)", closed.Reason)
	s.signal(syscall.SIGTERM)
	s.waitState(api.StateStopped, 15*time.Second)
	assert.Equal(t, 0, s.exit(10*time.Second))
}
