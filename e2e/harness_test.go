//go:build linux

package e2e

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/host/events"
)

// bins are the binaries under test, built once per run.
var bins struct {
	dir, shim, guest, image, vmdaemon string
	// fakeWSL stands in for wsl.exe, fakeDocker for docker.
	fakeWSL, fakeDocker string
	// badVersion speaks protocol 2..3; badGarbage sends bytes that are not
	// a session.
	badVersion, badGarbage string
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "oac-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	// The provider requires the agent to be readable by others: the guest's
	// ids are not the host's.
	if err := os.Chmod(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	bins.dir = dir
	bins.shim = filepath.Join(dir, "oac-shim")
	bins.guest = filepath.Join(dir, "oac-guest")
	bins.image = filepath.Join(dir, "oac-image")
	bins.vmdaemon = filepath.Join(dir, "vmdaemon")
	bins.badVersion = filepath.Join(dir, "badguest-version")
	bins.badGarbage = filepath.Join(dir, "badguest-garbage")
	bins.fakeWSL = filepath.Join(dir, "wsl.exe")
	bins.fakeDocker = filepath.Join(dir, "docker")
	for _, b := range []struct{ out, pkg, ldflags string }{
		{bins.shim, "../cmd/oac-shim", ""},
		{bins.guest, "../cmd/oac-guest", ""},
		{bins.image, "../cmd/oac-image", ""},
		{bins.vmdaemon, "./internal/vmdaemon", ""},
		{bins.badVersion, "./internal/badguest", "-X main.defaultMode=version"},
		{bins.badGarbage, "./internal/badguest", "-X main.defaultMode=garbage"},
		{bins.fakeWSL, "./internal/fakewsl", ""},
		{bins.fakeDocker, "./internal/fakedocker", ""},
	} {
		out, pkg := b.out, b.pkg
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags", b.ldflags, "-o", out, pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: build %s: %v\n%s", pkg, err, b)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// inCI reports whether missing dependencies must fail instead of skip.
func inCI() bool { return os.Getenv("CI") == "true" }

// need fails (CI) or skips (elsewhere) when a dependency is missing.
func need(t *testing.T, ok bool, what string) {
	t.Helper()
	if ok {
		return
	}
	if inCI() {
		t.Fatalf("missing dependency with CI=true: %s", what)
	}
	t.Skipf("skipped: %s", what)
}

// needBwrap checks what the bwrap provider needs on this host.
func needBwrap(t *testing.T) {
	t.Helper()
	_, err := exec.LookPath("bwrap")
	need(t, err == nil, "bubblewrap is not installed: apt-get install bubblewrap (or run make deps)")
	need(t, os.Geteuid() == 0, "the bwrap provider maps a host id range and needs root: run the e2e tests as root (sudo make test)")
}

// uniqueName returns a sandbox name no other test uses.
func uniqueName(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// shim is a running oac-shim process.
type shim struct {
	t      *testing.T
	name   string
	cmd    *exec.Cmd
	events chan events.Event
	mu     sync.Mutex
	all    []events.Event
	stderr lockedBuffer
	done   chan struct{}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// sandboxSpec is what a test asks of one run.
type sandboxSpec struct {
	provider  string // default bwrap
	name      string
	bootstrap string // JSON; empty: none
	agent     string // default: the real oac-guest
	env       []string
	args      []string
	// user runs the shim as this unprivileged user (setpriv), not root.
	user string
}

// startShim starts `oac-shim run` for a sandbox and collects its events.
func startShim(t *testing.T, spec sandboxSpec) *shim {
	t.Helper()
	if spec.name == "" {
		spec.name = uniqueName("e2e")
	}
	if spec.agent == "" {
		spec.agent = bins.guest
	}
	if spec.provider == "" {
		spec.provider = "bwrap"
	}
	args := []string{"run", "--provider", spec.provider, "--name", spec.name, "--agent", spec.agent}
	if spec.bootstrap != "" {
		dir := t.TempDir()
		if spec.user != "" {
			// The unprivileged shim must be able to read it.
			var err error
			dir, err = os.MkdirTemp("", "oac-e2e-boot-")
			require.NoError(t, err)
			t.Cleanup(func() { os.RemoveAll(dir) })
			u, err := user.Lookup(spec.user)
			require.NoError(t, err)
			uid, _ := strconv.Atoi(u.Uid)
			require.NoError(t, os.Chown(dir, uid, -1))
			defer func() { require.NoError(t, os.Chown(filepath.Join(dir, "bootstrap.json"), uid, -1)) }()
		}
		f := filepath.Join(dir, "bootstrap.json")
		require.NoError(t, os.WriteFile(f, []byte(spec.bootstrap), 0o600))
		args = append(args, "--bootstrap", f)
	}
	args = append(args, spec.args...)
	cmd := exec.Command(bins.shim, args...)
	cmd.Env = append(os.Environ(), spec.env...)
	if spec.user != "" {
		// setpriv execs the shim itself, so signals reach it directly.
		cmd = exec.Command("setpriv", append([]string{"--reuid", spec.user, "--regid", spec.user, "--init-groups", "--reset-env", bins.shim}, args...)...)
		cmd.Dir = "/"
	}
	s := &shim{t: t, name: spec.name, cmd: cmd, events: make(chan events.Event, 1024), done: make(chan struct{})}
	cmd.Stderr = &s.stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	go func() {
		defer close(s.events)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			var e events.Event
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				t.Errorf("oac-shim printed a line that is not a JSON event: %q", sc.Text())
				continue
			}
			s.mu.Lock()
			s.all = append(s.all, e)
			s.mu.Unlock()
			s.events <- e
		}
	}()
	go func() {
		_ = cmd.Wait()
		close(s.done)
	}()
	t.Cleanup(func() {
		select {
		case <-s.done:
		default:
			_ = cmd.Process.Kill()
			<-s.done
		}
		if t.Failed() {
			t.Logf("oac-shim stderr:\n%s", s.stderr.String())
			s.mu.Lock()
			for _, e := range s.all {
				t.Logf("event: %+v", e)
			}
			s.mu.Unlock()
		}
	})
	return s
}

// waitFor returns the first event matching pred, failing after timeout.
// It looks at every event seen so far first: the guest's output streams
// and its state messages travel on different streams, so a log line may
// arrive before or after a state event that a test waited for earlier.
func (s *shim) waitFor(pred func(events.Event) bool, timeout time.Duration, what string) events.Event {
	s.t.Helper()
	s.mu.Lock()
	for _, e := range s.all {
		if pred(e) {
			s.mu.Unlock()
			return e
		}
	}
	s.mu.Unlock()
	deadline := time.After(timeout)
	for {
		select {
		case e, ok := <-s.events:
			if !ok {
				s.t.Fatalf("oac-shim exited before %s; stderr:\n%s", what, s.stderr.String())
			}
			if pred(e) {
				return e
			}
		case <-deadline:
			s.t.Fatalf("no %s within %s", what, timeout)
		}
	}
}

func (s *shim) waitState(state string, timeout time.Duration) events.Event {
	s.t.Helper()
	return s.waitFor(func(e events.Event) bool {
		return e.Event == events.KindState && e.State == state
	}, timeout, "state "+state)
}

// waitLog returns the first log line with the given prefix.
func (s *shim) waitLog(prefix string, timeout time.Duration) string {
	s.t.Helper()
	e := s.waitFor(func(e events.Event) bool {
		return e.Event == events.KindLog && strings.HasPrefix(e.Line, prefix)
	}, timeout, "log line "+prefix)
	return strings.TrimPrefix(e.Line, prefix)
}

// exit waits for oac-shim to exit and returns its exit code.
func (s *shim) exit(timeout time.Duration) int {
	s.t.Helper()
	select {
	case <-s.done:
	case <-time.After(timeout):
		s.t.Fatalf("oac-shim did not exit within %s", timeout)
	}
	return s.cmd.ProcessState.ExitCode()
}

func (s *shim) signal(sig syscall.Signal) {
	s.t.Helper()
	require.NoError(s.t, s.cmd.Process.Signal(sig))
}

// lastEvent returns the last event printed.
func (s *shim) lastEvent() events.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.all) == 0 {
		return events.Event{}
	}
	return s.all[len(s.all)-1]
}

// hostProcs returns the host pids whose command line contains marker.
func hostProcs(marker string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		if strings.Contains(string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})), marker) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// procStatus returns a field of /proc/PID/status split into words.
func procStatus(t *testing.T, pid int, field string) []string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strings.Fields(v)
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return nil
}

// daemon returns a bootstrap whose daemon runs script under /bin/sh.
func daemon(script string, extra ...string) string {
	argv, _ := json.Marshal([]string{"/bin/sh", "-c", script})
	fields := []string{`"version":1`, `"daemon":{"argv":` + string(argv) + `}`}
	fields = append(fields, extra...)
	return "{" + strings.Join(fields, ",") + "}"
}
