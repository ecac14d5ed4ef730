package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/oac/sandbox-agent/internal/yamux"
	"github.com/oac/sandbox-agent/protocol"
	"github.com/oac/sandbox-agent/protocol/transport"
)

// Bins locates the binaries under test, and the stand-in fixtures for
// oac-sandbox-io and the daemon ("" when make fixtures has not run).
type Bins struct{ Shim, Guest, SandboxIO, Daemon string }

// sandboxProc is a running oac-shim with one bwrap sandbox.
type sandboxProc struct {
	cmd   *exec.Cmd
	ready time.Duration
	// phases holds the shim's "boot phases" line (with --debug), where
	// the starter catches it.
	phases *lineCatch
}

var nameSeq struct {
	sync.Mutex
	n int
}

func benchName() string {
	nameSeq.Lock()
	defer nameSeq.Unlock()
	nameSeq.n++
	return fmt.Sprintf("bench-%d-%d", os.Getpid(), nameSeq.n)
}

// startSandbox starts oac-shim with the bwrap provider and waits for the
// ready event.
func startSandbox(b Bins, timeout time.Duration) (*sandboxProc, error) {
	return startSandboxWith(b, timeout, "--provider", "bwrap")
}

// startSandboxWith starts oac-shim with extra arguments (the provider) and
// waits for the ready event.
func startSandboxWith(b Bins, timeout time.Duration, extra ...string) (*sandboxProc, error) {
	return startCommand(b, timeout, "run", benchName(), extra...)
}

// startCommand starts oac-shim COMMAND (run, or start of a kept sandbox)
// for the sandbox name with extra arguments and waits for the ready
// event.
func startCommand(b Bins, timeout time.Duration, command, name string, extra ...string) (*sandboxProc, error) {
	cmd := exec.Command(b.Shim, append([]string{command, "--name", name, "--agent", b.Guest}, extra...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	readyc := make(chan time.Duration, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if bytes.Contains(sc.Bytes(), []byte(`"state":"ready"`)) {
				readyc <- time.Since(start)
			}
		}
		close(readyc)
	}()
	select {
	case d, ok := <-readyc:
		if !ok {
			_ = cmd.Wait()
			return nil, fmt.Errorf("%w: %s", errNoReady, strings.TrimSpace(stderr.String()))
		}
		return &sandboxProc{cmd: cmd, ready: d}, nil
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("%w within %s", errNoReady, timeout)
	}
}

func (s *sandboxProc) stop() error {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	return s.cmd.Wait()
}

// bareBwrap is the bare runtime doing nothing: bwrap with the same
// namespaces and a read-only /usr running /bin/true.
func bareBwrap() (float64, error) {
	args := []string{"--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup",
		"--die-with-parent", "--as-pid-1", "--ro-bind", "/usr", "/usr"}
	for _, p := range []string{"/bin", "/sbin", "/lib", "/lib64"} {
		if t, err := os.Readlink(p); err == nil {
			args = append(args, "--symlink", t, p)
		}
	}
	args = append(args, "--proc", "/proc", "--dev", "/dev", "/bin/true")
	t := time.Now()
	if out, err := exec.Command("bwrap", args...).CombinedOutput(); err != nil {
		return 0, fmt.Errorf("bare bwrap: %v: %s", err, out)
	}
	return ms(time.Since(t)), nil
}

// shimToReady returns a measurement: oac-shim run with args started, its
// time to the ready event, then stopped.
func shimToReady(b Bins, timeout time.Duration, args ...string) func() (float64, error) {
	return func() (float64, error) {
		s, err := startSandboxWith(b, timeout, args...)
		if err != nil {
			return 0, err
		}
		d := s.ready
		if err := s.stop(); err != nil {
			return 0, fmt.Errorf("stop: %w", err)
		}
		return ms(d), nil
	}
}

// BootFigures measures bwrap boot to ready and agent start.
func BootFigures(r *Report, b Bins, runs int) error {
	base, subj, err := Pair(runs, bareBwrap, shimToReady(b, 30*time.Second, "--provider", "bwrap"))
	if err != nil {
		return fmt.Errorf("bwrap boot: %w", err)
	}
	res := NewResult("bwrap: oac-shim start to ready event", "ms", subj, "bare bwrap running /bin/true", base)
	r.Add(res.Judge("≤ 3x bare bwrap", res.Ratio <= 3))

	trueExec := func() (float64, error) {
		t := time.Now()
		err := exec.Command("/bin/true").Run()
		return ms(time.Since(t)), err
	}
	hello := func() (float64, error) { return agentToHello(b.Guest) }
	base, subj, err = Pair(runs, trueExec, hello)
	if err != nil {
		return fmt.Errorf("agent start: %w", err)
	}
	res = NewResult("agent start: exec of oac-guest to Hello received", "ms", subj, "exec of /bin/true to exit", base)
	r.Add(res.Judge("< 5 ms", res.Subject.Median < 5))
	return nil
}

// agentToHello execs oac-guest over stdio and times the Hello's arrival.
func agentToHello(guest string) (float64, error) {
	cmd := exec.Command(guest, "--transport", "stdio://")
	in, err := cmd.StdinPipe()
	if err != nil {
		return 0, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	t := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	sess, err := yamux.Server(transport.StreamConn(out, in, "guest"), protocol.MuxConfig(nil))
	if err != nil {
		return 0, err
	}
	defer sess.Close()
	st, err := sess.Accept()
	if err != nil {
		return 0, err
	}
	if _, err := protocol.ReadStreamHeader(st, 5*time.Second); err != nil {
		return 0, err
	}
	var h protocol.Hello
	if err := protocol.ReadMessage(st, protocol.MaxControlFrame, protocol.TypeHello, &h); err != nil {
		return 0, err
	}
	return ms(time.Since(t)), nil
}

// rssKB returns VmRSS of pid in KiB.
func rssKB(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				return strconv.ParseFloat(f[0], 64)
			}
		}
	}
	return 0, fmt.Errorf("no VmRSS for %d", pid)
}

// children returns the child pids of pid (of all its threads: a Go
// program forks from whichever thread runs the goroutine).
func children(pid int) []int {
	var out []int
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, t := range tasks {
		b, _ := os.ReadFile(t)
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// tree returns pid and all its descendants.
func tree(pid int) []int {
	out := []int{pid}
	for _, c := range children(pid) {
		out = append(out, tree(c)...)
	}
	return out
}

// FootprintFigures measures binary size, the agent's idle RSS and the
// shim's RSS per sandbox.
func FootprintFigures(r *Report, b Bins, runs int) error {
	st, err := os.Stat(b.Guest)
	if err != nil {
		return err
	}
	size := float64(st.Size()) / (1 << 20)
	r.Add(NewResult("oac-guest static binary size", "MiB", []float64{size}, "", nil).Judge("< 12 MiB", size < 12))
	var agent, shim []float64
	for range runs {
		s, err := startSandbox(b, 30*time.Second)
		if err != nil {
			return err
		}
		time.Sleep(500 * time.Millisecond) // idle
		pids := tree(s.cmd.Process.Pid)
		if len(pids) < 3 {
			_ = s.stop()
			return fmt.Errorf("footprint: expected shim, bwrap and agent, found %v", pids)
		}
		sk, err1 := rssKB(pids[0])
		ak, err2 := rssKB(pids[len(pids)-1])
		_ = s.stop()
		if err1 != nil || err2 != nil {
			return fmt.Errorf("footprint: %v %v", err1, err2)
		}
		shim, agent = append(shim, sk/1024), append(agent, ak/1024)
	}
	res := NewResult("oac-guest RSS idle (PID 1 in bwrap)", "MiB", agent, "", nil)
	r.Add(res.Judge("< 12 MiB", res.Subject.Median < 12))
	r.Add(NewResult("oac-shim RSS per sandbox (one sandbox, idle)", "MiB", shim, "", nil))
	return nil
}

// DensityFigures starts n sandboxes at once and reports time to all ready
// and memory per sandbox (shim, bwrap and guest processes).
func DensityFigures(r *Report, b Bins, n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	type res struct {
		s   *sandboxProc
		err error
	}
	ch := make(chan res, n)
	t := time.Now()
	for range n {
		go func() {
			s, err := startSandbox(b, 2*time.Minute)
			ch <- res{s, err}
		}()
	}
	var started []*sandboxProc
	var firstErr error
	for range n {
		select {
		case x := <-ch:
			if x.err != nil && firstErr == nil {
				firstErr = x.err
			}
			if x.s != nil {
				started = append(started, x.s)
			}
		case <-ctx.Done():
			firstErr = ctx.Err()
		}
	}
	allReady := ms(time.Since(t))
	time.Sleep(500 * time.Millisecond)
	var per []float64
	for _, s := range started {
		total := 0.0
		for _, p := range tree(s.cmd.Process.Pid) {
			kb, err := rssKB(p)
			if err == nil {
				total += kb
			}
		}
		per = append(per, total/1024)
	}
	var wg sync.WaitGroup
	for _, s := range started {
		wg.Add(1)
		go func() { defer wg.Done(); _ = s.stop() }()
	}
	wg.Wait()
	ready := NewResult(fmt.Sprintf("density: %d bwrap sandboxes started at once, ready", n), "sandboxes", []float64{float64(len(started))}, "", nil)
	ready = ready.Judge(fmt.Sprintf("all %d ready", n), firstErr == nil)
	if firstErr != nil {
		ready.Note = "first failure: " + firstErr.Error()
	}
	r.Add(ready)
	r.Add(NewResult(fmt.Sprintf("density: time to all ready, %d started at once", n), "ms", []float64{allReady}, "", nil))
	if len(per) > 0 {
		r.Add(NewResult(fmt.Sprintf("density: memory per sandbox (RSS of shim + bwrap + guest) at %d running", len(per)), "MiB", per, "", nil))
		r.Add(NewResult("density: sandboxes that fit a 4 GiB budget at that memory per sandbox", "sandboxes", []float64{float64(int(4096 / Summarise(per).Median))}, "", nil))
	}
	return nil
}

// FindBins returns the binaries in dir.
func FindBins(dir string) (Bins, error) {
	b := Bins{Shim: filepath.Join(dir, "oac-shim"), Guest: filepath.Join(dir, "oac-guest")}
	for _, p := range []string{b.Shim, b.Guest} {
		if _, err := os.Stat(p); err != nil {
			return b, fmt.Errorf("%s: %w (run make build)", p, err)
		}
	}
	for _, f := range []struct {
		dst  *string
		name string
	}{{&b.SandboxIO, "sandbox-io-standin"}, {&b.Daemon, "daemon-standin"}} {
		if p := filepath.Join(dir, "fixtures", f.name); fileExists(p) {
			*f.dst, _ = filepath.Abs(p)
		}
	}
	return b, nil
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}
