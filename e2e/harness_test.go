//go:build linux

package e2e

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
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

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/internal/unprivuser"
	"github.com/oac/sandbox-agent/schema"
)

// bins are the binaries under test, built once per run.
var bins struct {
	dir, shim, guest, image, vmdaemon string
	// fakeWSL stands in for wsl.exe; dockerRec records the docker
	// client's argv and runs the real one.
	fakeWSL, dockerRec string
	// badVersion speaks protocol 2..3; badGarbage sends bytes that are not
	// a session.
	badVersion, badGarbage string
	// bad holds badguest built for each hostile mode (hostile_test.go).
	bad map[string]string
	// sandboxIO and daemon are the stand-in fixtures (internal/standin).
	sandboxIO, daemon string
	// shimClient is examples/shim-client, the Go parent of docs/events-and-control.md.
	shimClient string
	// readmeGo is examples/readme-go, the README's "From Go".
	readmeGo string
	// goParent starts a sandbox that outlives it (internal/goparent).
	goParent string
	// probe plays a hostile daemon (internal/probe).
	probe string
	// plainShim is oac-shim as users run it for every provider but
	// kubernetes: built without tags (the memory ceiling is its).
	plainShim string
	// crashShim is oac-shim built with -tags crashpoints: it kills
	// itself at the crash point $OAC_CRASH_AT names.
	crashShim string
	// guestDoorsOff is oac-guest built with -tags oac_doors_off: it
	// closes none of the platform's doors (the test that proves the
	// suite sees them).
	guestDoorsOff string
	// guestKeepInterfaces is oac-guest built with -tags
	// oac_keep_interfaces: --offline deletes no interface (the test that
	// proves a Pod's NetworkPolicy confines it on its own).
	guestKeepInterfaces string
	// dialprobe says what a Pod's network reaches (internal/dialprobe).
	dialprobe string
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
	bins.sandboxIO = filepath.Join(dir, "sandbox-io-standin")
	bins.daemon = filepath.Join(dir, "daemon-standin")
	bins.fakeWSL = filepath.Join(dir, "wsl.exe")
	bins.dockerRec = filepath.Join(dir, "docker")
	bins.shimClient = filepath.Join(dir, "shim-client")
	bins.goParent = filepath.Join(dir, "goparent")
	bins.readmeGo = filepath.Join(dir, "readme-go")
	bins.probe = filepath.Join(dir, "probe")
	bins.crashShim = filepath.Join(dir, "oac-shim-crash")
	bins.plainShim = filepath.Join(dir, "oac-shim-plain")
	bins.guestDoorsOff = filepath.Join(dir, "oac-guest-doors-off")
	bins.guestKeepInterfaces = filepath.Join(dir, "oac-guest-keep-interfaces")
	bins.dialprobe = filepath.Join(dir, "dialprobe")
	builds := []struct{ out, pkg, ldflags string }{
		{bins.shim, "../cmd/oac-shim", ""},
		{bins.guest, "../cmd/oac-guest", ""},
		{bins.image, "../cmd/oac-image", ""},
		{bins.vmdaemon, "./internal/vmdaemon", ""},
		{bins.badVersion, "./internal/badguest", "-X main.defaultMode=version"},
		{bins.badGarbage, "./internal/badguest", "-X main.defaultMode=garbage"},
		{bins.sandboxIO, "./internal/standin/sandboxio", ""},
		{bins.daemon, "./internal/standin/daemon", ""},
		{bins.fakeWSL, "./internal/fakewsl", ""},
		{bins.dockerRec, "./internal/dockerrec", ""},
		{bins.shimClient, "../examples/shim-client", ""},
		{bins.goParent, "./internal/goparent", ""},
		{bins.readmeGo, "../examples/readme-go", ""},
		{bins.probe, "./internal/probe", ""},
		{bins.crashShim, "../cmd/oac-shim", ""},
		{bins.plainShim, "../cmd/oac-shim", ""},
		{bins.guestDoorsOff, "../cmd/oac-guest", ""},
		{bins.guestKeepInterfaces, "../cmd/oac-guest", ""},
		{bins.dialprobe, "./internal/dialprobe", ""},
	}
	bins.bad = map[string]string{}
	for _, mode := range hostileModes {
		bins.bad[mode] = filepath.Join(dir, "badguest-"+mode)
		builds = append(builds, struct{ out, pkg, ldflags string }{bins.bad[mode], "./internal/badguest", "-X main.defaultMode=" + mode})
	}
	builds = append(builds, directBuilds(dir)...) // direct_hostile_test.go
	// OAC_E2E_BINS names the binaries of a run that built them (its
	// bins.dir): the run inside the AppArmor VM takes the host's, as
	// building under emulation would take minutes (apparmor_vm_test.go).
	prebuilt := os.Getenv("OAC_E2E_BINS")
	for _, b := range builds {
		out, pkg := b.out, b.pkg
		if prebuilt != "" {
			src := filepath.Join(prebuilt, filepath.Base(out))
			if _, err := os.Stat(src); err != nil || os.Symlink(src, out) != nil {
				fmt.Fprintf(os.Stderr, "e2e: OAC_E2E_BINS: no %s (%v): give a directory a run built\n", src, err)
				os.RemoveAll(dir)
				os.Exit(1)
			}
			continue
		}
		args := []string{"build", "-trimpath", "-ldflags", b.ldflags, "-o", out}
		switch out {
		case bins.shim:
			// The tests' oac-shim has every provider, kubernetes too.
			args = append(args, "-tags", "kubernetes")
		case bins.crashShim:
			args = append(args, "-tags", "crashpoints,kubernetes")
		case bins.guestDoorsOff:
			args = append(args, "-tags", "oac_doors_off")
		case bins.guestKeepInterfaces:
			args = append(args, "-tags", "oac_keep_interfaces")
		}
		cmd := exec.Command("go", append(args, pkg)...)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: build %s: %v\n%s", pkg, err, b)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	startAppArmorVMEarly() // apparmor_vm_test.go
	code := m.Run()
	stopAppArmorVM()
	stopPublic()
	if err := stopKube(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: stop the Kubernetes cluster the tests started:", err)
		if code == 0 {
			code = 1
		}
	}
	if err := stopEngine(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: stop the Docker engine the tests started:", err)
		if code == 0 {
			code = 1
		}
	}
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

// needCurl checks for the curl the guests run from the host's /usr.
func needCurl(t *testing.T) {
	t.Helper()
	_, err := exec.LookPath("curl")
	need(t, err == nil, "curl is not installed: apt-get install curl (or run make deps)")
}

// needUnshare checks for util-linux's unshare and mount (hosts files).
func needUnshare(t *testing.T) {
	t.Helper()
	_, err1 := exec.LookPath("unshare")
	_, err2 := exec.LookPath("mount")
	need(t, err1 == nil && err2 == nil, "unshare and mount (util-linux) are needed to give oac-shim a test /etc/hosts")
}

// uniqueName returns a sandbox name no other test uses.
func uniqueName(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// shim is a running oac-shim process. Every event it printed is kept, so
// a wait never misses an event that arrived before it started waiting.
type shim struct {
	t    *testing.T
	name string
	bin  string // the oac-shim binary
	cmd  *exec.Cmd
	mu   sync.Mutex
	all  []api.Event
	raw  []string // the lines as printed
	// notify is closed and replaced whenever an event arrives or the
	// output ends (then eof is set).
	notify chan struct{}
	eof    bool
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
	// shim is the oac-shim binary (default: bins.shim).
	shim string
	// hosts, when set, is the host's /etc/hosts as oac-shim sees it: the
	// shim runs in a private mount namespace with this content bound over
	// /etc/hosts (names for the broker to resolve, no real DNS needed).
	hosts string
	// files, like hosts, are host files as oac-shim sees them (path ->
	// content), bound over existing files in its private mount namespace:
	// /etc/resolv.conf for a stand-in DNS server, a CA bundle the guest
	// sees through the default root's /etc/ssl.
	files map[string]string
	// stdin is the shim's standard input; extraFiles its descriptors 3,
	// 4, ... (a bootstrap or password handed over without a file).
	stdin      io.Reader
	extraFiles []*os.File
	// command is the shim's command: "run" (the default) or "start" (a
	// kept sandbox: no --provider, args are start's).
	command string
	// argv, when set, is run instead of oac-shim (oac-guest helper, which
	// writes the same events): the other fields but stdin, env and files
	// are unused.
	argv []string
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
	if spec.command == "start" {
		args = []string{"start", "--name", spec.name, "--agent", spec.agent}
	}
	if spec.bootstrap != "" {
		dir := t.TempDir()
		owner := -1
		if spec.user != "" {
			// The unprivileged shim must be able to read it.
			var err error
			dir, err = os.MkdirTemp("", "oac-e2e-boot-")
			require.NoError(t, err)
			t.Cleanup(func() { os.RemoveAll(dir) })
			u, err := user.Lookup(spec.user)
			require.NoError(t, err)
			owner, _ = strconv.Atoi(u.Uid)
			require.NoError(t, os.Chown(dir, owner, -1))
		}
		f := filepath.Join(dir, "bootstrap.json")
		require.NoError(t, os.WriteFile(f, []byte(spec.bootstrap), 0o600))
		// Before the shim starts, not when this function returns.
		require.NoError(t, os.Chown(f, owner, -1))
		args = append(args, "--bootstrap", f)
	}
	args = append(args, spec.args...)
	shimBin := spec.shim
	if shimBin == "" {
		shimBin = bins.shim
	}
	argv := append([]string{shimBin}, args...)
	if spec.argv != nil {
		argv = spec.argv
	}
	if spec.user != "" {
		// setpriv execs the shim itself, so signals reach it directly.
		argv = asUser(spec.user, spec.env, argv)
	}
	if spec.hosts != "" {
		if spec.files == nil {
			spec.files = map[string]string{}
		}
		spec.files["/etc/hosts"] = spec.hosts
	}
	if len(spec.files) > 0 {
		dir := t.TempDir()
		require.NoError(t, os.Chmod(dir, 0o755))
		script := ""
		i := 0
		for target, content := range spec.files {
			f := filepath.Join(dir, fmt.Sprintf("f%d", i))
			i++
			require.NoError(t, os.WriteFile(f, []byte(content), 0o644))
			script += fmt.Sprintf("mount --bind %q %q && ", f, target)
		}
		// unshare execs (no fork), so the pid is the shim's in the end.
		argv = append([]string{"unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
			script + `exec "$@"`, "sh"}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), spec.env...)
	cmd.Stdin = spec.stdin
	cmd.ExtraFiles = spec.extraFiles
	if spec.user != "" {
		cmd.Dir = "/"
	}
	s := &shim{t: t, name: spec.name, bin: shimBin, cmd: cmd, notify: make(chan struct{}), done: make(chan struct{})}
	cmd.Stderr = &s.stderr
	// Not StdoutPipe: cmd.Wait closes that pipe as soon as the process
	// exits, which can drop the last events before they were read. This
	// pipe ends when the shim (and anything it left behind) closed it.
	stdout, w, err := os.Pipe()
	require.NoError(t, err)
	cmd.Stdout = w
	err = cmd.Start()
	w.Close()
	if err != nil {
		stdout.Close()
		require.NoError(t, err)
	}
	go func() {
		defer stdout.Close()
		defer func() {
			s.mu.Lock()
			s.eof = true
			close(s.notify)
			s.mu.Unlock()
		}()
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			validLine(t, sc.Bytes())
			var e api.Event
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				t.Errorf("oac-shim printed a line that is not a JSON event: %q", sc.Text())
				continue
			}
			s.mu.Lock()
			s.all = append(s.all, e)
			s.raw = append(s.raw, sc.Text())
			close(s.notify)
			s.notify = make(chan struct{})
			s.mu.Unlock()
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

// asUser runs argv as user with a fresh login environment plus env
// (setpriv --reset-env drops the caller's; env execs, as setpriv does).
func asUser(user string, env, argv []string) []string {
	if len(env) > 0 {
		return unprivuser.Argv(user, append(append([]string{"env"}, env...), argv...)...)
	}
	return unprivuser.Argv(user, argv...)
}

// validLine checks one line oac-shim printed against the published event
// schema: every event every e2e test sees is validated.
func validLine(t *testing.T, line []byte) {
	t.Helper()
	if err := schema.Validate(schema.Event, line); err != nil {
		t.Errorf("oac-shim printed a line the event schema refuses: %s\n%v", line, err)
	}
}

// waitFor returns the first event matching pred since the shim started,
// waiting up to timeout for it to arrive.
func (s *shim) waitFor(pred func(api.Event) bool, timeout time.Duration, what string) api.Event {
	s.t.Helper()
	deadline := time.After(timeout)
	i := 0
	for {
		s.mu.Lock()
		for ; i < len(s.all); i++ {
			if pred(s.all[i]) {
				e := s.all[i]
				s.mu.Unlock()
				return e
			}
		}
		eof, notify := s.eof, s.notify
		s.mu.Unlock()
		if eof {
			s.t.Fatalf("oac-shim exited before %s; stderr:\n%s", what, s.stderr.String())
		}
		select {
		case <-notify:
		case <-deadline:
			s.t.Fatalf("no %s within %s", what, timeout)
		}
	}
}

// allEvents returns the events so far and the lines as printed.
func (s *shim) allEvents() ([]api.Event, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]api.Event(nil), s.all...), append([]string(nil), s.raw...)
}

func (s *shim) waitState(state api.State, timeout time.Duration) api.Event {
	s.t.Helper()
	return s.waitFor(func(e api.Event) bool {
		return e.Event == api.KindState && e.State == state
	}, timeout, "state "+string(state))
}

// waitLog returns the first log line with the given prefix.
func (s *shim) waitLog(prefix string, timeout time.Duration) string {
	s.t.Helper()
	e := s.waitFor(func(e api.Event) bool {
		return e.Event == api.KindLog && strings.HasPrefix(e.Line, prefix)
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
	// What it printed last may still be in the pipe: read to its end, so
	// that "the last event" is the shim's last line.
	deadline := time.After(10 * time.Second)
	for {
		s.mu.Lock()
		eof, notify := s.eof, s.notify
		s.mu.Unlock()
		if eof {
			break
		}
		select {
		case <-notify:
		case <-deadline:
			s.t.Fatalf("oac-shim's output did not end within 10 s of its exit")
		}
	}
	return s.cmd.ProcessState.ExitCode()
}

// exited reports whether oac-shim has exited.
func (s *shim) exited() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// exitFailed waits for oac-shim to exit after a failure and checks the
// promise to callers: the last state event is failed with code, and the
// exit status is the one documented for code.
func (s *shim) exitFailed(code string, timeout time.Duration) api.Event {
	s.t.Helper()
	status := s.exit(timeout)
	states := s.find(func(e api.Event) bool { return e.Event == api.KindState })
	if !assert.NotEmpty(s.t, states, "no state event") {
		return api.Event{}
	}
	last := states[len(states)-1]
	assert.Equal(s.t, api.StateFailed, last.State, "the last state")
	assert.Equal(s.t, code, last.Code, "the failure code of %q", last.Message)
	assert.Equal(s.t, api.FailureOf(code).Exit, status, "the exit status for %s", code)
	return last
}

func (s *shim) signal(sig syscall.Signal) {
	s.t.Helper()
	require.NoError(s.t, s.cmd.Process.Signal(sig))
}

// find returns every event printed so far that matches pred.
func (s *shim) find(pred func(api.Event) bool) []api.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []api.Event
	for _, e := range s.all {
		if pred(e) {
			out = append(out, e)
		}
	}
	return out
}

// logLine returns the text after prefix of the first log line printed so
// far that starts with it, or "" (use after waiting for a later line).
func (s *shim) logLine(prefix string) string {
	for _, e := range s.find(func(e api.Event) bool { return e.Event == api.KindLog && strings.HasPrefix(e.Line, prefix) }) {
		return strings.TrimPrefix(e.Line, prefix)
	}
	return ""
}

// lastEvent returns the last event printed.
func (s *shim) lastEvent() api.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.all) == 0 {
		return api.Event{}
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

// procs returns the pids below this shim whose command line contains
// marker: a marker other sandboxes' processes share (a stand-in's own
// command line) counts only this sandbox's.
func (s *shim) procs(marker string) []int {
	mine := map[int]bool{}
	for _, p := range descendants(s.cmd.Process.Pid) {
		mine[p] = true
	}
	var out []int
	for _, p := range hostProcs(marker) {
		if mine[p] {
			out = append(out, p)
		}
	}
	return out
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
