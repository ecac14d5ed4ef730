package bench

// The kubernetes group's egress rows: a sandbox of oac-shim-kubernetes
// whose daemon is the clients group's probe (bench/internal/netprobe,
// built into the guest image: the provider refuses --install), reached
// through a forward, its egress through the guest's HTTP proxy and
// through the capture, beside the same client on the host and in a plain
// Pod on the same node (the cluster's bridge network, no oac), all three
// reaching the same servers on the bridge's address. Every connection of
// the sandbox is a session stream, and the session crosses pods/exec:
// shim -> kube-apiserver -> kubelet -> containerd's stream server ->
// the Pod's containerd shim -> oac-guest bridge -> the agent. Around each
// download and upload the CPU time of each of those is read from /proc,
// so the rows say where the time goes. The rows only report: no goal.

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/oac/sandbox-agent/bench/internal/probe"
	"github.com/oac/sandbox-agent/internal/kcluster"
	"github.com/oac/sandbox-agent/internal/proctree"
)

// kubeEgressSize is what one download or upload moves: the session over
// pods/exec carries 0.1 to 0.25 GB/s on this machine, so a run takes one
// to three seconds, and /proc's 10 ms reads to ±0.04 s/GiB.
const kubeEgressSize = 256 << 20

// kubePlainPod is the plain Pod's name.
const kubePlainPod = "oac-bench-plain-netprobe"

// egress measures the rows described above.
func (k *kubeRun) egress(ctx context.Context, runs int, probeBin string) error {
	c := k.c
	runs = min(runs, 5)
	plain, plainShim, stopPlain, err := k.plainProbePod(ctx)
	if err != nil {
		return fmt.Errorf("kubernetes egress: the plain Pod: %w", err)
	}
	defer stopPlain()
	// The cluster's Pods have a route to their bridge's subnet only (no
	// default route): the servers listen on the bridge's own address,
	// which the host, the shim and the plain Pod all reach.
	gw, err := podGateway()
	if err != nil {
		return fmt.Errorf("kubernetes egress: %w", err)
	}
	srv, stopServers, err := startClientServers(gw)
	if err != nil {
		return fmt.Errorf("kubernetes egress: the servers on the Pods' gateway %s: %w", gw, err)
	}
	defer stopServers()
	tg := guestTarget{label: "kubernetes", shim: k.shim, probeInImage: true, args: k.provArgs}
	guest, stopGuest, err := guestProbe(k.b, tg, srv, probeBin)
	if err != nil {
		return fmt.Errorf("kubernetes egress: the sandbox: %w", err)
	}
	defer k.alsoStop(stopGuest)()
	pods, err := k.sandboxPods(ctx)
	if err != nil || len(pods) != 1 {
		return fmt.Errorf("kubernetes egress: want the sandbox's one Pod, found %d (%v)", len(pods), err)
	}
	podShim, err := podShimPID(c, pods[0].Metadata.UID)
	if err != nil {
		return fmt.Errorf("kubernetes egress: the sandbox Pod's containerd shim: %w", err)
	}
	daemons := c.PIDs()
	parts := []pathPart{
		{name: "oac-shim-kubernetes", pid: guest.shimPID, tree: true},
		{name: "kube-apiserver", pid: daemons["kube-apiserver"]},
		{name: "kubelet", pid: daemons["kubelet"]},
		{name: "containerd", pid: daemons["containerd"]},
		{name: "the Pod (containerd shim, agent, bridge, probe)", pid: podShim, tree: true},
		{name: "etcd", pid: daemons["etcd"]},
	}
	for _, p := range parts {
		if p.pid == 0 {
			return fmt.Errorf("kubernetes egress: no pid for %s", p.name)
		}
	}
	// cpu, when not nil, gets each part's CPU seconds for the run.
	inProbe := func(cl *probe.Client, parts []pathPart, cpu *[][]float64) func(probe.Request) func() (float64, error) {
		return func(req probe.Request) func() (float64, error) {
			return func() (float64, error) {
				before := partTicks(parts)
				v, err := cl.Run(req)
				if err == nil && cpu != nil {
					*cpu = append(*cpu, partSeconds(before, partTicks(parts)))
				}
				return v, err
			}
		}
	}
	plainParts := []pathPart{{name: "the plain Pod (containerd shim, probe)", pid: plainShim, tree: true}}
	const (
		onHost  = "the same client on the host"
		inPlain = "the same client in a plain Pod on the node (pod network: the cluster's bridge)"
	)
	mib := kubeEgressSize >> 20
	hostBase, guestBase := "http://"+srv.web, "http://up.test"
	for pi, p := range clientPaths {
		label := fmt.Sprintf("kubernetes: egress of a sandbox (session over pods/exec), %s, Go's HTTP client", p.name)
		type row struct {
			what, unit      string
			hostReq, guestR probe.Request
			cpu             bool
		}
		dl := "/dl/" + strconv.Itoa(kubeEgressSize)
		rows := []row{
			{fmt.Sprintf("download %d MiB", mib), "MB/s",
				probe.Request{Cmd: "get", URL: hostBase + dl, Size: kubeEgressSize},
				probe.Request{Cmd: "get", URL: guestBase + dl, Size: kubeEgressSize, Proxy: p.proxy}, true},
			{fmt.Sprintf("upload %d MiB", mib), "MB/s",
				probe.Request{Cmd: "put", URL: hostBase + "/ul", Size: kubeEgressSize},
				probe.Request{Cmd: "put", URL: guestBase + "/ul", Size: kubeEgressSize, Proxy: p.proxy}, true},
			{"connect + first byte (median of 100)", "µs",
				probe.Request{Cmd: "connect", Target: srv.web, N: 100},
				probe.Request{Cmd: "connect", Target: "up.test:80", Proxy: p.proxy, N: 100}, false},
			{"64-byte round trip p50 (2000 on one connection)", "µs",
				probe.Request{Cmd: "rtt", Target: srv.echo, N: 2000},
				probe.Request{Cmd: "rtt", Target: "echo.test:7", Proxy: p.proxy, N: 2000}, false},
		}
		for _, rw := range rows {
			var sandboxCPU, plainCPU [][]float64
			var sc, pc *[][]float64
			if rw.cpu {
				sc, pc = &sandboxCPU, &plainCPU
			}
			xs, err := Interleave(runs, hostRun(rw.hostReq), inProbe(plain, plainParts, pc)(rw.hostReq), inProbe(guest.Client, parts, sc)(rw.guestR))
			if err != nil {
				return fmt.Errorf("%s, %s: %w", label, rw.what, err)
			}
			hostV, plainV, sandboxV := xs[0], xs[1], xs[2]
			r := k.r
			r.Add(NewResult(label+": "+rw.what, rw.unit, sandboxV, onHost, hostV))
			r.Add(NewResult(label+": "+rw.what+", beside a plain Pod", rw.unit, sandboxV, inPlain, plainV))
			if pi == 0 {
				// The plain Pod's own figures (the same in both paths'
				// rounds): what the node's network costs without oac.
				r.Add(NewResult("kubernetes: egress of a plain Pod on the node (pod network: the cluster's bridge), Go's HTTP client: "+rw.what, rw.unit, plainV, onHost, hostV))
			}
			if rw.cpu {
				r.Add(cpuPerGiB(label+": "+rw.what+": CPU seconds per GiB, every process on the path (shim, apiserver, kubelet, containerd, the Pod's, etcd)",
					parts, sandboxCPU, "the plain Pod's processes (containerd shim, probe)", plainParts, plainCPU))
			}
		}
	}
	return k.execAlone(ctx, runs, parts, plainShim, guest.Client)
}

// execAlone measures what pods/exec carries without oac, each way: a
// command in the plain Pod writes kubeEgressSize bytes to its stdout (the
// direction of a sandbox's upload: the guest sends) or reads them from its
// stdin (a download's: the guest receives), over the websocket
// (v5.channel.k8s.io, as the shim's client-go executor asks) from
// kcluster's client in this process; each alternating with the sandbox's
// transfer the same way through its proxy, each with its CPU per GiB.
func (k *kubeRun) execAlone(ctx context.Context, runs int, parts []pathPart, plainShim int, guest *probe.Client) error {
	execParts := []pathPart{
		{name: "this process (kcluster's websocket client)", pid: os.Getpid()},
		parts[1], parts[2], parts[3], // kube-apiserver, kubelet, containerd
		{name: "the plain Pod (containerd shim, the command)", pid: plainShim, tree: true},
		parts[5], // etcd
	}
	measure := func(ps []pathPart, cpu *[][]float64, f func() error) func() (float64, error) {
		return func() (float64, error) {
			before := partTicks(ps)
			t := time.Now()
			if err := f(); err != nil {
				return 0, err
			}
			d := time.Since(t)
			*cpu = append(*cpu, partSeconds(before, partTicks(ps)))
			return float64(kubeEgressSize) / d.Seconds() / 1e6, nil
		}
	}
	exec := func(stdin io.Reader, cmd string) error {
		var n countWriter
		stderr := &tailBuffer{max: 4 << 10}
		res, err := k.c.ExecTo(ctx, stdin, &n, stderr, "default", kubePlainPod, "probe", guestProbePath, cmd, strconv.Itoa(kubeEgressSize))
		switch {
		case err != nil:
			return fmt.Errorf("pods/exec: %w", err)
		case res.Status != "Success":
			return fmt.Errorf("pods/exec: %s %s: %s", res.Status, res.Message, stderr.String())
		case cmd == "emit" && n != kubeEgressSize:
			return fmt.Errorf("pods/exec: %d of %d bytes", n, kubeEgressSize)
		}
		return nil
	}
	mib := kubeEgressSize >> 20
	const sandboxRow = "kubernetes: egress of a sandbox (session over pods/exec), proxy, Go's HTTP client: "
	for _, dir := range []struct {
		what, alone, cmd string
		req              probe.Request
	}{
		{fmt.Sprintf("download %d MiB", mib), fmt.Sprintf("pods/exec alone (no oac): %d MiB sent over a websocket by the bench to a command's stdin in the plain Pod", mib), "absorb",
			probe.Request{Cmd: "get", URL: "http://up.test/dl/" + strconv.Itoa(kubeEgressSize), Size: kubeEgressSize, Proxy: clientPaths[0].proxy}},
		{fmt.Sprintf("upload %d MiB", mib), fmt.Sprintf("pods/exec alone (no oac): %d MiB a command in the plain Pod writes to its stdout, read over a websocket by the bench", mib), "emit",
			probe.Request{Cmd: "put", URL: "http://up.test/ul", Size: kubeEgressSize, Proxy: clientPaths[0].proxy}},
	} {
		var execCPU, sandboxCPU [][]float64
		raw := measure(execParts, &execCPU, func() error {
			if dir.cmd == "absorb" {
				return exec(io.LimitReader(zeroReader{}, kubeEgressSize), dir.cmd)
			}
			return exec(nil, dir.cmd)
		})
		sandbox := measure(parts, &sandboxCPU, func() error { _, err := guest.Run(dir.req); return err })
		xs, err := Interleave(runs, raw, sandbox)
		if err != nil {
			return fmt.Errorf("kubernetes: pods/exec alone, %s: %w", dir.what, err)
		}
		k.r.Add(NewResult(sandboxRow+dir.what+", beside pods/exec alone", "MB/s", xs[1], dir.alone, xs[0]))
		k.r.Add(cpuPerGiB(sandboxRow+dir.what+": CPU seconds per GiB, every process on the path, beside pods/exec alone", parts, sandboxCPU,
			dir.alone+" (the bench's client, apiserver, kubelet, containerd, the Pod's, etcd)", execParts, execCPU))
	}
	return nil
}

// zeroReader reads zeros.
type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// countWriter counts what is written to it.
type countWriter int64

func (c *countWriter) Write(p []byte) (int, error) {
	*c += countWriter(len(p))
	return len(p), nil
}

// pathPart is one process (or process tree) on the sandbox's path whose
// CPU time the rows read.
type pathPart struct {
	name string
	pid  int
	tree bool // with its descendants (and their reaped children)
}

// partTicks reads each part's CPU time (ClockTicks) in one pass over
// /proc; a part that is gone reads 0.
func partTicks(parts []pathPart) []int64 {
	all := proctree.All()
	out := make([]int64, len(parts))
	for i, p := range parts {
		for _, q := range all {
			if q.PID == p.pid {
				out[i] = q.CPUTicks
			}
		}
		if p.tree {
			for _, q := range proctree.Descendants(all, p.pid) {
				out[i] += q.CPUTicks
			}
		}
	}
	return out
}

// partSeconds is each part's CPU seconds between two partTicks readings.
func partSeconds(before, after []int64) []float64 {
	out := make([]float64, len(before))
	for i := range before {
		out[i] = float64(after[i]-before[i]) / proctree.ClockTicks
	}
	return out
}

// cpuPerGiB is a row of CPU seconds per GiB moved: every part of a path
// summed, each part's median in the note, beside another path's (none
// when baseName is ""). The host's servers (in this process) are left
// out, except where this process is a part.
func cpuPerGiB(name string, parts []pathPart, runs [][]float64, baseName string, baseParts []pathPart, base [][]float64) Result {
	gib := float64(kubeEgressSize) / (1 << 30)
	sum := func(runs [][]float64) []float64 {
		out := make([]float64, len(runs))
		for i, run := range runs {
			for _, x := range run {
				out[i] += x / gib
			}
		}
		return out
	}
	each := func(parts []pathPart, runs [][]float64) string {
		var out []string
		for i, p := range parts {
			col := make([]float64, len(runs))
			for j, run := range runs {
				col[j] = run[i] / gib
			}
			out = append(out, p.name+" "+fmtNum(Summarise(col).Median))
		}
		return strings.Join(out, ", ")
	}
	res := NewResult(name, "s/GiB", sum(runs), baseName, sum(base))
	res.Note = "medians by process: " + each(parts, runs)
	if baseName != "" && len(baseParts) > 1 {
		res.Note += "; the baseline's: " + each(baseParts, base)
	}
	res.Note += "; /proc's unit is 10 ms"
	return res
}

// podGateway is the address of this machine in the test cluster's Pod
// subnet (its bridge's, there once a Pod runs).
func podGateway() (string, error) {
	_, subnet, err := net.ParseCIDR(kcluster.PodSubnet)
	if err != nil {
		return "", err
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return "", err
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && subnet.Contains(ipn.IP) {
			return ipn.IP.String(), nil
		}
	}
	return "", fmt.Errorf("no address of this machine in the Pod subnet %s (the cluster's bridge has none while a Pod runs)", kcluster.PodSubnet)
}

// podShimPID is the containerd shim of the Pod uid (the parent of its
// processes).
func podShimPID(c *kcluster.Cluster, uid string) (int, error) {
	pids, err := podPIDs(c, uid)
	if err != nil {
		return 0, err
	}
	var shims []int
	for pid := range pids {
		if isContainerdShim(pid) {
			shims = append(shims, pid)
		}
	}
	if len(shims) != 1 {
		return 0, fmt.Errorf("want one containerd shim among the Pod's processes' parents, found %d", len(shims))
	}
	return shims[0], nil
}

// plainProbePod runs the probe in a Pod of the guest image with no oac
// (the sandbox Pods' default requests and limits, the cluster's pod
// network) and connects to it at the Pod's address; it returns the
// client, the Pod's containerd shim and a stop that deletes the Pod and
// waits until it is gone.
func (k *kubeRun) plainProbePod(ctx context.Context) (*probe.Client, int, func(), error) {
	no := false
	zero := int64(0)
	pod := map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": kubePlainPod, "labels": map[string]string{"app.kubernetes.io/managed-by": "oac-bench"}},
		"spec": map[string]any{
			"restartPolicy": "Never", "automountServiceAccountToken": &no, "enableServiceLinks": &no,
			"terminationGracePeriodSeconds": &zero,
			"containers": []map[string]any{{
				"name": "probe", "image": kubeImageRef, "imagePullPolicy": "Never",
				"command": []string{guestProbePath, "serve", fmt.Sprintf("0.0.0.0:%d", guestProbePort)},
				"resources": map[string]any{
					"requests": map[string]string{"cpu": "100m", "memory": "128Mi"},
					"limits":   map[string]string{"cpu": "2", "memory": "2Gi"},
				},
			}},
		},
	}
	const pods = "/api/v1/namespaces/default/pods"
	if err := k.c.Do(ctx, http.MethodPost, pods, pod, nil); err != nil {
		return nil, 0, nil, fmt.Errorf("create Pod %s: %w", kubePlainPod, err)
	}
	stop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = k.c.Do(ctx, http.MethodDelete, pods+"/"+kubePlainPod+"?gracePeriodSeconds=0", nil, nil)
		for ctx.Err() == nil && !kcluster.IsNotFound(k.c.Get(ctx, pods+"/"+kubePlainPod, nil)) {
			time.Sleep(100 * time.Millisecond)
		}
	}
	fail := func(err error) (*probe.Client, int, func(), error) {
		stop()
		return nil, 0, nil, err
	}
	var st struct {
		Metadata struct{ UID string }
		Status   struct{ Phase, PodIP string }
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if err := k.c.Get(ctx, pods+"/"+kubePlainPod, &st); err != nil {
			return fail(err)
		}
		if st.Status.Phase == "Running" && st.Status.PodIP != "" {
			break
		}
		if st.Status.Phase != "Pending" && st.Status.Phase != "" {
			return fail(fmt.Errorf("Pod %s is %s", kubePlainPod, st.Status.Phase))
		}
		if time.Now().After(deadline) {
			return fail(fmt.Errorf("Pod %s not running with an address within 2 minutes", kubePlainPod))
		}
		time.Sleep(200 * time.Millisecond)
	}
	addr := net.JoinHostPort(st.Status.PodIP, strconv.Itoa(guestProbePort))
	var cl *probe.Client
	var err error
	for end := time.Now().Add(30 * time.Second); ; {
		if cl, err = probe.Dial(addr); err == nil {
			if _, err = cl.Run(probe.Request{Cmd: "ping"}); err == nil {
				break
			}
			cl.Close()
		}
		if time.Now().After(end) {
			return fail(fmt.Errorf("the plain Pod's probe at %s did not answer: %w", addr, err))
		}
		time.Sleep(100 * time.Millisecond)
	}
	shim, err := podShimPID(k.c, st.Metadata.UID)
	if err != nil {
		cl.Close()
		return fail(err)
	}
	return cl, shim, func() { cl.Close(); stop() }, nil
}
