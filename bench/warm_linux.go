package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/oac/sandbox-agent/imagebuild"
	"github.com/oac/sandbox-agent/internal/dockerd"
	"github.com/oac/sandbox-agent/internal/proctree"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

// Warm sandboxes (docs/warm.md): a sandbox booted with --warm up to "agent
// connected, no bootstrap", then claimed with the hosted bootstrap, beside
// the same provider's cold hosted boot; the memory and idle CPU of warm
// sandboxes held; and a pool refilled while it is claimed from.

// WarmGroup is the group (oac-bench -only) of these rows; they carry it,
// so -merge can replace them (and its skips begin with it, for the same).
const WarmGroup = "warm"

// warmSettle is how long a warm sandbox idles before its claim: a pool's
// sandbox has been warm a while, so the guest's own start is behind it.
const warmSettle = 200 * time.Millisecond

// mark is one event of a shim's stdout the bench times.
type mark struct {
	kind string // warm, complete, ready, answer, ended
	at   time.Time
	err  string // an answer's error, an ending's state and message
}

// shimRun is a running oac-shim whose events are watched for marks.
type shimRun struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser // nil unless --control stdin
	marks  chan mark
	stderr bytes.Buffer
	start  time.Time
	warmAt time.Time // its warm event, for a warm one
}

// startShim starts oac-shim run with args (stdin kept open as its control
// input when control); the clock of start is taken just before the exec.
func startShim(b Bins, control bool, args ...string) (*shimRun, error) {
	s := &shimRun{marks: make(chan mark, 64)}
	s.cmd = exec.Command(b.Shim, append([]string{"run", "--name", benchName(), "--agent", b.Guest}, args...)...)
	if control {
		in, err := s.cmd.StdinPipe()
		if err != nil {
			return nil, err
		}
		s.stdin = in
	}
	out, err := s.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	s.cmd.Stderr = &s.stderr
	s.start = time.Now()
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	go s.watch(out)
	return s, nil
}

// watch reads the events, timing each line as it arrives.
func (s *shimRun) watch(out io.Reader) {
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	send := func(m mark) {
		select {
		case s.marks <- m:
		default: // nobody reads that many marks: the run is over
		}
	}
	for sc.Scan() {
		at := time.Now()
		var ev struct {
			Event, State, Message, Error string
			OK                           bool
		}
		if json.Unmarshal(sc.Bytes(), &ev) != nil {
			continue
		}
		switch {
		case ev.Event == "answer":
			m := mark{kind: "answer", at: at}
			if !ev.OK {
				m.err = ev.Error
			}
			send(m)
		case ev.Event != "state":
		case ev.State == "warm":
			send(mark{kind: "warm", at: at})
		case ev.State == "ready":
			send(mark{kind: "ready", at: at})
		case ev.State == "starting" && strings.HasPrefix(ev.Message, "guest: bootstrap complete"):
			send(mark{kind: "complete", at: at})
		case ev.State == "stopped" || ev.State == "failed":
			send(mark{kind: "ended", at: at, err: ev.State + ": " + ev.Message})
		}
	}
	send(mark{kind: "ended", at: time.Now(), err: "events ended"})
}

// wait returns the time of the next mark of kind; an ending, a refused
// answer or the timeout first is an error.
func (s *shimRun) wait(kind string, timeout time.Duration) (time.Time, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case m := <-s.marks:
			switch {
			case m.kind == kind:
				return m.at, nil
			case m.kind == "answer" && m.err != "":
				return time.Time{}, fmt.Errorf("claim refused: %s", m.err)
			case m.kind == "ended":
				return time.Time{}, fmt.Errorf("no %s event: %s: %s", kind, m.err, strings.TrimSpace(lastLines(s.stderr.String(), 5)))
			}
		case <-t.C:
			return time.Time{}, fmt.Errorf("no %s event within %s", kind, timeout)
		}
	}
}

// stop ends the shim with SIGTERM as its operator would.
func (s *shimRun) stop() error {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	err := s.cmd.Wait()
	if s.stdin != nil {
		_ = s.stdin.Close()
	}
	return err
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}

// claimTimes is one boot's figures, in ms: to bootstrap complete and to
// ready, from the start (cold) or the claim (warm).
type claimTimes struct{ complete, ready float64 }

// coldHosted boots a hosted sandbox with --bootstrap and times start to
// bootstrap complete and start to ready.
func coldHosted(b Bins, args []string) (claimTimes, error) {
	s, err := startShim(b, false, args...)
	if err != nil {
		return claimTimes{}, err
	}
	defer s.stop()
	return s.since(s.start)
}

// since times bootstrap complete and ready from t.
func (s *shimRun) since(t time.Time) (claimTimes, error) {
	c, err := s.wait("complete", time.Minute)
	if err != nil {
		return claimTimes{}, err
	}
	r, err := s.wait("ready", time.Minute)
	if err != nil {
		return claimTimes{}, err
	}
	return claimTimes{ms(c.Sub(t)), ms(r.Sub(t))}, nil
}

// bootWarm starts a warm sandbox and waits for its warm event.
func bootWarm(b Bins, args []string) (*shimRun, error) {
	s, err := startShim(b, true, append([]string{"--warm", "--control", "stdin"}, args...)...)
	if err != nil {
		return nil, err
	}
	if s.warmAt, err = s.wait("warm", time.Minute); err != nil {
		_ = s.stop()
		return nil, err
	}
	return s, nil
}

// claim writes the claim line and times it to bootstrap complete and
// ready; the clock starts as the line is written.
func (s *shimRun) claim(line []byte) (claimTimes, error) {
	t := time.Now()
	if _, err := s.stdin.Write(line); err != nil {
		return claimTimes{}, err
	}
	return s.since(t)
}

// warmHosted boots a warm sandbox (untimed), lets it idle warmSettle,
// then claims it with the hosted bootstrap.
func warmHosted(b Bins, args []string, line []byte) (claimTimes, error) {
	s, err := bootWarm(b, args)
	if err != nil {
		return claimTimes{}, err
	}
	defer s.stop()
	time.Sleep(warmSettle)
	return s.claim(line)
}

// claimLine is the claim command carrying the hosted bootstrap, with the
// identity a cold run gives as flags in its sandbox object.
func claimLine() ([]byte, error) {
	doc := hostedDoc()
	doc.Sandbox = &bootstrap.Identity{TenantID: hostedIdentity[1], EnvironmentID: hostedIdentity[3], AllocationID: hostedIdentity[5]}
	line, err := json.Marshal(map[string]any{"id": "1", "cmd": "claim", "bootstrap": doc})
	return append(line, '\n'), err
}

// WarmFigures measures warm sandboxes per provider (bwrap, runc, crun,
// docker where an engine starts, qemu under software emulation where it
// and vm's kernel are here), then memory, idle CPU and refill with bwrap.
func WarmFigures(r *Report, b Bins, runs int, vm VMArch) error {
	if b.SandboxIO == "" || b.Daemon == "" {
		r.Skip(WarmGroup+" sandbox figures", "need the stand-in fixtures (make fixtures: bin/fixtures/)")
		return nil
	}
	line, err := claimLine()
	if err != nil {
		return err
	}
	dir, boot, operator, cleanup, err := hostedSetup(b, "oac-bench-warm-")
	if err != nil {
		return err
	}
	defer cleanup()
	cold := append([]string{"--bootstrap", boot}, append(operator, hostedIdentity...)...)
	compare := func(label string, goal bool, provider ...string) error {
		if err := warmBesideCold(r, b, runs, label, goal, append(append([]string(nil), provider...), cold...),
			append(append([]string(nil), provider...), operator...), line); err != nil {
			return fmt.Errorf("warm, %s: %w", label, err)
		}
		return nil
	}

	_, errB := exec.LookPath("bwrap")
	if errB != nil {
		r.Skip(WarmGroup+" with bwrap", "bubblewrap is not installed")
	} else if err := compare("bwrap", true, "--provider", "bwrap"); err != nil {
		return err
	}
	for _, rt := range []string{"runc", "crun"} {
		if _, err := exec.LookPath(rt); err != nil {
			r.Skip(WarmGroup+" with oci "+rt, rt+" is not installed")
		} else if err := compare("oci "+rt, true, "--provider", "oci", "--runtime", rt); err != nil {
			return err
		}
	}
	if err := warmDocker(r, b, dir, compare); err != nil {
		return err
	}
	if err := warmQemu(r, b, vm, dir, compare); err != nil {
		return err
	}
	if errB != nil {
		r.Skip(WarmGroup+": held and refilled bwrap sandboxes", "bubblewrap is not installed")
		return nil
	}
	bw := append([]string{"--provider", "bwrap"}, operator...)
	if err := warmHeld(r, b, 4, bw); err != nil {
		return fmt.Errorf("warm held: %w", err)
	}
	if err := warmRefill(r, b, 4, 2, 20, bw, line); err != nil {
		return fmt.Errorf("warm refill: %w", err)
	}
	return nil
}

// warmDocker runs compare on the docker provider with the image and
// engine the hosted rows use (dockerBench).
func warmDocker(r *Report, b Bins, dir string, compare func(string, bool, ...string) error) error {
	if missing := dockerd.Missing(); missing != "" {
		r.Skip(WarmGroup+" with docker", missing)
		return nil
	}
	dockerDir := filepath.Join(dir, "docker")
	if err := os.Mkdir(dockerDir, 0o755); err != nil {
		return err
	}
	_, ref, done, err := dockerBench(context.Background(), b, dockerDir, []imagebuild.ExtraFile{{Src: b.Daemon, Dst: hostedDaemon, Mode: 0o755}})
	if err != nil {
		var nd noDocker
		if errors.As(err, &nd) {
			r.Skip(WarmGroup+" with docker", err.Error())
			return nil
		}
		return err
	}
	defer done()
	return compare("docker", false, "--provider", "docker", "--docker-image", ref)
}

// warmQemu runs compare on a qemu guest under software emulation (TCG),
// booting the image's initramfs; the stand-ins come in as --sandbox-io
// and --install, as on every row. Its cold boot is seconds: the warm
// claim is what a pool of VMs saves.
func warmQemu(r *Report, b Bins, vm VMArch, dir string, compare func(string, bool, ...string) error) error {
	bin, _, _ := qemuArchArgs(vm.Arch)
	label := fmt.Sprintf("qemu %s (TCG)", vm.Arch)
	if _, err := exec.LookPath(bin); err != nil {
		r.Skip(WarmGroup+" with "+label, "needs "+bin+" (apt-get install qemu-system-x86)")
		return nil
	}
	if _, err := os.Stat(filepath.Join(vm.KernelCache, "modules", "modules.dep")); err != nil {
		r.Skip(WarmGroup+" with "+label, "needs the kernel cache "+vm.KernelCache+" (make kernels)")
		return nil
	}
	if vm.Arch != runtime.GOARCH {
		r.Skip(WarmGroup+" with "+label, "the warm rows boot this machine's own architecture")
		return nil
	}
	kernel, initrd, _, err := vmImage(b.Guest, vm, filepath.Join(dir, "qemu-image"))
	if err != nil {
		return err
	}
	return compare(label, false, "--provider", "qemu", "--kernel", kernel, "--initramfs", initrd, "--accel", "tcg", "--boot-timeout", "120s")
}

// warmBesideCold interleaves cold hosted boots and warm claims of one
// provider and adds its three rows.
func warmBesideCold(r *Report, b Bins, runs int, label string, goal bool, coldArgs, warmArgs []string, line []byte) error {
	var coldT, warmT []claimTimes
	_, err := Interleave(runs,
		func() (float64, error) {
			t, err := coldHosted(b, coldArgs)
			coldT = append(coldT, t)
			return t.complete, err
		},
		func() (float64, error) {
			t, err := warmHosted(b, warmArgs, line)
			warmT = append(warmT, t)
			return t.complete, err
		})
	if err != nil {
		return err
	}
	pick := func(ts []claimTimes, f func(claimTimes) float64) []float64 {
		out := make([]float64, len(ts))
		for i, t := range ts {
			out[i] = f(t)
		}
		return out
	}
	complete := func(t claimTimes) float64 { return t.complete }
	ready := func(t claimTimes) float64 { return t.ready }
	daemon := func(t claimTimes) float64 { return t.ready - t.complete }
	res := NewResult(WarmGroup+", "+label+": claim to bootstrap complete", "ms", pick(warmT, complete),
		"cold: oac-shim start to bootstrap complete", pick(coldT, complete))
	if goal {
		res = res.Judge("≤ 20 ms", res.Subject.Median <= 20)
	}
	r.Add(res)
	r.Add(NewResult(WarmGroup+", "+label+": claim to ready", "ms", pick(warmT, ready),
		"cold: oac-shim start to ready", pick(coldT, ready)))
	r.Add(NewResult(WarmGroup+", "+label+": bootstrap complete to ready (daemon to healthy), claimed", "ms", pick(warmT, daemon),
		"the same, cold", pick(coldT, daemon)))
	return nil
}

// bootWarmN boots n warm sandboxes, at most two at once.
func bootWarmN(b Bins, n int, args []string) ([]*shimRun, error) {
	var (
		mu    sync.Mutex
		out   []*shimRun
		first error
		wg    sync.WaitGroup
	)
	sem := make(chan struct{}, 2)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			s, err := bootWarm(b, args)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && first == nil {
				first = err
			}
			if s != nil {
				out = append(out, s)
			}
		}()
	}
	wg.Wait()
	if first != nil {
		stopAll(out)
		return nil, first
	}
	return out, nil
}

func stopAll(ss []*shimRun) {
	var wg sync.WaitGroup
	for _, s := range ss {
		wg.Add(1)
		go func() { defer wg.Done(); _ = s.stop() }()
	}
	wg.Wait()
}

// treeOf returns the shim's process and all below it (for bwrap, the
// sandbox's processes are all there).
func treeOf(all []proctree.Proc, pid int) []proctree.Proc {
	for _, p := range all {
		if p.PID == pid {
			return append([]proctree.Proc{p}, proctree.Descendants(all, pid)...)
		}
	}
	return nil
}

// cpuMS is the CPU time of pid's threads in ms, from schedstat (in ns:
// /proc/PID/stat counts ticks of 10 ms, and an idle sandbox uses less).
func cpuMS(pid int) float64 {
	files, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	var ns float64
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // the thread ended
		}
		if fs := strings.Fields(string(b)); len(fs) > 0 {
			v, _ := strconv.ParseFloat(fs[0], 64)
			ns += v
		}
	}
	return ns / 1e6
}

// warmHeld holds n warm bwrap sandboxes and measures each one's memory
// (RSS of the shim and the sandbox's processes) and CPU over 10 s idle.
func warmHeld(r *Report, b Bins, n int, args []string) error {
	ss, err := bootWarmN(b, n, args)
	if err != nil {
		return err
	}
	defer stopAll(ss)
	time.Sleep(time.Second) // settle
	const idle = 10 * time.Second
	all := proctree.All()
	before := make([]float64, len(ss))
	for i, s := range ss {
		for _, p := range treeOf(all, s.cmd.Process.Pid) {
			before[i] += cpuMS(p.PID)
		}
	}
	time.Sleep(idle)
	all = proctree.All()
	var mem, cpu []float64
	for i, s := range ss {
		tree := treeOf(all, s.cmd.Process.Pid)
		if len(tree) < 3 {
			return fmt.Errorf("expected shim, bwrap and agent, found %d processes", len(tree))
		}
		var kb, used float64
		for _, p := range tree {
			used += cpuMS(p.PID)
			if k, err := rssKB(p.PID); err == nil {
				kb += k
			}
		}
		mem = append(mem, kb/1024)
		cpu = append(cpu, used-before[i])
	}
	r.Add(NewResult(fmt.Sprintf("%s: memory per warm bwrap sandbox (RSS of shim + bwrap + guest), %d held", WarmGroup, n), "MiB", mem, "", nil))
	r.Add(NewResult(fmt.Sprintf("%s: CPU per warm bwrap sandbox over %s idle, %d held", WarmGroup, idle, n), "ms CPU", cpu, "", nil))
	return nil
}

// warmRefill keeps a pool of size warm bwrap sandboxes, claims one a
// second for claims seconds and starts a new warm one for each claimed
// (at most boots at once); a claim that finds the pool empty waits for
// the next sandbox to be warm (a miss).
func warmRefill(r *Report, b Bins, size, boots, claims int, args []string, line []byte) error {
	pool, err := bootWarmN(b, size, args)
	if err != nil {
		return err
	}
	var (
		mu      sync.Mutex
		claimed []*shimRun
		refills sync.WaitGroup
		bootErr error
		toWarm  []float64 // a refill's start to its warm event
	)
	warm := make(chan *shimRun, size+claims)
	for _, s := range pool {
		warm <- s
	}
	defer func() {
		refills.Wait()
		close(warm)
		for s := range warm {
			claimed = append(claimed, s)
		}
		stopAll(claimed)
	}()
	sem := make(chan struct{}, boots)
	refill := func() {
		refills.Add(1)
		go func() {
			defer refills.Done()
			sem <- struct{}{}
			s, err := bootWarm(b, args)
			<-sem
			mu.Lock()
			if err != nil {
				bootErr = err
				mu.Unlock()
				return
			}
			toWarm = append(toWarm, ms(s.warmAt.Sub(s.start)))
			mu.Unlock()
			warm <- s
		}()
	}
	var hits, misses int
	var poolSize, waits, toComplete []float64
	// The pool's size every 10 ms while claims come: its low point is
	// right after a claim, before the refill is warm.
	sampled := make(chan []float64)
	stopSampling := make(chan struct{})
	go func() {
		var xs []float64
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				xs = append(xs, float64(len(warm)))
			case <-stopSampling:
				sampled <- xs
				return
			}
		}
	}()
	defer func() {
		if stopSampling != nil {
			close(stopSampling)
			<-sampled
		}
	}()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for i := range claims {
		if i > 0 {
			<-tick.C
		}
		var s *shimRun
		select {
		case s = <-warm:
			hits++
		default:
			misses++
			t := time.Now()
			select {
			case s = <-warm:
			case <-time.After(time.Minute):
				mu.Lock()
				defer mu.Unlock()
				return fmt.Errorf("no warm sandbox within a minute of a miss (last boot error: %v)", bootErr)
			}
			waits = append(waits, ms(time.Since(t)))
		}
		refill()
		ct, err := s.claim(line)
		claimed = append(claimed, s)
		if err != nil {
			return err
		}
		toComplete = append(toComplete, ct.complete)
	}
	refills.Wait()
	close(stopSampling)
	poolSize = <-sampled
	stopSampling = nil
	mu.Lock()
	defer mu.Unlock()
	if bootErr != nil {
		return bootErr
	}
	name := fmt.Sprintf("%s refill: %d claims at 1/s from %d warm bwrap sandboxes, refilled (≤ %d boots at once)", WarmGroup, claims, size, boots)
	hit := NewResult(name+": hits", "claims", []float64{float64(hits)}, "", nil)
	hit.Note = fmt.Sprintf("misses (waited for a boot): %d", misses)
	if len(waits) > 0 {
		hit.Note += fmt.Sprintf("; wait of a miss median %s ms, max %s ms", fmtNum(Summarise(waits).Median), fmtNum(Summarise(waits).Max))
	}
	r.Add(hit.Judge(fmt.Sprintf("all %d", claims), misses == 0))
	r.Add(NewResult(WarmGroup+" refill: warm sandboxes in the pool, sampled every 10 ms while claimed from", "sandboxes", poolSize, "", nil))
	r.Add(NewResult(WarmGroup+" refill: claim to bootstrap complete while refilling", "ms", toComplete, "", nil))
	r.Add(NewResult(WarmGroup+" refill: a refill's start to its warm event", "ms", toWarm, "", nil))
	return nil
}
