package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/oac/sandbox-agent/internal/kcluster"
)

// The kubernetes group's warm-pool rows: agent-sandbox's controller on the
// same cluster, a SandboxWarmPool of the template oac-shim warm-pool
// writes for the group's flags, and oac-shim-kubernetes run --k8s-api
// agent-sandbox claiming from it, beside a cold run (a bare Pod) of the
// same flags in the same rounds:
//
//   - run to ready, claimed beside cold: process start to the ready event;
//   - claim to bootstrap complete: the shim's own boot phases from the
//     claim's create (the runtime's start) to ready: bound, the Pod's
//     container seen running, the bridge exec'd, the handshake, the
//     bootstrap applied and the daemon healthy (issue goal: 400 ms
//     median); the cold run's same span (its Pod made and started);
//   - kubeDensity claimed at once from a pool of kubeDensity.
//
// Each claimed run waits until the pool is full again, so each claim
// finds a warm Pod; a claim that did not is counted and said.

const (
	kubeWarmTemplate = "bench-oac"
	kubeWarmPool     = "bench-warm"
	kubeWarmReplicas = 2
	kubePoolsPath    = "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/default/sandboxwarmpools"
	kubeTmplsPath    = "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/default/sandboxtemplates"
)

// bootPhases is the shim's "boot phases" debug line (--debug): each phase
// and its duration.
var bootPhases = regexp.MustCompile(`(create|start runtime|guest connects|handshake|bootstrap to ready) ([0-9.]+(?:µs|ms|s))`)

// claimToReady is the span of the boot phases after create (the claim, or
// the bare Pod, made by the runtime's start) to ready.
func claimToReady(stderr string) (time.Duration, error) {
	var sum time.Duration
	seen := 0
	for _, m := range bootPhases.FindAllStringSubmatch(stderr, -1) {
		if m[1] == "create" {
			continue
		}
		d, err := time.ParseDuration(m[2])
		if err != nil {
			return 0, err
		}
		sum += d
		seen++
	}
	if seen != 4 {
		return 0, fmt.Errorf("the shim's boot phases (--debug) were not in its stderr: %q", stderr)
	}
	return sum, nil
}

// phasesOf is the phases of a "boot phases" line.
func phasesOf(line string) string {
	var parts []string
	for _, m := range bootPhases.FindAllString(line, -1) {
		parts = append(parts, m)
	}
	return strings.Join(parts, ", ")
}

// warm runs the warm-pool rows.
func (k *kubeRun) warm(ctx context.Context, runs int) (err error) {
	c := k.c
	t0 := time.Now()
	if err := c.StartAgentSandbox(ctx, kcluster.AgentSandboxOptions{BinDir: os.Getenv("KCLUSTER_AGENT_SANDBOX_DIR")}); err != nil {
		k.r.Skip("kubernetes: warm pool rows", "agent-sandbox did not start: "+firstLine(err.Error()))
		return nil
	}
	// Whatever happens, the pool and its Pods go before the group's
	// leftover check.
	defer func() {
		if e := k.removePool(ctx); err == nil {
			err = e
		}
	}()
	if err := k.applyPool(ctx, kubeWarmReplicas); err != nil {
		return fmt.Errorf("kubernetes: warm pool: %w", err)
	}
	if err := k.waitPool(ctx, kubeWarmReplicas, 4*time.Minute); err != nil {
		return fmt.Errorf("kubernetes: warm pool: %w", err)
	}
	k.r.Add(NewResult(fmt.Sprintf("kubernetes: agent-sandbox started and a warm pool of %d ready (controller, CRDs, template, pool)", kubeWarmReplicas), "ms", []float64{ms(time.Since(t0))}, "", nil))

	claimArgs := append(append([]string{}, k.args...), "--k8s-api", "agent-sandbox", "--k8s-warm-pool", kubeWarmPool, "--debug")
	coldArgs := append(append([]string{}, k.args...), "--debug")
	var coldSpan, warmSpan []float64
	var coldPhases, warmPhases string
	missed := 0
	one := func(args []string, span *[]float64, claimed bool) func() (float64, error) {
		return func() (float64, error) {
			if claimed {
				n, err := k.poolReady(ctx)
				if err != nil {
					return 0, err
				}
				if n < kubeWarmReplicas {
					missed++
				}
			}
			s, err := k.startWith(args, kubeBootTimeout)
			if err != nil {
				return 0, err
			}
			// The phases are logged just after the ready event: read
			// them once the shim has exited.
			if err := k.stop(s); err != nil {
				return 0, fmt.Errorf("stop: %w", err)
			}
			d, perr := claimToReady(s.phases.String())
			if claimed {
				warmPhases = phasesOf(s.phases.String())
			} else {
				coldPhases = phasesOf(s.phases.String())
			}
			if perr != nil {
				return 0, perr
			}
			*span = append(*span, ms(d))
			if claimed {
				// The next claim finds the pool full again.
				if err := k.waitPool(ctx, kubeWarmReplicas, 2*time.Minute); err != nil {
					return 0, err
				}
			}
			return ms(s.ready), nil
		}
	}
	// One of each first, not counted.
	if _, err := one(coldArgs, new([]float64), false)(); err != nil {
		return fmt.Errorf("kubernetes: cold run: %w", err)
	}
	if _, err := one(claimArgs, new([]float64), true)(); err != nil {
		return fmt.Errorf("kubernetes: claimed run: %w", err)
	}
	missed = 0
	cold, warm, err := Pair(runs, one(coldArgs, &coldSpan, false), one(claimArgs, &warmSpan, true))
	if err != nil {
		return fmt.Errorf("kubernetes: warm pool rows: %w", err)
	}
	note := fmt.Sprintf("each claim found the pool's %d Pods ready", kubeWarmReplicas)
	if missed > 0 {
		note = fmt.Sprintf("%d of %d claims found the pool short of a ready Pod", missed, runs)
	}
	res := NewResult("kubernetes: run to ready, claimed from an agent-sandbox warm pool (--k8s-api agent-sandbox)", "ms", warm,
		"the same flags, a bare Pod made for the sandbox (cold)", cold)
	res.Note = note + "; the last run's boot phases, claimed: " + warmPhases + "; cold: " + coldPhases
	k.r.Add(res)
	span := Summarise(warmSpan)
	k.r.Add(NewResult("kubernetes: claim to bootstrap complete, from a warm pool (the shim's boot phases after create: claim bound, Pod running, bridge, handshake, bootstrap and daemon health)", "ms", warmSpan,
		"the cold run's same span (its Pod made and started)", coldSpan).Judge("median at most 400 ms", span.Median <= 400))

	return k.warmDensity(ctx, kubeDensity, claimArgs)
}

// removePool deletes the pool and its template and waits until the
// pool's Pods are gone (they carry the provider's label, which the
// group's leftover check looks for).
func (k *kubeRun) removePool(ctx context.Context) error {
	c := k.c
	if err := c.Do(ctx, http.MethodDelete, kubePoolsPath+"/"+kubeWarmPool, nil, nil); err != nil && !kcluster.IsNotFound(err) {
		return fmt.Errorf("kubernetes: delete the warm pool: %w", err)
	}
	if err := c.Do(ctx, http.MethodDelete, kubeTmplsPath+"/"+kubeWarmTemplate, nil, nil); err != nil && !kcluster.IsNotFound(err) {
		return fmt.Errorf("kubernetes: delete the warm pool's template: %w", err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var pods struct{ Items []any }
		err := c.Get(ctx, "/api/v1/namespaces/default/pods?labelSelector=app.kubernetes.io%2Fmanaged-by%3Doac-shim", &pods)
		if err == nil && len(pods.Items) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kubernetes: the warm pool's Pods not gone within 2m of its deletion (%d left, %v)", len(pods.Items), err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// warmDensity claims n sandboxes at the same moment from a pool of n.
func (k *kubeRun) warmDensity(ctx context.Context, n int, claimArgs []string) error {
	if err := k.applyPool(ctx, n); err != nil {
		return err
	}
	if err := k.waitPool(ctx, int32(n), 4*time.Minute); err != nil {
		k.r.Skip(fmt.Sprintf("kubernetes: %d claimed at once from a warm pool of %d", n, n), firstLine(err.Error()))
		return k.applyPool(ctx, 0)
	}
	type res struct {
		s   *sandboxProc
		err error
	}
	ch := make(chan res, n)
	release := make(chan struct{})
	for range n {
		go func() {
			<-release
			s, err := k.startWith(claimArgs, kubeBootTimeout)
			ch <- res{s, err}
		}()
	}
	t := time.Now()
	close(release)
	var readyEach, spans []float64
	var started []*sandboxProc
	var firstErr error
	for range n {
		x := <-ch
		if x.err != nil && firstErr == nil {
			firstErr = x.err
		}
		if x.s != nil {
			readyEach = append(readyEach, ms(x.s.ready))
			started = append(started, x.s)
		}
	}
	allReady := ms(time.Since(t))
	// The pool refills while they run; stop it first so that nothing
	// competes with the stops.
	err := k.applyPool(ctx, 0)
	k.stopAll()
	for _, s := range started {
		if d, err := claimToReady(s.phases.String()); err == nil {
			spans = append(spans, ms(d))
		}
	}
	ready := NewResult(fmt.Sprintf("kubernetes: %d claimed at once from a warm pool of %d, ready", n, n), "sandboxes", []float64{float64(len(readyEach))}, "", nil).
		Judge(fmt.Sprintf("all %d ready", n), firstErr == nil)
	if firstErr != nil {
		ready.Note = "the first failure: " + firstLine(firstErr.Error())
	}
	k.r.Add(ready)
	k.r.Add(NewResult(fmt.Sprintf("kubernetes: time to all ready, %d claimed at once from a warm pool", n), "ms", []float64{allReady}, "", nil))
	if len(readyEach) > 0 {
		k.r.Add(NewResult(fmt.Sprintf("kubernetes: each claimed sandbox's run to ready, %d at once", n), "ms", readyEach, "", nil))
	}
	if len(spans) > 0 {
		k.r.Add(NewResult(fmt.Sprintf("kubernetes: each claim to bootstrap complete, %d at once", n), "ms", spans, "", nil))
	}
	return err
}

// applyPool makes the template and a pool of replicas from what oac-shim
// warm-pool writes for the group's flags, or sets an existing pool's
// replicas.
func (k *kubeRun) applyPool(ctx context.Context, replicas int) error {
	c := k.c
	var have map[string]any
	if err := c.Get(ctx, kubePoolsPath+"/"+kubeWarmPool, &have); err == nil {
		spec, _ := have["spec"].(map[string]any)
		if spec == nil {
			return fmt.Errorf("the warm pool has no spec: %v", have)
		}
		spec["replicas"] = replicas
		return c.Do(ctx, http.MethodPut, kubePoolsPath+"/"+kubeWarmPool, have, nil)
	}
	out, err := exec.CommandContext(ctx, k.shim, []string{"warm-pool", "--template", kubeWarmTemplate, "--pool", kubeWarmPool,
		"--replicas", strconv.Itoa(replicas), "--k8s-image", kubeImageRef, "--k8s-pull-policy", "Never"}...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		return fmt.Errorf("oac-shim-kubernetes warm-pool: %w", err)
	}
	docs := bytes.Split(out, []byte("\n---\n"))
	if len(docs) != 2 {
		return fmt.Errorf("oac-shim-kubernetes warm-pool wrote %d documents, want 2", len(docs))
	}
	for i, path := range []string{kubeTmplsPath, kubePoolsPath} {
		var obj map[string]any
		if err := yaml.Unmarshal(docs[i], &obj); err != nil {
			return err
		}
		if err := c.Do(ctx, http.MethodPost, path, obj, nil); err != nil {
			return err
		}
	}
	return nil
}

// poolReady is the pool's count of ready Pods.
func (k *kubeRun) poolReady(ctx context.Context) (int32, error) {
	var pool struct{ Status struct{ ReadyReplicas int32 } }
	err := k.c.Get(ctx, kubePoolsPath+"/"+kubeWarmPool, &pool)
	return pool.Status.ReadyReplicas, err
}

// waitPool waits until the pool has n ready Pods.
func (k *kubeRun) waitPool(ctx context.Context, n int32, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		have, err := k.poolReady(ctx)
		if err == nil && have >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the warm pool has %d of %d Pods ready after %s (%v)", have, n, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// lineCatch keeps the first whole line written to it that holds want.
type lineCatch struct {
	mu      sync.Mutex
	want    []byte
	partial []byte
	line    string
}

func (l *lineCatch) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.line != "" {
		return len(p), nil
	}
	l.partial = append(l.partial, p...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		if bytes.Contains(l.partial[:i], l.want) {
			l.line, l.partial = string(l.partial[:i]), nil
			return len(p), nil
		}
		l.partial = l.partial[i+1:]
	}
	if len(l.partial) > 64<<10 {
		l.partial = nil // no line of ours is this long
	}
	return len(p), nil
}

func (l *lineCatch) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.line
}
