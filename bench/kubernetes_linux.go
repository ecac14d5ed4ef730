package bench

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/oac/sandbox-agent/imagebuild"
	"github.com/oac/sandbox-agent/internal/kcluster"
)

// The kubernetes group: oac-shim-kubernetes on a real single-node cluster
// (internal/kcluster, started and stopped by this group), with the hosted
// bootstrap the hosted rows use. The guest image is the docker rows' (a
// base holding only /bin/true and its libraries, the agent and the
// stand-ins injected by imagebuild), written as an OCI layout and
// imported into the cluster's containerd; the seccomp profile of
// examples/kubernetes is installed in the kubelet's seccomp directory as
// docs/kubernetes.md asks of an operator. Rows:
//
//   - create to ready: oac-shim-kubernetes run from process start to its
//     ready event, alternating with a bare Pod of the same image running
//     /bin/true (created through the API; from the create request until a
//     watch sees the phase Succeeded);
//   - kubeDensity sandboxes started at the same moment: how many reached
//     ready, the time until all were, each one's time to ready, the
//     memory per sandbox on the node (RSS of each Pod's processes and its
//     containerd shim; the kubepods cgroup's usage over idle divided by
//     the count), the shim's RSS on the host and the cluster daemons'
//     growth;
//   - stop: SIGTERM to every shim until all exited (each deletes its Pod
//     and waits until it is gone), then the cluster, and what is left of
//     either (the provider's objects, kcluster's Leftovers).
//
// Only one test cluster may run on a machine (kcluster's doc): the group
// waits while another one's kube-apiserver runs, and skips after
// kubeWaitOther.

// KubeGroup is the group's name (oac-bench -only kubernetes).
const KubeGroup = "kubernetes"

// kubeDensity is how many sandboxes the density rows start at once: the
// provider's default requests (cpu=100m, memory=128Mi) of 20 fill a
// 2-CPU node's allocatable CPU.
const kubeDensity = 20

// kubeImageRef is the guest image in the cluster's containerd.
const kubeImageRef = "oac.local/bench/guest:1"

// kubeWaitOther bounds the wait for another test cluster to end.
const kubeWaitOther = 10 * time.Minute

// kubeBootTimeout bounds one sandbox's run to ready (alone or among
// kubeDensity).
const kubeBootTimeout = 4 * time.Minute

// KubernetesFigures measures oac-shim-kubernetes on a test cluster it
// starts and stops (see above). Rows it cannot measure here are skipped
// with why.
func KubernetesFigures(r *Report, b Bins, runs int) error {
	shim := filepath.Join(filepath.Dir(b.Shim), "oac-shim-kubernetes")
	profile := findUp(filepath.Join("examples", "kubernetes", "oac-seccomp.json"))
	switch {
	case !fileExists(shim):
		r.Skip("kubernetes figures", shim+" is missing (make build makes it)")
		return nil
	case b.SandboxIO == "" || b.Daemon == "":
		r.Skip("kubernetes figures", "need the stand-in fixtures (make fixtures: bin/fixtures/)")
		return nil
	case kcluster.Missing() != "":
		r.Skip("kubernetes figures", kcluster.Missing())
		return nil
	case profile == "":
		r.Skip("kubernetes figures", "examples/kubernetes/oac-seccomp.json not found from the working directory (run from the repository)")
		return nil
	}
	if pid := waitNoCluster(kubeWaitOther); pid != 0 {
		r.Skip("kubernetes figures", fmt.Sprintf("another test cluster runs here (kube-apiserver pid %d) and did not end within %s: only one may run on a machine", pid, kubeWaitOther))
		return nil
	}
	k := &kubeRun{r: r, b: b, shim: shim, procs: map[*exec.Cmd]bool{}}
	return k.run(runs, profile)
}

// kubeRun is one run of the group: the cluster, the shims it started, and
// the interrupt handler that stops both.
type kubeRun struct {
	r    *Report
	b    Bins
	shim string
	args []string // run's arguments after the name: provider, cluster, image, bootstrap
	// provArgs are args without the bootstrap (the egress rows' sandbox
	// has a bootstrap of its own).
	provArgs []string

	mu       sync.Mutex
	c        *kcluster.Cluster
	starting chan struct{} // closed when kcluster.Start returned
	procs    map[*exec.Cmd]bool
	closing  bool // interrupted: start no more shims
	watch    *http.Client
	// others stop what the group started outside procs (the egress
	// rows' sandbox), on an interrupt too.
	others []func()
}

func (k *kubeRun) run(runs int, profile string) (err error) {
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	dir, cleanup, err := sharedTempDir("oac-bench-kubernetes-")
	if err != nil {
		return err
	}
	defer cleanup()

	// An interrupt stops the shims and the cluster before the process
	// ends: a cluster left running blocks every other one on the machine.
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	defer func() { signal.Stop(sigc); close(done) }()
	go func() {
		select {
		case <-sigc:
			fmt.Fprintln(os.Stderr, "oac-bench: interrupted: stopping the kubernetes sandboxes and the test cluster")
			cancel()
			k.mu.Lock()
			k.closing = true
			k.mu.Unlock()
			k.stopAll()
			k.mu.Lock()
			others := k.others
			k.mu.Unlock()
			for _, stop := range others {
				stop()
			}
			if c := k.waitCluster(); c != nil {
				_ = c.Stop()
			}
			os.RemoveAll(dir)
			os.Exit(130)
		case <-done:
		}
	}()

	probeBin, err := buildProbe(dir)
	if err != nil {
		return fmt.Errorf("kubernetes: the egress rows' probe: %w", err)
	}
	layout, err := kubeGuestImage(k.b, dir, probeBin)
	if err != nil {
		return fmt.Errorf("kubernetes: guest image: %w", err)
	}
	boot, err := hostedBootstrap(dir)
	if err != nil {
		return err
	}

	k.mu.Lock()
	k.starting = make(chan struct{})
	k.mu.Unlock()
	ts := time.Now()
	c, err := kcluster.Start(ctx, kcluster.Options{})
	startTook := time.Since(ts)
	k.mu.Lock()
	k.c = c
	close(k.starting)
	k.mu.Unlock()
	if err != nil {
		k.r.Skip("kubernetes figures", "the test cluster did not start: "+firstLine(err.Error()))
		return nil
	}
	defer func() {
		k.mu.Lock()
		interrupted := k.closing
		k.mu.Unlock()
		if interrupted {
			select {} // the interrupt's handler stops everything and exits
		}
		if e := k.finish(); e != nil && err == nil {
			err = e
		}
		fmt.Printf("kubernetes: the group took %s\n", time.Since(t0).Round(time.Second))
	}()
	res := NewResult("kubernetes: test cluster start (etcd, containerd, control plane, kubelet to node schedulable)", "ms", []float64{ms(startTook)}, "", nil)
	if bt := c.Timings["binaries"]; bt > 10*time.Second {
		res.Note = fmt.Sprintf("of which %s building the cluster's binaries", bt.Round(time.Second))
	}
	k.r.Add(res)

	pb, err := os.ReadFile(profile)
	if err == nil {
		err = c.InstallSeccompProfile("oac-seccomp.json", pb)
	}
	if err != nil {
		return fmt.Errorf("kubernetes: seccomp profile: %w", err)
	}
	ictx, icancel := context.WithTimeout(ctx, 2*time.Minute)
	err = c.ImportLayout(ictx, layout)
	icancel()
	if err != nil {
		return fmt.Errorf("kubernetes: import the guest image: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.CA)
	k.watch = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	k.provArgs = []string{"--provider", "kubernetes", "--kubeconfig", c.Kubeconfig, "--k8s-image", kubeImageRef,
		"--k8s-pull-policy", "Never",
		// Twenty sandboxes starting on two CPUs take longer than the
		// default 30 s.
		"--boot-timeout", (kubeBootTimeout - 30*time.Second).String()}
	k.args = append(append([]string{"--bootstrap", boot}, k.provArgs...), hostedIdentity...)

	if err := k.createToReady(ctx, runs); err != nil {
		return err
	}
	if err := k.density(ctx, kubeDensity); err != nil {
		return err
	}
	if err := k.warm(ctx, runs); err != nil {
		return err
	}
	return k.egress(ctx, runs, probeBin)
}

// alsoStop registers stop to run on an interrupt too, and returns it to
// run at most once.
func (k *kubeRun) alsoStop(stop func()) func() {
	once := sync.OnceFunc(stop)
	k.mu.Lock()
	k.others = append(k.others, once)
	k.mu.Unlock()
	return once
}

// waitCluster returns the cluster once kcluster.Start returned (nil when
// it failed or never began).
func (k *kubeRun) waitCluster() *kcluster.Cluster {
	k.mu.Lock()
	ch := k.starting
	k.mu.Unlock()
	if ch != nil {
		<-ch
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.c
}

// createToReady is the first pair of rows.
func (k *kubeRun) createToReady(ctx context.Context, runs int) error {
	seq := 0
	var exits []float64
	bare := func() (float64, error) {
		seq++
		succeeded, exited, err := k.barePod(ctx, fmt.Sprintf("oac-bench-true-%d", seq))
		exits = append(exits, exited)
		return succeeded, err
	}
	shim := func() (float64, error) {
		s, err := k.start(kubeBootTimeout)
		if err != nil {
			return 0, err
		}
		d := s.ready
		if err := k.stop(s); err != nil {
			return 0, fmt.Errorf("stop: %w", err)
		}
		return ms(d), nil
	}
	// One of each first, not counted: the first Pod of an image on a
	// fresh node pays for its snapshot and the kubelet's first reads.
	if _, err := bare(); err != nil {
		return fmt.Errorf("kubernetes: bare Pod: %w", err)
	}
	if _, err := shim(); err != nil {
		return fmt.Errorf("kubernetes: oac-shim-kubernetes run: %w", err)
	}
	exits = nil
	base, subj, err := Pair(runs, bare, shim)
	if err != nil {
		return fmt.Errorf("kubernetes: create to ready: %w", err)
	}
	k.r.Add(NewResult("kubernetes: oac-shim-kubernetes run to ready (hosted bootstrap)", "ms", subj,
		"bare Pod of the same image running /bin/true, create to phase Succeeded", base))
	// The same runs against an earlier point of the same bare Pods: the
	// kubelet reports the container's exit, then stops the Pod's sandbox
	// before it writes the terminal phase.
	k.r.Add(NewResult("kubernetes: oac-shim-kubernetes run to ready (hosted bootstrap), the same runs", "ms", subj,
		"the same bare Pods, create to their container's exit reported (state terminated)", exits))
	return nil
}

// density starts n sandboxes at the same moment and measures them.
func (k *kubeRun) density(ctx context.Context, n int) error {
	c := k.c
	idleKubepods, _, _ := kubepodsMemory(c)
	daemonsBefore := sumRSS(c.RSS())
	type res struct {
		s   *sandboxProc
		err error
	}
	ch := make(chan res, n)
	release := make(chan struct{})
	for range n {
		go func() {
			<-release
			s, err := k.start(kubeBootTimeout)
			ch <- res{s, err}
		}()
	}
	t := time.Now()
	close(release)
	var started []*sandboxProc
	var readyEach []float64
	var firstErr error
	for range n {
		x := <-ch // each start ends within kubeBootTimeout
		if x.err != nil {
			fmt.Fprintf(os.Stderr, "kubernetes: a sandbox of %d did not reach ready: %v\n", n, x.err)
			if firstErr == nil {
				firstErr = x.err
			}
		}
		if x.s != nil {
			started = append(started, x.s)
			readyEach = append(readyEach, ms(x.s.ready))
		}
	}
	allReady := ms(time.Since(t))

	time.Sleep(3 * time.Second) // idle
	var shimRSS, podRSS, podPSS []float64
	byProcess := map[string][]float64{}
	var measureErr error
	for _, s := range started {
		kb, err := rssKB(s.cmd.Process.Pid)
		if err == nil {
			shimRSS = append(shimRSS, kb/1024)
		}
	}
	pods, err := k.sandboxPods(ctx)
	if err != nil {
		measureErr = err
	}
	for _, p := range pods {
		m, err := podProcesses(c, p.Metadata.UID)
		if err != nil {
			measureErr = err
			continue
		}
		podRSS, podPSS = append(podRSS, m.rss/1024), append(podPSS, m.pss/1024)
		for name, kb := range m.byName {
			byProcess[name] = append(byProcess[name], kb/1024)
		}
	}
	var nodeStart []float64
	for _, p := range pods {
		if d, ok := p.started(); ok {
			nodeStart = append(nodeStart, d.Seconds())
		}
	}
	kubepods, kubepodsRSS, errK := kubepodsMemory(c)
	daemonsAfter := sumRSS(c.RSS())

	ts := time.Now()
	k.stopAll()
	stopped := ms(time.Since(ts))

	ready := NewResult(fmt.Sprintf("kubernetes: %d sandboxes started at once, ready", n), "sandboxes", []float64{float64(len(started))}, "", nil)
	ready = ready.Judge(fmt.Sprintf("all %d ready", n), firstErr == nil)
	if firstErr != nil {
		ready.Note = fmt.Sprintf("%d failed; the first: %s", n-len(started), firstLine(firstErr.Error()))
	}
	k.r.Add(ready)
	k.r.Add(NewResult(fmt.Sprintf("kubernetes: time to all ready, %d started at once", n), "ms", []float64{allReady}, "", nil))
	if len(readyEach) > 0 {
		k.r.Add(NewResult(fmt.Sprintf("kubernetes: each sandbox's run to ready, %d started at once", n), "ms", readyEach, "", nil))
	}
	if len(nodeStart) > 0 {
		k.r.Add(NewResult(fmt.Sprintf("kubernetes: each Pod's creation to its agent container started (API timestamps, whole seconds), %d started at once", n), "s", nodeStart, "", nil))
	}
	if len(podRSS) > 0 {
		res := NewResult(fmt.Sprintf("kubernetes: node memory per sandbox at %d running: RSS of the Pod's processes (pause, agent, bridge, sandbox_io, daemon) and its containerd shim", len(started)), "MiB", podRSS, "", nil)
		res.Note = fmt.Sprintf("PSS, shared pages split among their processes: %s MiB; RSS by process, medians: %s", fmtNum(Summarise(podPSS).Median), processBreakdown(byProcess))
		if measureErr != nil {
			res.Note += "; some Pods not measured: " + firstLine(measureErr.Error())
		}
		k.r.Add(res)
	} else if measureErr != nil {
		k.r.Skip("kubernetes: node memory per sandbox (Pods' processes)", firstLine(measureErr.Error()))
	}
	if errK == nil && len(started) > 0 {
		per := (kubepods - idleKubepods) / float64(len(started)) / (1 << 20)
		res := NewResult(fmt.Sprintf("kubernetes: node memory per sandbox at %d running: the kubepods cgroup's memory usage over idle, divided by %d (page cache included)", len(started), len(started)), "MiB", []float64{per}, "", nil)
		res.Note = fmt.Sprintf("of which RSS %s MiB per sandbox", fmtNum(kubepodsRSS/float64(len(started))/(1<<20)))
		k.r.Add(res)
	} else if errK != nil {
		k.r.Skip("kubernetes: node memory per sandbox (kubepods cgroup)", firstLine(errK.Error()))
	}
	if len(shimRSS) > 0 {
		k.r.Add(NewResult(fmt.Sprintf("kubernetes: oac-shim-kubernetes RSS per sandbox on the host at %d running", len(started)), "MiB", shimRSS, "", nil))
	}
	if len(started) > 0 {
		k.r.Add(NewResult(fmt.Sprintf("kubernetes: cluster daemons' RSS growth per sandbox at %d running (etcd, containerd, apiserver, scheduler, controller manager, kubelet)", len(started)), "MiB",
			[]float64{(daemonsAfter - daemonsBefore) / float64(len(started)) / (1 << 20)}, "", nil))
		k.r.Add(NewResult(fmt.Sprintf("kubernetes: time to stop all %d (SIGTERM to every shim until each exited, its Pod gone)", len(started)), "ms", []float64{stopped}, "", nil))
	}
	return nil
}

// finish stops what is left, then the cluster, and reports leftovers of
// both.
func (k *kubeRun) finish() error {
	k.stopAll()
	c := k.c
	var left []string
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	for _, kind := range []string{"/api/v1/pods", "/apis/networking.k8s.io/v1/networkpolicies"} {
		var list struct {
			Items []struct {
				Metadata struct{ Namespace, Name string }
			}
		}
		if err := c.Get(ctx, kind+"?labelSelector="+url.QueryEscape("app.kubernetes.io/managed-by=oac-shim"), &list); err != nil {
			left = append(left, fmt.Sprintf("cannot list %s: %v", kind, err))
			continue
		}
		for _, it := range list.Items {
			left = append(left, fmt.Sprintf("%s %s/%s after the shims stopped", kind[strings.LastIndex(kind, "/")+1:], it.Metadata.Namespace, it.Metadata.Name))
		}
	}
	cancel()
	ts := time.Now()
	stopErr := c.Stop()
	took := time.Since(ts)
	if stopErr != nil {
		left = append(left, "cluster stop: "+firstLine(stopErr.Error()))
	}
	left = append(left, c.Leftovers()...)
	k.r.Add(NewResult("kubernetes: test cluster stop", "ms", []float64{ms(took)}, "", nil))
	res := NewResult("kubernetes: what is left after the sandboxes and the cluster stopped (provider objects, kcluster Leftovers)", "items", []float64{float64(len(left))}, "", nil).Judge("nothing", len(left) == 0)
	if len(left) > 0 {
		res.Note = strings.Join(left, "; ")
		fmt.Fprintln(os.Stderr, "oac-bench: kubernetes leftovers:\n  "+strings.Join(left, "\n  "))
	}
	k.r.Add(res)
	return nil
}

// start runs oac-shim-kubernetes for a new sandbox and waits for its
// ready event; the process is tracked from its start, so an interrupt
// stops it too.
func (k *kubeRun) start(timeout time.Duration) (*sandboxProc, error) {
	return k.startWith(k.args, timeout)
}

// startWith is start with run's arguments args after the name.
func (k *kubeRun) startWith(args []string, timeout time.Duration) (*sandboxProc, error) {
	cmd := exec.Command(k.shim, append([]string{"run", "--name", benchName(), "--agent", k.b.Guest}, args...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr := &tailBuffer{max: 8 << 10}
	phases := &lineCatch{want: []byte("boot phases")}
	cmd.Stderr = io.MultiWriter(stderr, phases)
	k.mu.Lock()
	if k.closing {
		k.mu.Unlock()
		return nil, errors.New("interrupted")
	}
	start := time.Now()
	err = cmd.Start()
	if err == nil {
		k.procs[cmd] = true
	}
	k.mu.Unlock()
	if err != nil {
		return nil, err
	}
	readyc := make(chan time.Duration, 1)
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		sent := false
		for sc.Scan() {
			if !sent && bytes.Contains(sc.Bytes(), []byte(`"state":"ready"`)) {
				readyc <- time.Since(start)
				sent = true
			}
		}
		_, _ = io.Copy(io.Discard, out)
		close(readyc)
	}()
	s := &sandboxProc{cmd: cmd, phases: phases}
	select {
	case d, ok := <-readyc:
		if ok {
			s.ready = d
			return s, nil
		}
		_ = k.stop(s)
		return nil, fmt.Errorf("%w: %s", errNoReady, strings.TrimSpace(stderr.String()))
	case <-time.After(timeout):
		_ = k.stop(s)
		return nil, fmt.Errorf("%w within %s: %s", errNoReady, timeout, strings.TrimSpace(stderr.String()))
	}
}

// stop sends SIGTERM and waits (SIGKILL after two minutes).
func (k *kubeRun) stop(s *sandboxProc) error {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- s.cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(2 * time.Minute):
		_ = s.cmd.Process.Kill()
		err = fmt.Errorf("did not exit within 2m of SIGTERM: %w", <-done)
	}
	k.mu.Lock()
	delete(k.procs, s.cmd)
	k.mu.Unlock()
	return err
}

// stopAll stops every tracked shim at once and waits.
func (k *kubeRun) stopAll() {
	k.mu.Lock()
	var all []*exec.Cmd
	for c := range k.procs {
		all = append(all, c)
	}
	k.mu.Unlock()
	var wg sync.WaitGroup
	for _, c := range all {
		wg.Add(1)
		go func() { defer wg.Done(); _ = k.stop(&sandboxProc{cmd: c}) }()
	}
	wg.Wait()
}

// barePod creates a Pod of the guest image running /bin/true (with the
// sandbox Pods' default requests and limits) and times it from the create
// request until a watch sees its phase Succeeded (exited: until the watch
// first sees its container terminated); it then deletes the Pod and waits
// until it is gone.
func (k *kubeRun) barePod(ctx context.Context, name string) (succeeded, exited float64, err error) {
	no := false
	zero := int64(0)
	res := map[string]any{
		"requests": map[string]string{"cpu": "100m", "memory": "128Mi"},
		"limits":   map[string]string{"cpu": "2", "memory": "2Gi"},
	}
	pod := map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": name, "labels": map[string]string{"app.kubernetes.io/managed-by": "oac-bench"}},
		"spec": map[string]any{
			"restartPolicy": "Never", "automountServiceAccountToken": &no, "enableServiceLinks": &no,
			"terminationGracePeriodSeconds": &zero,
			"containers": []map[string]any{{
				"name": "true", "image": kubeImageRef, "imagePullPolicy": "Never",
				"command": []string{"/bin/true"}, "resources": res,
			}},
		},
	}
	const pods = "/api/v1/namespaces/default/pods"
	var created struct {
		Metadata struct{ ResourceVersion string }
	}
	t := time.Now()
	if err := k.c.Do(ctx, http.MethodPost, pods, pod, &created); err != nil {
		return 0, 0, fmt.Errorf("create Pod %s: %w", name, err)
	}
	exit, werr := k.waitSucceeded(ctx, name, created.Metadata.ResourceVersion)
	d := time.Since(t)
	if err := k.c.Do(ctx, http.MethodDelete, pods+"/"+name+"?gracePeriodSeconds=0", nil, nil); err != nil && !kcluster.IsNotFound(err) {
		return 0, 0, fmt.Errorf("delete Pod %s: %w", name, err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		err := k.c.Get(ctx, pods+"/"+name, nil)
		if kcluster.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			return 0, 0, fmt.Errorf("Pod %s not gone a minute after its deletion (%v)", name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if werr != nil {
		return 0, 0, fmt.Errorf("Pod %s: %w", name, werr)
	}
	return ms(d), ms(exit.Sub(t)), nil
}

// waitSucceeded watches Pod name from resourceVersion rv until its phase
// is Succeeded (Failed, a watch error or two minutes: an error); exited is
// when it first saw the container terminated.
func (k *kubeRun) waitSucceeded(ctx context.Context, name, rv string) (exited time.Time, err error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	q := url.Values{"watch": {"1"}, "fieldSelector": {"metadata.name=" + name}, "resourceVersion": {rv}, "timeoutSeconds": {"120"}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, k.c.URL+"/api/v1/namespaces/default/pods?"+q.Encode(), nil)
	if err != nil {
		return exited, err
	}
	req.Header.Set("Authorization", "Bearer "+k.c.Token)
	req.Header.Set("Accept", "application/json")
	resp, err := k.watch.Do(req)
	if err != nil {
		return exited, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return exited, fmt.Errorf("watch: status %d: %s", resp.StatusCode, b)
	}
	dec := json.NewDecoder(resp.Body)
	for {
		var ev struct {
			Type   string
			Object struct {
				Status struct {
					Phase, Reason, Message string
					ContainerStatuses      []struct {
						State struct {
							Waiting    *struct{ Reason, Message string }
							Terminated *struct {
								Reason   string
								ExitCode int
							}
						}
					}
				}
			}
		}
		if err := dec.Decode(&ev); err != nil {
			return exited, fmt.Errorf("watch ended before the Pod succeeded: %w", err)
		}
		st := ev.Object.Status
		switch {
		case ev.Type == "ERROR":
			return exited, fmt.Errorf("watch error: %s", st.Message)
		case st.Phase == "Succeeded":
			if exited.IsZero() {
				exited = time.Now()
			}
			return exited, nil
		case st.Phase == "Failed":
			return exited, fmt.Errorf("Pod failed: %s %s %+v", st.Reason, st.Message, st.ContainerStatuses)
		}
		for _, cs := range st.ContainerStatuses {
			if cs.State.Terminated != nil && exited.IsZero() {
				exited = time.Now()
			}
			if w := cs.State.Waiting; w != nil && w.Reason != "" && w.Reason != "ContainerCreating" {
				return exited, fmt.Errorf("container waiting: %s: %s", w.Reason, w.Message)
			}
		}
	}
}

// kubePod is what the density rows need of a sandbox's Pod.
type kubePod struct {
	Metadata struct {
		Name, UID         string
		CreationTimestamp time.Time
	}
	Status struct {
		ContainerStatuses []struct {
			Name  string
			State struct {
				Running *struct{ StartedAt time.Time }
			}
		}
	}
}

// started is the time from the Pod's creation to its agent container's
// start, as the API records them (whole seconds).
func (p kubePod) started() (time.Duration, bool) {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == "agent" && cs.State.Running != nil && !p.Metadata.CreationTimestamp.IsZero() {
			return cs.State.Running.StartedAt.Sub(p.Metadata.CreationTimestamp), true
		}
	}
	return 0, false
}

// sandboxPods lists the provider's Pods.
func (k *kubeRun) sandboxPods(ctx context.Context) ([]kubePod, error) {
	var list struct{ Items []kubePod }
	err := k.c.Get(ctx, "/api/v1/namespaces/default/pods?labelSelector="+url.QueryEscape("app.kubernetes.io/managed-by=oac-shim"), &list)
	return list.Items, err
}

// kubeGuestImage builds the guest image (the docker rows' base, the
// agent, the sandbox_io stand-in, the daemon stand-in and the egress
// rows' probe) as an OCI layout (Cluster.ImportLayout imports it).
func kubeGuestImage(b Bins, dir, probeBin string) (string, error) {
	base := filepath.Join(dir, "base")
	if err := trueBase(base); err != nil {
		return "", err
	}
	out := filepath.Join(dir, "image")
	if _, err := imagebuild.Build(imagebuild.Spec{Base: base,
		Injection: imagebuild.Injection{Agent: b.Guest, SandboxIO: b.SandboxIO, Files: []imagebuild.ExtraFile{
			{Src: b.Daemon, Dst: hostedDaemon, Mode: 0o755}, {Src: probeBin, Dst: guestProbePath, Mode: 0o755}}},
		Outputs: []string{imagebuild.OutOCI}, Out: out, Epoch: 1, Ref: kubeImageRef}); err != nil {
		return "", err
	}
	return filepath.Join(out, "oci"), nil
}

// findUp finds rel in the working directory or a parent ("" if none).
func findUp(rel string) string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		if p := filepath.Join(dir, rel); fileExists(p) {
			return p
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

// apiserverPid returns the pid of a running kube-apiserver (0: none).
func apiserverPid() int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm")); err == nil && strings.TrimSpace(string(b)) == "kube-apiserver" {
			return pid
		}
	}
	return 0
}

// waitNoCluster waits, polling every 20 s, until no kube-apiserver runs
// here; it returns the pid of one still running after max (0: none).
func waitNoCluster(max time.Duration) int {
	deadline := time.Now().Add(max)
	pid := apiserverPid()
	if pid != 0 {
		fmt.Printf("kubernetes: another test cluster runs here (kube-apiserver pid %d): waiting up to %s for it to end\n", pid, max)
	}
	for pid != 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Second)
		pid = apiserverPid()
	}
	return pid
}

// memoryCgroup is the kubelet's cgroup root in the memory controller's
// hierarchy (cgroup v1) or the unified one (v2). kcluster names the root
// after its directory.
func memoryCgroup(c *kcluster.Cluster) (dir string, v2 bool, err error) {
	root := filepath.Base(c.Dir)
	if p := filepath.Join("/sys/fs/cgroup/memory", root); dirExists(p) {
		return p, false, nil
	}
	if p := filepath.Join("/sys/fs/cgroup", root); dirExists(p) && fileExists("/sys/fs/cgroup/cgroup.controllers") {
		return p, true, nil
	}
	return "", false, fmt.Errorf("no memory cgroup %s found", root)
}

func dirExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

// kubepodsMemory is the kubepods cgroup's memory usage and its RSS part
// (bytes).
func kubepodsMemory(c *kcluster.Cluster) (usage, rss float64, err error) {
	dir, v2, err := memoryCgroup(c)
	if err != nil {
		return 0, 0, err
	}
	dir = filepath.Join(dir, "kubepods")
	usageFile, rssKey := "memory.usage_in_bytes", "total_rss"
	if v2 {
		usageFile, rssKey = "memory.current", "anon"
	}
	b, err := os.ReadFile(filepath.Join(dir, usageFile))
	if err != nil {
		return 0, 0, err
	}
	if usage, err = strconv.ParseFloat(strings.TrimSpace(string(b)), 64); err != nil {
		return 0, 0, err
	}
	st, err := os.ReadFile(filepath.Join(dir, "memory.stat"))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(st), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == rssKey {
			rss, _ = strconv.ParseFloat(f[1], 64)
		}
	}
	return usage, rss, nil
}

// podMemory is what a Pod's processes and its containerd shim hold on
// the node (KiB).
type podMemory struct {
	rss, pss float64
	byName   map[string]float64 // RSS by process name (comm; oac-guest's bridge apart)
}

// podProcesses measures the processes in the Pod's cgroup (every
// container's, the pause container's) and the containerd shim that is
// their parent.
func podProcesses(c *kcluster.Cluster, uid string) (podMemory, error) {
	m := podMemory{byName: map[string]float64{}}
	pids, err := podPIDs(c, uid)
	if err != nil {
		return m, err
	}
	for pid := range pids {
		kb, err := rssKB(pid)
		if err != nil {
			continue
		}
		m.rss += kb
		m.pss += pssKB(pid)
		m.byName[procName(pid)] += kb
	}
	return m, nil
}

// podPIDs are the processes in the Pod's cgroup (every container's, the
// pause container's) and the containerd shim that is their parent.
func podPIDs(c *kcluster.Cluster, uid string) (map[int]bool, error) {
	dir, _, err := memoryCgroup(c)
	if err != nil {
		return nil, err
	}
	var podDir string
	for _, pat := range []string{"kubepods/pod" + uid, "kubepods/*/pod" + uid} {
		if g, _ := filepath.Glob(filepath.Join(dir, pat)); len(g) > 0 {
			podDir = g[0]
			break
		}
	}
	if podDir == "" {
		return nil, fmt.Errorf("no cgroup of Pod %s below %s", uid, dir)
	}
	pids := map[int]bool{}
	_ = filepath.WalkDir(podDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		b, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				pids[n] = true
			}
		}
		return nil
	})
	if len(pids) == 0 {
		return nil, fmt.Errorf("no processes in %s", podDir)
	}
	for pid := range pids {
		if pp := ppid(pid); pp > 0 && !pids[pp] && isContainerdShim(pp) {
			pids[pp] = true
		}
	}
	return pids, nil
}

func isContainerdShim(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && bytes.Contains(b, []byte("containerd-shim"))
}

// pssKB is pid's proportional set size in KiB (0 when unknown).
func pssKB(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "Pss:" {
			v, _ := strconv.ParseFloat(f[1], 64)
			return v
		}
	}
	return 0
}

// procName is pid's comm, with oac-guest's bridge told from the agent.
func procName(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	name := strings.TrimSpace(string(b))
	if cl, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && name == "oac-guest" && bytes.Contains(cl, []byte("\x00bridge\x00")) {
		name += " bridge"
	}
	return name
}

// processBreakdown is "name median, ..." largest first.
func processBreakdown(by map[string][]float64) string {
	type kv struct {
		name string
		med  float64
	}
	var all []kv
	for n, xs := range by {
		all = append(all, kv{n, Summarise(xs).Median})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].med > all[j].med })
	var parts []string
	for _, x := range all {
		parts = append(parts, x.name+" "+fmtNum(x.med))
	}
	return strings.Join(parts, ", ")
}

// ppid is pid's parent (0 when unknown).
func ppid(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0
	}
	n, _ := strconv.Atoi(f[1])
	return n
}

// sumRSS adds kcluster's RSS figures (bytes).
func sumRSS(m map[string]int64) float64 {
	t := 0.0
	for _, v := range m {
		t += float64(v)
	}
	return t
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}

// tailBuffer keeps the last max bytes written (a shim's stderr).
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append([]byte(nil), t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
