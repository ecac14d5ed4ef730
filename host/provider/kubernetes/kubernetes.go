//go:build kubernetes

package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/oac/sandbox-agent/host/apparmor"
	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/provider/kit"
)

// Bounds of the calls to the API server.
const (
	quickTimeout = 30 * time.Second
	// goneTimeout bounds the wait for a deleted Pod to be gone (the
	// kubelet stops its containers first).
	goneTimeout = 60 * time.Second
	// logLimit bounds what of the agent's log reaches Spec.Stderr.
	logLimit = 4 << 20
)

// cluster is a connection to the API server.
type cluster struct {
	cfg       *rest.Config
	cs        kubernetes.Interface
	dyn       dynamic.Interface // agent-sandbox's resources
	namespace string
	server    string
}

// connect loads the configuration the flags and the environment name.
func (p *Provider) connect() (*cluster, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if p.Kubeconfig != "" {
		rules.ExplicitPath = p.Kubeconfig
	}
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
	cfg, err := cc.ClientConfig()
	if err != nil {
		if inCluster, ierr := rest.InClusterConfig(); p.Kubeconfig == "" && ierr == nil {
			cfg = inCluster
		} else {
			return nil, fmt.Errorf("%w: kubernetes: no cluster configuration: %v (pass --kubeconfig FILE, set KUBECONFIG, or run oac-shim in a Pod with a service account)", provider.ErrUnavailable, err)
		}
	}
	ns := p.Namespace
	if ns == "" {
		if n, _, err := cc.Namespace(); err == nil && n != "" {
			ns = n
		} else {
			ns = "default"
		}
	}
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "oac-shim"
	cfg.Timeout = 0 // per call, by context; exec streams last
	// client-go's default limit (5 a second, bursts of 10) held a
	// claimed sandbox's checks back about 0.8 s: its create asks about
	// 15 permissions and reads the pool and its template. One shim makes
	// a few dozen calls in a sandbox's life; the API server's own
	// priority and fairness is what protects it.
	cfg.QPS, cfg.Burst = 50, 100
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: kubernetes: %v", provider.ErrUnavailable, err)
	}
	c := &cluster{cfg: cfg, cs: cs, namespace: ns, server: cfg.Host}
	if c.dyn, err = newDynamic(c); err != nil {
		return nil, fmt.Errorf("%w: kubernetes: %v", provider.ErrUnavailable, err)
	}
	return c, nil
}

// found is what Check found.
type found struct {
	c       *cluster
	version string
	userNS  bool   // hostUsers: false
	userWhy string // why not, or why
}

// check finds a reachable API server where the caller holds every
// permission a run needs (kept: a kept sandbox's too) and may list Pods in the
// namespace, valid settings, and then what the sandbox's Pod comes from:
// for a bare Pod an image and whether Pods get user namespaces, for a
// claim the warm pool and its template (checkAgentSandbox). Errors wrap
// ErrUnavailable (or ErrInvalidSpec for a bad flag) and say what to do.
func (p *Provider) check(ctx context.Context, kept bool) (found, error) {
	var f found
	if err := p.checkFlags(); err != nil {
		return f, err
	}
	c, err := p.connect()
	if err != nil {
		return f, err
	}
	f.c = c
	ctx, cancel := context.WithTimeout(ctx, quickTimeout)
	defer cancel()
	v, err := c.cs.Discovery().ServerVersion()
	if err != nil {
		return f, fmt.Errorf("%w: kubernetes: the API server at %s does not answer: %v", provider.ErrUnavailable, c.server, err)
	}
	f.version = v.GitVersion
	claims := p.API == APIAgentSandbox && !kept
	if err := checkPermissions(ctx, c, kept, claims); err != nil {
		return f, err
	}
	if _, err := c.cs.CoreV1().Pods(c.namespace).List(ctx, metav1.ListOptions{LabelSelector: selector(""), Limit: 1}); err != nil {
		return f, fmt.Errorf("%w: kubernetes: cannot list Pods in namespace %s at %s: %v (grant the Role in docs/kubernetes.md)", provider.ErrUnavailable, c.namespace, c.server, err)
	}
	if claims {
		return f, checkAgentSandbox(ctx, c, p.WarmPool)
	}
	if p.Image == "" {
		return f, fmt.Errorf("%w: kubernetes: no guest image given (--k8s-image IMAGE: oac-image build's OCI image, pushed to a registry the nodes pull from)", provider.ErrUnavailable)
	}
	f.userNS, f.userWhy, err = p.userNamespaces(ctx, c)
	return f, err
}

// checkFlags checks the settings that need no cluster.
func (p *Provider) checkFlags() error {
	switch p.PullPolicy {
	case "", string(corev1.PullIfNotPresent), string(corev1.PullAlways), string(corev1.PullNever):
	default:
		return fmt.Errorf("%w: --k8s-pull-policy %q: want IfNotPresent, Always or Never", provider.ErrInvalidSpec, p.PullPolicy)
	}
	switch p.UserNamespaces {
	case "", "auto", "require", "off":
	default:
		return fmt.Errorf("%w: --k8s-user-namespaces %q: want auto, require or off", provider.ErrInvalidSpec, p.UserNamespaces)
	}
	if _, err := parseResources("k8s-requests", p.Requests); err != nil {
		return fmt.Errorf("%w: %v", provider.ErrInvalidSpec, err)
	}
	if _, err := parseResources("k8s-limits", p.Limits); err != nil {
		return fmt.Errorf("%w: %v", provider.ErrInvalidSpec, err)
	}
	if p.KeptSize != "" {
		if q, err := resource.ParseQuantity(p.KeptSize); err != nil || q.Sign() <= 0 {
			return fmt.Errorf("%w: --k8s-kept-size %q: want a size such as 10Gi", provider.ErrInvalidSpec, p.KeptSize)
		}
	}
	if err := checkAppArmorName(p.AppArmor); err != nil {
		return fmt.Errorf("%w: %v", provider.ErrInvalidSpec, err)
	}
	switch p.API {
	case "", APIPods:
		if p.WarmPool != "" {
			return fmt.Errorf("%w: --k8s-warm-pool is for --k8s-api %s", provider.ErrInvalidSpec, APIAgentSandbox)
		}
	case APIAgentSandbox:
		if p.WarmPool == "" {
			return fmt.Errorf("%w: --k8s-api %s claims from a SandboxWarmPool: name it with --k8s-warm-pool NAME", provider.ErrInvalidSpec, APIAgentSandbox)
		}
	default:
		return fmt.Errorf("%w: --k8s-api %q: want %s or %s", provider.ErrInvalidSpec, p.API, APIPods, APIAgentSandbox)
	}
	return nil
}

// userNamespaces decides hostUsers: every node's runtime handler (the
// RuntimeClass's, else the default one) must report user namespace
// support. Nodes the caller may not list count as unknown.
func (p *Provider) userNamespaces(ctx context.Context, c *cluster) (bool, string, error) {
	if p.UserNamespaces == "off" {
		return false, "off (--k8s-user-namespaces off)", nil
	}
	handler := ""
	if p.RuntimeClass != "" {
		if rc, err := c.cs.NodeV1().RuntimeClasses().Get(ctx, p.RuntimeClass, metav1.GetOptions{}); err == nil {
			handler = rc.Handler
		}
	}
	why := ""
	nodes, err := c.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	switch {
	case err != nil:
		why = "unknown: cannot list nodes (" + shortErr(err) + ")"
	case len(nodes.Items) == 0:
		why = "unknown: no nodes"
	default:
		for _, n := range nodes.Items {
			ok := false
			for _, h := range n.Status.RuntimeHandlers {
				if h.Name == handler && h.Features != nil && h.Features.UserNamespaces != nil && *h.Features.UserNamespaces {
					ok = true
				}
			}
			if !ok {
				why = "node " + n.Name + "'s runtime does not support them"
				break
			}
		}
	}
	if why == "" {
		return true, "every node's runtime supports them: hostUsers false", nil
	}
	if p.UserNamespaces == "require" {
		return false, "", fmt.Errorf("%w: kubernetes: user namespaces are required (--k8s-user-namespaces require) but %s", provider.ErrUnavailable, why)
	}
	return false, "not used: " + why, nil
}

func shortErr(err error) string {
	if s := apierrors.ReasonForError(err); s != metav1.StatusReasonUnknown {
		return string(s)
	}
	return err.Error()
}

// Check implements provider.Provider.
func (p *Provider) Check(ctx context.Context) error {
	_, err := p.check(ctx, false)
	return err
}

// Detail implements provider.Detailer.
func (p *Provider) Detail(ctx context.Context) string {
	f, err := p.check(ctx, false)
	if err != nil {
		return ""
	}
	rc := "the nodes' default runtime"
	if p.RuntimeClass != "" {
		rc = "RuntimeClass " + p.RuntimeClass
	}
	aa := "the runtime's default (--k8s-apparmor-profile names none)"
	if p.AppArmor != "" {
		aa = "Localhost " + p.AppArmor + " (every node must have it loaded: docs/kubernetes.md#apparmor)"
	}
	if p.API == APIAgentSandbox {
		return fmt.Sprintf("cluster %s at %s, namespace %s, sandboxes claimed from SandboxWarmPool %s (agent-sandbox; the pool's template sets the Pod), kept sandboxes as bare Pods of image %s",
			f.version, f.c.server, f.c.namespace, p.WarmPool, p.Image)
	}
	as := "agent-sandbox not served (bare Pods only)"
	if res, err := f.c.cs.Discovery().ServerResourcesForGroupVersion(claimsGVR.GroupVersion().String()); err == nil && len(res.APIResources) > 0 {
		as = "agent-sandbox served (--k8s-api agent-sandbox claims from its warm pools)"
	}
	return fmt.Sprintf("cluster %s at %s, namespace %s, one bare Pod per sandbox (%s), image %s, %s, seccomp %s, AppArmor %s, user namespaces %s",
		f.version, f.c.server, f.c.namespace, as, p.Image, rc, p.seccompName(), aa, f.userWhy)
}

// checkAppArmorName refuses what is not the name of a profile loaded on
// the nodes: the Pod never asks for unconfined.
func checkAppArmorName(name string) error {
	switch {
	case name == "":
		return nil
	case strings.EqualFold(name, "unconfined"), strings.EqualFold(name, string(corev1.AppArmorProfileTypeUnconfined)),
		strings.EqualFold(name, string(corev1.AppArmorProfileTypeRuntimeDefault)), strings.ContainsAny(name, " \t\n/"):
		return fmt.Errorf("--k8s-apparmor-profile %q: name a profile loaded on the nodes (%s: examples/apparmor/%s), or leave it out for the runtime's default; never unconfined", name, apparmor.Name, apparmor.Name)
	}
	return nil
}

// Workload implements provider.Confiner.
func (p *Provider) Workload(ctx context.Context) string {
	return provider.WorkloadSummary(provider.DaemonIsolatedNested,
		"the Pod's limits ("+p.Limits+") and "+provider.RlimitLimits(0))
}

func (p *Provider) seccompName() string {
	if p.Seccomp == "" || p.Seccomp == string(corev1.SeccompProfileTypeRuntimeDefault) {
		return "RuntimeDefault"
	}
	return "Localhost " + p.Seccomp
}

func (p *Provider) holder() string {
	if p.Holder != "" {
		return p.Holder
	}
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "unknown-host"
	}
	return h
}

// config is the Pod's configuration for spec.
func (p *Provider) config(f found, spec provider.Spec) (podConfig, error) {
	c, err := p.flagConfig()
	if err != nil {
		return podConfig{}, err
	}
	c.Name, c.Namespace, c.Holder, c.Hostname = spec.Name, f.c.namespace, p.holder(), spec.Hostname
	c.UserNamespaces, c.Kept = f.userNS, spec.Keep != nil
	return c, nil
}

// flagConfig is the part of the Pod's configuration the flags decide,
// the same for every sandbox: a bare Pod's (config) and a warm one's
// (WarmPod) start from it.
func (p *Provider) flagConfig() (podConfig, error) {
	req, err := parseResources("k8s-requests", p.Requests)
	if err != nil {
		return podConfig{}, err
	}
	lim, err := parseResources("k8s-limits", p.Limits)
	if err != nil {
		return podConfig{}, err
	}
	seccomp := p.Seccomp
	if seccomp == string(corev1.SeccompProfileTypeRuntimeDefault) {
		seccomp = ""
	}
	pull := corev1.PullPolicy(p.PullPolicy)
	if pull == "" {
		pull = corev1.PullIfNotPresent
	}
	return podConfig{
		Image: p.Image, PullPolicy: pull, RuntimeClass: p.RuntimeClass, Seccomp: seccomp, AppArmor: p.AppArmor,
		Requests: req, Limits: lim, Debug: p.Debug, GracePeriodSeconds: 5,
	}, nil
}

// Create implements provider.Provider: it takes the name's Lease,
// removes what a killed shim of this holder left of it (and of every other
// sandbox of the holder no shim runs), and for a kept sandbox makes or finds its
// claim. The Pod is made by Start.
func (p *Provider) Create(ctx context.Context, spec provider.Spec) (_ provider.Instance, err error) {
	if spec.Rootfs != "" {
		return nil, fmt.Errorf("%w: kubernetes runs an image (--k8s-image), not a --rootfs directory", provider.ErrInvalidSpec)
	}
	f, err := p.check(ctx, spec.Keep != nil)
	if err != nil {
		return nil, err
	}
	cfg, err := p.config(f, spec)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", provider.ErrInvalidSpec, err)
	}
	in := &Instance{
		Process: provider.NewProcess(provider.Exits("the Pod's agent exited", "the sandbox's Pod ended"), errors.New("the sandbox's Pod was not gone within 10s of its deletion")),
		p:       p, spec: spec, c: f.c, cfg: cfg, ln: newOnceListener(), viaClaim: p.viaClaim(spec),
	}
	if !in.viaClaim {
		in.pod = ObjectName(spec.Name)
	}
	defer in.DestroyOnError(&err)
	lease, err := in.claimName(ctx)
	if err != nil {
		return nil, err
	}
	if in.viaClaim {
		p.sweepClaims(ctx, f.c, spec.Name)
		if err := in.removeLeftoverClaim(ctx); err != nil {
			return nil, err
		}
	} else {
		p.sweep(ctx, f.c, spec.Name)
		if err := in.removeLeftover(ctx); err != nil {
			return nil, err
		}
	}
	if spec.Keep != nil {
		if err := in.keep(ctx); err != nil {
			return nil, err
		}
	}
	in.Listen(in.ln)
	in.OnDestroy(unlessLost(lease, in.removeObjects))
	in.KillBy(func() error {
		return in.KillAsking(func() {
			in.mu.Lock()
			claim := in.claimUID
			in.mu.Unlock()
			if claim != "" {
				_ = in.deleteSandboxClaim(context.Background(), claim)
			}
			_ = in.deletePod(context.Background(), in.cfg.GracePeriodSeconds)
		}, time.Duration(in.cfg.GracePeriodSeconds+5)*time.Second)
	})
	return in, nil
}

// Instance is one sandbox's Pod.
type Instance struct {
	*provider.Process
	p    *Provider
	spec provider.Spec
	c    *cluster
	cfg  podConfig
	ln   *onceListener
	// viaClaim: the Pod is a SandboxClaim's (--k8s-api agent-sandbox).
	viaClaim bool

	mu sync.Mutex
	// pod is the Pod's name: oac-NAME, or the claim's Sandbox's Pod
	// once it is bound.
	pod      string
	uid      types.UID
	claimUID types.UID
	sandbox  string // the claim's Sandbox, once bound
	cancel   context.CancelFunc
}

// podName is the sandbox's Pod's name ("" before a claim is bound).
func (in *Instance) podName() string {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.pod
}

// owned reports whether meta is an object of this provider for the
// sandbox name.
func owned(meta metav1.ObjectMeta, name string) bool {
	return meta.Labels[LabelManagedBy] == ManagedBy && meta.Labels[LabelSandbox] == name
}

// removeLeftover removes the sandbox's Pod and policy a killed shim of
// this host left (we hold the name here), and refuses one this provider
// did not make or another host's shim holds.
func (in *Instance) removeLeftover(ctx context.Context) error {
	name := ObjectName(in.spec.Name)
	pod, err := in.c.cs.CoreV1().Pods(in.c.namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return in.apiErr("look for a leftover Pod", err)
	case !owned(pod.ObjectMeta, in.spec.Name):
		return fmt.Errorf("%w: kubernetes: a Pod %s/%s exists that oac did not make for this sandbox: remove or rename it", provider.ErrExists, in.c.namespace, name)
	case pod.Annotations[AnnotationHolder] != in.cfg.Holder:
		return fmt.Errorf("%w: kubernetes: sandbox %s runs in namespace %s from host %s: stop it there, or use another name", provider.ErrExists, in.spec.Name, in.c.namespace, pod.Annotations[AnnotationHolder])
	case pod.Labels[LabelKept] == "true" && in.spec.Keep == nil:
		return fmt.Errorf("%w: kubernetes: %s is a kept sandbox's Pod: start that sandbox, or discard it first", provider.ErrExists, name)
	default:
		if err := in.deletePodAndWait(ctx, pod.UID); err != nil {
			return err
		}
	}
	return in.deletePolicy(ctx)
}

// sweep removes the Pods and policies of this holder's sandboxes that no
// shim runs (their Lease is gone, released or long unrenewed): what shims
// killed before they could remove them left. Errors are not fatal: the
// next command tries again.
func (p *Provider) sweep(ctx context.Context, c *cluster, self string) {
	pods, err := c.cs.CoreV1().Pods(c.namespace).List(ctx, metav1.ListOptions{LabelSelector: selector("")})
	if err != nil {
		return
	}
	holder := p.holder()
	for _, pod := range pods.Items {
		name := pod.Labels[LabelSandbox]
		if name == self || pod.Annotations[AnnotationHolder] != holder || !provider.ValidName(name) {
			continue
		}
		d, err := p.idle(ctx, c, name)
		if err != nil {
			continue // a shim runs it, or we cannot tell
		}
		zero := int64(0)
		_ = c.cs.CoreV1().Pods(c.namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &pod.UID}})
		_ = c.cs.NetworkingV1().NetworkPolicies(c.namespace).Delete(ctx, ObjectName(name), metav1.DeleteOptions{})
		d.Release()
	}
}

// keep makes the kept sandbox's claim, or checks the one an earlier run
// made.
func (in *Instance) keep(ctx context.Context) error {
	pvcs := in.c.cs.CoreV1().PersistentVolumeClaims(in.c.namespace)
	have, err := pvcs.Get(ctx, ClaimName(in.spec.Name), metav1.GetOptions{})
	switch {
	case err == nil && !owned(have.ObjectMeta, in.spec.Name):
		return fmt.Errorf("%w: kubernetes: a claim %s/%s exists that oac did not make for this sandbox: remove or rename it", provider.ErrExists, in.c.namespace, have.Name)
	case err == nil && have.DeletionTimestamp != nil:
		return fmt.Errorf("%w: kubernetes: the kept sandbox's claim %s/%s is being deleted: wait, or discard the sandbox", provider.ErrExists, in.c.namespace, have.Name)
	case err == nil:
		return nil
	case !apierrors.IsNotFound(err):
		return in.apiErr("look for the kept sandbox's claim", err)
	}
	size := resource.MustParse("10Gi")
	if in.p.KeptSize != "" {
		size = resource.MustParse(in.p.KeptSize)
	}
	made, err := pvcs.Create(ctx, claim(in.spec.Name, in.c.namespace, in.cfg.Holder, in.p.StorageClass, size), metav1.CreateOptions{})
	if err != nil {
		return in.apiErr("make the kept sandbox's claim", err)
	}
	// A first create that fails after this removes what it made.
	in.OnDestroy(func() error {
		if in.Started() {
			return nil
		}
		return in.deleteClaim(context.Background(), made.UID)
	})
	return nil
}

// Start implements provider.Instance: the policy, then the Pod, then (in
// the background) the bridge once the Pod runs; Accept returns it.
func (in *Instance) Start(ctx context.Context) error {
	return in.StartOnce("kubernetes", func() error { return in.start(ctx) })
}

func (in *Instance) start(ctx context.Context) error {
	if in.viaClaim {
		return in.startBound(ctx)
	}
	np := networkPolicy(in.cfg)
	policies := in.c.cs.NetworkingV1().NetworkPolicies(in.c.namespace)
	if _, err := policies.Create(ctx, np, metav1.CreateOptions{}); err != nil {
		return in.apiErr("make the sandbox's NetworkPolicy", err)
	}
	pod, err := in.c.cs.CoreV1().Pods(in.c.namespace).Create(ctx, podSpec(in.cfg), metav1.CreateOptions{})
	if err != nil {
		return in.apiErr("make the sandbox's Pod", err)
	}
	// The policy goes with the Pod wherever a garbage collector runs.
	owner := fmt.Sprintf(`{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"Pod","name":%q,"uid":%q}]}}`, pod.Name, pod.UID)
	if _, err := policies.Patch(ctx, np.Name, types.MergePatchType, []byte(owner), metav1.PatchOptions{}); err != nil {
		in.logf("kubernetes: could not make the Pod own its NetworkPolicy (it is removed with the sandbox all the same): %v", err)
	}
	in.run(pod.UID)
	return nil
}

// startBound is start for a claim: the claim, bound by agent-sandbox's
// controller to a warm Pod of the pool (or one it makes), then the
// bridge to that Pod as to a bare one. The template's NetworkPolicy
// denies the Pod all traffic from before the claim (checkTemplate).
func (in *Instance) startBound(ctx context.Context) error {
	name, err := in.startClaim(ctx)
	if err != nil {
		return err
	}
	pod, err := in.c.cs.CoreV1().Pods(in.c.namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return in.apiErr("read the claimed Sandbox's Pod "+name, err)
	}
	in.mu.Lock()
	in.pod = name
	in.mu.Unlock()
	in.run(pod.UID)
	return nil
}

// run watches the Pod uid and starts the bridge to it.
func (in *Instance) run(uid types.UID) {
	in.mu.Lock()
	in.uid = uid
	bctx, cancel := context.WithCancel(context.Background())
	in.cancel = cancel
	in.mu.Unlock()
	in.Watch(&podWaiter{in: in, ctx: bctx, uid: uid})
	go in.bridge(bctx)
}

func (in *Instance) logf(format string, a ...any) {
	fmt.Fprintf(provider.Output(in.spec.Stderr), format+"\n", a...)
}

// bridge waits until the agent runs, execs `oac-guest bridge` into it and
// hands the stream to Accept; it then follows the agent's log into
// Spec.Stderr.
func (in *Instance) bridge(ctx context.Context) {
	if err := in.waitRunning(ctx); err != nil {
		in.ln.fail(err)
		return
	}
	exec, err := in.executor()
	if err != nil {
		in.ln.fail(err)
		return
	}
	host, pod := net.Pipe()
	go func() {
		err := exec.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: pod, Stdout: pod, Stderr: kit.NewConsole(provider.Output(in.spec.Stderr), logLimit)})
		if err != nil && ctx.Err() == nil {
			in.logf("kubernetes: the session's exec stream ended: %v", err)
		}
		pod.Close()
	}()
	in.ln.deliver(host)
	in.followLog(ctx)
}

// executor is the exec of the bridge: WebSocket, SPDY where the server
// refuses the upgrade.
func (in *Instance) executor() (remotecommand.Executor, error) {
	req := in.c.cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(in.c.namespace).Name(in.podName()).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: ContainerName, Command: []string{AgentPath, "bridge", "unix://" + SessionSocket},
			Stdin: true, Stdout: true, Stderr: true,
		}, scheme.ParameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(in.c.cfg, "GET", req.URL().String())
	if err != nil {
		return nil, fmt.Errorf("kubernetes: exec: %w", err)
	}
	spdy, err := remotecommand.NewSPDYExecutor(in.c.cfg, "POST", req.URL())
	if err != nil {
		return nil, fmt.Errorf("kubernetes: exec: %w", err)
	}
	return remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
}

// followLog copies the agent's log (its stderr, which the kubelet keeps)
// into Spec.Stderr, bounded; a log that cannot be read is skipped.
func (in *Instance) followLog(ctx context.Context) {
	if in.spec.Stderr == nil {
		return
	}
	rc, err := in.c.cs.CoreV1().Pods(in.c.namespace).GetLogs(in.podName(), &corev1.PodLogOptions{Container: ContainerName, Follow: true}).Stream(ctx)
	if err != nil {
		if ctx.Err() == nil {
			in.logf("kubernetes: the agent's log cannot be read (%s): grant get on pods/log (docs/kubernetes.md) to see it here", shortErr(err))
		}
		return
	}
	defer rc.Close()
	_, _ = io.Copy(kit.NewConsole(in.spec.Stderr, logLimit), rc)
}

// waitRunning waits until the agent's container runs, failing at once on
// what will not pass by itself (an image the node cannot get, a profile
// it lacks, a Pod that ended).
func (in *Instance) waitRunning(ctx context.Context) error {
	for {
		pod, err := in.c.cs.CoreV1().Pods(in.c.namespace).Get(ctx, in.podName(), metav1.GetOptions{})
		if err != nil {
			return in.apiErr("watch the sandbox's Pod", err)
		}
		if err := podProblem(pod); err != nil {
			return err
		}
		for _, s := range pod.Status.ContainerStatuses {
			if s.Name == ContainerName && s.State.Running != nil {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// podProblem says why a Pod cannot come up, or nil while it may.
func podProblem(pod *corev1.Pod) error {
	if pod.Status.Reason == "AppArmor" {
		return appArmorRefused(pod)
	}
	switch pod.Status.Phase {
	case corev1.PodFailed, corev1.PodSucceeded:
		return fmt.Errorf("%w: kubernetes: the sandbox's Pod ended before its agent ran (%s: %s)", provider.ErrUnavailable, pod.Status.Reason, pod.Status.Message)
	}
	for _, s := range append(append([]corev1.ContainerStatus{}, pod.Status.InitContainerStatuses...), pod.Status.ContainerStatuses...) {
		if w := s.State.Waiting; w != nil {
			switch w.Reason {
			case "ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName":
				return fmt.Errorf("%w: kubernetes: the node cannot get image %s (%s: %s): push it to a registry the nodes pull from, or load it on the nodes with --k8s-pull-policy Never", provider.ErrUnavailable, s.Image, w.Reason, w.Message)
			case "CreateContainerConfigError", "CreateContainerError", "RunContainerError":
				if strings.Contains(strings.ToLower(w.Message), "apparmor") {
					// containerd: "failed to generate apparmor spec opts:
					// apparmor profile not found NAME".
					return fmt.Errorf("%w: %w: kubernetes: the node %s cannot run the sandbox's container under its AppArmor profile (%s: %s): load examples/apparmor/%s on every node (docs/kubernetes.md#apparmor)",
						provider.ErrUnavailable, apparmor.ErrProfileMissing, pod.Spec.NodeName, w.Reason, w.Message, apparmor.Name)
				}
				return fmt.Errorf("%w: kubernetes: the node cannot run the sandbox's container (%s: %s): see docs/kubernetes.md (the seccomp profile on the nodes, the RuntimeClass)", provider.ErrUnavailable, w.Reason, w.Message)
			}
		}
		if t := s.State.Terminated; t != nil && s.Name == SeedContainer && t.ExitCode != 0 {
			return fmt.Errorf("%w: kubernetes: seeding the kept sandbox's volume failed (exit %d: %s)", provider.ErrUnavailable, t.ExitCode, strings.TrimSpace(t.Message))
		}
	}
	return nil
}

// appArmorRefused says why the kubelet refused a Pod at admission for
// its AppArmor profile (Reason "AppArmor"): a node without AppArmor
// ("Cannot enforce AppArmor: AppArmor is not enabled on the host"), or,
// before Kubernetes 1.30, a profile the node had not loaded.
func appArmorRefused(pod *corev1.Pod) error {
	if strings.Contains(pod.Status.Message, "not loaded") {
		return fmt.Errorf("%w: %w: kubernetes: the node %s refused the sandbox's Pod (%s): load examples/apparmor/%s on every node (docs/kubernetes.md#apparmor)",
			provider.ErrUnavailable, apparmor.ErrProfileMissing, pod.Spec.NodeName, pod.Status.Message, apparmor.Name)
	}
	return fmt.Errorf("%w: kubernetes: the node %s refused the sandbox's Pod (%s): it cannot enforce the AppArmor profile --k8s-apparmor-profile names; leave the flag out for nodes without AppArmor, or keep the Pods off them (docs/kubernetes.md#apparmor)",
		provider.ErrUnavailable, pod.Spec.NodeName, pod.Status.Message)
}

// podWaiter is the Pod as provider.Process watches it: it ends when the
// Pod ends or is deleted.
type podWaiter struct {
	in  *Instance
	ctx context.Context
	uid types.UID
}

// Wait implements provider.Waiter.
func (w *podWaiter) Wait() error {
	pods := w.in.c.cs.CoreV1().Pods(w.in.c.namespace)
	name := w.in.podName()
	for {
		pod, err := pods.Get(w.ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err) || (err == nil && pod.UID != w.uid):
			return errors.New("the sandbox's Pod was deleted")
		case err == nil && pod.Status.Phase == corev1.PodSucceeded:
			return nil
		case err == nil && pod.Status.Phase == corev1.PodFailed:
			return fmt.Errorf("the sandbox's Pod failed: %s %s", pod.Status.Reason, pod.Status.Message)
		case w.ctx.Err() != nil:
			return errors.New("the sandbox's Pod was deleted")
		}
		rv := ""
		if err == nil {
			rv = pod.ResourceVersion
		}
		wctx, cancel := context.WithTimeout(w.ctx, 5*time.Minute)
		wt, err := pods.Watch(wctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String(), ResourceVersion: rv})
		if err != nil {
			cancel()
			select {
			case <-w.ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		for ev := range wt.ResultChan() {
			if ev.Type == watch.Deleted || ev.Type == watch.Error {
				break
			}
			if p, ok := ev.Object.(*corev1.Pod); ok && (p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed) {
				break
			}
		}
		wt.Stop()
		cancel()
	}
}

// Kill implements provider.Waiter: the Pod is deleted at once.
func (w *podWaiter) Kill() error { return w.in.deletePod(context.Background(), 0) }

// Pid implements provider.Waiter: the Pod has no pid on this host.
func (w *podWaiter) Pid() int { return 0 }

// deletePod deletes this run's Pod with a grace period.
func (in *Instance) deletePod(ctx context.Context, grace int64) error {
	in.mu.Lock()
	uid, name := in.uid, in.pod
	in.mu.Unlock()
	if uid == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, quickTimeout)
	defer cancel()
	err := in.c.cs.CoreV1().Pods(in.c.namespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &grace, Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return in.apiErr("delete the sandbox's Pod", err)
	}
	return nil
}

// deletePodAndWait deletes the Pod uid and waits until it is gone.
func (in *Instance) deletePodAndWait(ctx context.Context, uid types.UID) error {
	pods := in.c.cs.CoreV1().Pods(in.c.namespace)
	name := ObjectName(in.spec.Name)
	grace := in.cfg.GracePeriodSeconds
	err := pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &grace, Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return in.apiErr("delete the sandbox's Pod", err)
	}
	ctx, cancel := context.WithTimeout(ctx, goneTimeout)
	defer cancel()
	for {
		pod, err := pods.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && pod.UID != uid) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kubernetes: the sandbox's Pod %s/%s was not gone within %s of its deletion: is its node up?", in.c.namespace, name, goneTimeout)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (in *Instance) deletePolicy(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, quickTimeout)
	defer cancel()
	policies := in.c.cs.NetworkingV1().NetworkPolicies(in.c.namespace)
	np, err := policies.Get(ctx, ObjectName(in.spec.Name), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return in.apiErr("look for the sandbox's NetworkPolicy", err)
	}
	if !owned(np.ObjectMeta, in.spec.Name) {
		return nil
	}
	if err := policies.Delete(ctx, np.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &np.UID}}); err != nil && !apierrors.IsNotFound(err) {
		return in.apiErr("delete the sandbox's NetworkPolicy", err)
	}
	return nil
}

func (in *Instance) deleteClaim(ctx context.Context, uid types.UID) error {
	ctx, cancel := context.WithTimeout(ctx, quickTimeout)
	defer cancel()
	err := in.c.cs.CoreV1().PersistentVolumeClaims(in.c.namespace).Delete(ctx, ClaimName(in.spec.Name), metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) {
		return in.apiErr("delete the kept sandbox's claim", err)
	}
	return nil
}

// removeObjects is Destroy's step: the bridge ends, the Pod is gone, then
// the policy. A kept sandbox's claim stays.
func (in *Instance) removeObjects() error {
	in.mu.Lock()
	uid, claimUID, sandbox, cancel := in.uid, in.claimUID, in.sandbox, in.cancel
	in.mu.Unlock()
	ctx := context.Background()
	var err error
	switch {
	case in.viaClaim && claimUID != "":
		err = in.removeSandboxClaimAndWait(ctx, claimUID, sandbox)
	case !in.viaClaim && uid != "":
		err = in.deletePodAndWait(ctx, uid)
	}
	if cancel != nil {
		cancel()
	}
	in.ln.Close()
	if in.viaClaim {
		return err
	}
	return errors.Join(err, in.deletePolicy(ctx))
}

// apiErr wraps an API server's refusal with what was being done.
func (in *Instance) apiErr(what string, err error) error {
	switch {
	case apierrors.IsForbidden(err):
		return fmt.Errorf("%w: kubernetes: %s in namespace %s: %v (grant the Role in docs/kubernetes.md)", provider.ErrUnavailable, what, in.c.namespace, err)
	case apierrors.IsAlreadyExists(err):
		return fmt.Errorf("%w: kubernetes: %s: %v", provider.ErrExists, what, err)
	case apierrors.IsInvalid(err):
		return fmt.Errorf("%w: kubernetes: %s: %v", provider.ErrInvalidSpec, what, err)
	}
	return fmt.Errorf("kubernetes: %s in namespace %s: %w", what, in.c.namespace, err)
}

// Discard implements provider.Keeper: a kept sandbox is its claim (and
// the Pod and policy a killed shim left).
func (p *Provider) Discard(ctx context.Context, name, dir string) error {
	c, err := p.connect()
	if err != nil {
		return err
	}
	return p.withName(ctx, c, name, func() error {
		in := &Instance{p: p, spec: provider.Spec{Name: name}, c: c, cfg: podConfig{Name: name, Holder: p.holder(), GracePeriodSeconds: 5}}
		pod, err := c.cs.CoreV1().Pods(c.namespace).Get(ctx, ObjectName(name), metav1.GetOptions{})
		switch {
		case err == nil && owned(pod.ObjectMeta, name) && pod.Annotations[AnnotationHolder] == in.cfg.Holder:
			if err := in.deletePodAndWait(ctx, pod.UID); err != nil {
				return err
			}
		case err != nil && !apierrors.IsNotFound(err):
			return in.apiErr("look for the sandbox's Pod", err)
		}
		if err := in.deletePolicy(ctx); err != nil {
			return err
		}
		pvc, err := c.cs.CoreV1().PersistentVolumeClaims(c.namespace).Get(ctx, ClaimName(name), metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err != nil:
			return in.apiErr("look for the kept sandbox's claim", err)
		case !owned(pvc.ObjectMeta, name):
			return nil
		}
		if err := in.deleteClaim(ctx, pvc.UID); err != nil {
			return err
		}
		return waitGone(ctx, func(ctx context.Context) (bool, error) {
			_, err := c.cs.CoreV1().PersistentVolumeClaims(c.namespace).Get(ctx, ClaimName(name), metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return true, nil
			}
			return false, err
		}, "the kept sandbox's claim "+ClaimName(name))
	})
}

// waitGone polls gone until it says so, for at most goneTimeout.
func waitGone(ctx context.Context, gone func(context.Context) (bool, error), what string) error {
	ctx, cancel := context.WithTimeout(ctx, goneTimeout)
	defer cancel()
	for {
		ok, err := gone(ctx)
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = ctx.Err()
			}
			return fmt.Errorf("kubernetes: %s was not gone within %s of its deletion: %v", what, goneTimeout, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
