//go:build linux

package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/internal/kcluster"
)

// kubeLease is a sandbox's Lease as the test reads it.
type kubeLease struct {
	Metadata struct {
		Labels      map[string]string
		Annotations map[string]string
	}
	Spec struct {
		HolderIdentity       string `json:"holderIdentity"`
		LeaseDurationSeconds int    `json:"leaseDurationSeconds"`
		RenewTime            string `json:"renewTime"`
	}
}

// leaseOf reads sandbox name's Lease in namespace default; ok false when
// there is none.
func leaseOf(c *kcluster.Cluster, name string) (kubeLease, bool) {
	var l kubeLease
	err := c.Get(context.Background(), "/apis/coordination.k8s.io/v1/namespaces/default/leases/oac-"+name, &l)
	return l, err == nil
}

// podUID is the UID of sandbox name's Pod, "" when there is none.
func podUID(c *kcluster.Cluster, name string) string {
	var pod struct{ Metadata struct{ UID string } }
	if c.Get(context.Background(), "/api/v1/namespaces/default/pods/oac-"+name, &pod) != nil {
		return ""
	}
	return pod.Metadata.UID
}

// leaseIdle waits until the Lease of sandbox name went unrenewed for
// more than twice its duration (what a sweep of another sandbox's create
// needs before it removes what a killed shim left).
func leaseIdle(t *testing.T, c *kcluster.Cluster, name string) {
	t.Helper()
	require.Eventually(t, func() bool {
		l, ok := leaseOf(c, name)
		if !ok {
			return true
		}
		renewed, err := time.Parse(time.RFC3339Nano, l.Spec.RenewTime)
		return err == nil && time.Since(renewed) > 2*time.Duration(l.Spec.LeaseDurationSeconds)*time.Second
	}, time.Minute, 100*time.Millisecond, "the killed shim's Lease goes unrenewed")
}

// TestKubernetesTwoShimsOfOneHolderNeverRunOneSandboxAtOnce runs two
// replicas of one holder (--k8s-holder, as a Deployment's Pods are: each
// its own keep root and host state, nothing shared but the cluster). The
// second is refused the sandbox the first runs, while the first renews its
// Lease; once the first is SIGKILLed, a third takes the sandbox over after
// the Lease's duration, removes the Pod its predecessor left and runs it.
func TestKubernetesTwoShimsOfOneHolderNeverRunOneSandboxAtOnce(t *testing.T) {
	c := needKubernetes(t)
	image := kubeImage(t, c)
	name := uniqueName("replica")
	replica := func() *shim {
		args := []string{"--kubeconfig", c.Kubeconfig, "--k8s-image", image, "--k8s-pull-policy", "Never",
			"--k8s-holder", "oac-shim-e2e", "--k8s-lease-duration", "3s", "--keep-root", keepRootFor(t)}
		return startShim(t, sandboxSpec{provider: "kubernetes", name: name, bootstrap: serveBootstrap(name), args: args})
	}

	first := replica()
	first.waitState(api.StateReady, 2*time.Minute)
	lease, ok := leaseOf(c, name)
	require.True(t, ok, "the first shim holds the sandbox's Lease")
	assert.True(t, strings.HasPrefix(lease.Spec.HolderIdentity, "oac-shim-e2e/"), "held by a process of the holder: %q", lease.Spec.HolderIdentity)
	assert.Equal(t, 3, lease.Spec.LeaseDurationSeconds)
	assert.Equal(t, "oac-shim", lease.Metadata.Labels["app.kubernetes.io/managed-by"])
	assert.Equal(t, "oac-shim-e2e", lease.Metadata.Annotations["oac.dev/holder"])
	firstPod := podUID(c, name)
	require.NotEmpty(t, firstPod)

	second := replica()
	failed := second.exitFailed("invalid_config", time.Minute)
	assert.Contains(t, failed.Message, "sandbox "+name+" is held by the shim "+lease.Spec.HolderIdentity)
	assert.Contains(t, failed.Message, "was renewed while this shim waited")
	assert.Equal(t, firstPod, podUID(c, name), "the refused replica touched nothing of the sandbox")
	now, _ := leaseOf(c, name)
	assert.Equal(t, lease.Spec.HolderIdentity, now.Spec.HolderIdentity)

	first.signal(syscall.SIGKILL)
	first.exit(30 * time.Second)
	require.Equal(t, firstPod, podUID(c, name), "the killed shim left its Pod")

	third := replica()
	third.waitState(api.StateReady, 2*time.Minute)
	taken, ok := leaseOf(c, name)
	require.True(t, ok)
	assert.NotEqual(t, lease.Spec.HolderIdentity, taken.Spec.HolderIdentity, "taken over by the third shim")
	assert.NotEqual(t, firstPod, podUID(c, name), "the predecessor's Pod was removed, the sandbox runs in a new one")

	third.signal(syscall.SIGTERM)
	third.waitState(api.StateStopped, time.Minute)
	assert.Equal(t, 0, third.exit(time.Minute))
	assert.Empty(t, kubeLeftovers(c, name))
	_, ok = leaseOf(c, name)
	assert.False(t, ok, "the Lease is deleted at the end")
}

// kubeShimImageRef is the run's oac-shim-kubernetes image in the cluster's
// containerd: the tests' oac-shim (every provider, kubernetes too) as
// /bin/oac-shim and oac-guest beside it (a run looks for it there, though
// the kubernetes provider boots the guest image's own), nothing else.
const kubeShimImageRef = "oac.local/e2e/shim:1"

var kubeShim struct {
	once sync.Once
	err  error
}

// kubeShimImage imports the shim's image into the cluster once.
func kubeShimImage(t *testing.T, c *kcluster.Cluster) string {
	t.Helper()
	kubeShim.once.Do(func() {
		var files []kcluster.File
		for name, bin := range map[string]string{"oac-shim": bins.shim, "oac-guest": bins.guest} {
			b, err := os.ReadFile(bin)
			if err != nil {
				kubeShim.err = err
				return
			}
			files = append(files, kcluster.File{Path: "bin/" + name, Mode: 0o755, Data: b})
		}
		archive := filepath.Join(bins.dir, "shim-image.tar")
		if kubeShim.err = kcluster.WriteOCIArchive(archive, kubeShimImageRef, []string{"/bin/oac-shim"}, files); kubeShim.err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		kubeShim.err = c.ImportImage(ctx, archive)
	})
	require.NoError(t, kubeShim.err, "import the shim's image into the cluster")
	return kubeShimImageRef
}

// podLog is a container's log (the shim's events, one JSON line each).
func podLog(c *kcluster.Cluster, ns, pod, container string) (string, error) {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.CA)
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodGet, c.URL+"/api/v1/namespaces/"+ns+"/pods/"+pod+"/log?container="+container, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	resp, err := hc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("log of %s/%s: status %d: %s", ns, pod, resp.StatusCode, b)
	}
	return string(b), err
}

// shimPods are the names of the Deployment's live Pods (not being
// deleted).
func shimPods(c *kcluster.Cluster, ns, app string) []string {
	var list struct {
		Items []struct {
			Metadata struct {
				Name              string
				DeletionTimestamp *string `json:"deletionTimestamp"`
			}
		}
	}
	if c.Get(context.Background(), "/api/v1/namespaces/"+ns+"/pods?labelSelector=app%3D"+app, &list) != nil {
		return nil
	}
	var out []string
	for _, it := range list.Items {
		if it.Metadata.DeletionTimestamp == nil {
			out = append(out, it.Metadata.Name)
		}
	}
	return out
}

// leaseIn reads sandbox name's Lease in namespace ns.
func leaseIn(c *kcluster.Cluster, ns, name string) (kubeLease, bool) {
	var l kubeLease
	err := c.Get(context.Background(), "/apis/coordination.k8s.io/v1/namespaces/"+ns+"/leases/oac-"+name, &l)
	return l, err == nil
}

func podUIDIn(c *kcluster.Cluster, ns, name string) string {
	var pod struct{ Metadata struct{ UID string } }
	if c.Get(context.Background(), "/api/v1/namespaces/"+ns+"/pods/oac-"+name, &pod) != nil {
		return ""
	}
	return pod.Metadata.UID
}

// shimPodEnv is a namespace of the test's own where oac-shim-kubernetes
// runs as a Deployment's Pod with its service account, bound to
// examples/kubernetes/role.yaml's rules, as
// examples/kubernetes/shim-deployment.yaml runs it.
type shimPodEnv struct {
	t                *testing.T
	c                *kcluster.Cluster
	ns, app          string
	image, shimImage string
}

func newShimPodEnv(t *testing.T) *shimPodEnv {
	c := needKubernetes(t)
	e := &shimPodEnv{t: t, c: c, ns: uniqueName("shimpod"), app: "oac-shim-e2e", image: kubeImage(t, c), shimImage: kubeShimImage(t, c)}
	e.call(http.MethodPost, "/api/v1/namespaces", map[string]any{"metadata": map[string]any{"name": e.ns}})
	t.Cleanup(func() { _ = c.Do(context.Background(), http.MethodDelete, "/api/v1/namespaces/"+e.ns, nil, nil) })
	e.call(http.MethodPost, "/api/v1/namespaces/"+e.ns+"/serviceaccounts", map[string]any{"metadata": map[string]any{"name": e.app}})
	e.call(http.MethodPost, "/apis/rbac.authorization.k8s.io/v1/namespaces/"+e.ns+"/roles", map[string]any{"metadata": map[string]any{"name": "oac-shim"}, "rules": publishedRole(t)})
	e.call(http.MethodPost, "/apis/rbac.authorization.k8s.io/v1/namespaces/"+e.ns+"/rolebindings", map[string]any{
		"metadata": map[string]any{"name": "oac-shim"},
		"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "oac-shim"},
		"subjects": []any{map[string]any{"kind": "ServiceAccount", "name": e.app, "namespace": e.ns}},
	})
	// The ServiceAccount admission plugin refuses the sandbox's Pods until
	// the namespace's default account exists.
	require.Eventually(t, func() bool {
		return c.Get(context.Background(), "/api/v1/namespaces/"+e.ns+"/serviceaccounts/default", nil) == nil
	}, time.Minute, 200*time.Millisecond, "the namespace's default service account")
	return e
}

func (e *shimPodEnv) call(method, path string, body any) {
	e.t.Helper()
	require.NoError(e.t, e.c.Do(context.Background(), method, path, body, nil), "%s %s", method, path)
}

// providerArgs are the provider flags of every shim of the test.
func (e *shimPodEnv) providerArgs() []string {
	return []string{"--k8s-holder=" + e.app, "--k8s-lease-duration=3s", "--k8s-image=" + e.image, "--k8s-pull-policy=Never"}
}

// deploy makes the Deployment: one replica whose container runs the shim
// with args, its bootstrap from a Secret, keep holding its keep root (a
// start takes its provider flags from the record).
func (e *shimPodEnv) deploy(bootstrap string, keep map[string]any, args ...string) {
	e.call(http.MethodPost, "/api/v1/namespaces/"+e.ns+"/secrets", map[string]any{
		"metadata": map[string]any{"name": "oac-bootstrap"}, "stringData": map[string]any{"bootstrap.json": bootstrap},
	})
	u, err := url.Parse(e.c.URL)
	require.NoError(e.t, err)
	deployment := map[string]any{
		"metadata": map[string]any{"name": e.app},
		"spec": map[string]any{
			"replicas": 1, "strategy": map[string]any{"type": "Recreate"},
			"selector": map[string]any{"matchLabels": map[string]any{"app": e.app}},
			"template": map[string]any{
				"metadata": map[string]any{"labels": map[string]any{"app": e.app}},
				"spec": map[string]any{
					"serviceAccountName": e.app, "terminationGracePeriodSeconds": 60,
					// The test cluster's API server listens on the host's
					// loopback only: the shim's Pod shares the host's
					// network and is told where (a real cluster's Pods
					// reach it as the kubernetes Service).
					"hostNetwork": true,
					"containers": []any{map[string]any{
						"name": "shim", "image": e.shimImage, "imagePullPolicy": "Never",
						"args": append(args, "--bootstrap=/etc/oac-bootstrap/bootstrap.json", "--keep-root=/var/lib/oac"),
						"env": []any{
							map[string]any{"name": "KUBERNETES_SERVICE_HOST", "value": u.Hostname()},
							map[string]any{"name": "KUBERNETES_SERVICE_PORT", "value": u.Port()},
						},
						"volumeMounts": []any{
							map[string]any{"name": "keep", "mountPath": "/var/lib/oac"},
							map[string]any{"name": "run", "mountPath": "/run"},
							map[string]any{"name": "tmp", "mountPath": "/tmp"},
							map[string]any{"name": "bootstrap", "mountPath": "/etc/oac-bootstrap", "readOnly": true},
						},
					}},
					"volumes": []any{
						keep,
						map[string]any{"name": "run", "emptyDir": map[string]any{}},
						map[string]any{"name": "tmp", "emptyDir": map[string]any{}},
						map[string]any{"name": "bootstrap", "secret": map[string]any{"secretName": "oac-bootstrap", "defaultMode": 0o400}},
					},
				},
			},
		},
	}
	e.call(http.MethodPost, "/apis/apps/v1/namespaces/"+e.ns+"/deployments", deployment)
	e.t.Cleanup(func() {
		_ = e.c.Do(context.Background(), http.MethodDelete, "/apis/apps/v1/namespaces/"+e.ns+"/deployments/"+e.app, nil, nil)
	})
}

// ready waits until a shim Pod other than not says the sandbox is ready,
// and returns its name.
func (e *shimPodEnv) ready(not string) string {
	t := e.t
	t.Helper()
	var pod, log string
	failed := false
	ok := assert.Eventually(t, func() bool {
		for _, p := range shimPods(e.c, e.ns, e.app) {
			if p == not {
				continue
			}
			pod = p
			log, _ = podLog(e.c, e.ns, p, "shim")
			// A replacement Pod started while its predecessor still
			// renewed the Lease (an eviction) is refused: the Lease at
			// work, not a failure; the next one runs it.
			failed = strings.Contains(log, `"state":"failed"`) && !strings.Contains(log, "is held by the shim")
			if failed || strings.Contains(log, `"state":"ready"`) {
				return true
			}
		}
		return false
	}, 3*time.Minute, 500*time.Millisecond, "a shim Pod runs the sandbox to ready")
	if !ok || failed {
		var status any
		_ = e.c.Get(context.Background(), "/api/v1/namespaces/"+e.ns+"/pods/"+pod, &status)
		t.Fatalf("shim Pod %s did not run the sandbox; its log:\n%s\nits status: %v", pod, log, status)
	}
	return pod
}

// restart deletes the shim Pod with no grace (its shim SIGKILLed: no
// stop, nothing removed) and returns the Deployment's next Pod once its
// shim says the sandbox is ready.
func (e *shimPodEnv) restart(pod string) string {
	e.t.Helper()
	e.call(http.MethodDelete, "/api/v1/namespaces/"+e.ns+"/pods/"+pod, map[string]any{"gracePeriodSeconds": 0})
	next := e.ready(pod)
	log, err := podLog(e.c, e.ns, next, "shim")
	require.NoError(e.t, err)
	assert.Equal(e.t, 1, strings.Count(log, `"state":"ready"`), "the restarted shim's own run")
	return next
}

// tookOver checks that the sandbox's Lease and Pod are no longer those
// of before (lease, podUID): the restarted shim took the Lease over and
// removed its predecessor's Pod.
func (e *shimPodEnv) tookOver(name string, lease kubeLease, podUID string) {
	t := e.t
	t.Helper()
	taken, ok := leaseIn(e.c, e.ns, name)
	require.True(t, ok)
	assert.NotEqual(t, lease.Spec.HolderIdentity, taken.Spec.HolderIdentity, "the restarted shim took the Lease over")
	assert.True(t, strings.HasPrefix(taken.Spec.HolderIdentity, e.app+"/"), "%q", taken.Spec.HolderIdentity)
	now := podUIDIn(e.c, e.ns, name)
	assert.NotEmpty(t, now)
	assert.NotEqual(t, podUID, now, "the predecessor's sandbox Pod was removed and the sandbox runs in a new one")
}

// held returns the sandbox's Lease, held by a shim of the Deployment, and
// its Pod's UID.
func (e *shimPodEnv) held(name string) (kubeLease, string) {
	t := e.t
	t.Helper()
	lease, ok := leaseIn(e.c, e.ns, name)
	require.True(t, ok, "the shim in the Pod holds the sandbox's Lease")
	require.True(t, strings.HasPrefix(lease.Spec.HolderIdentity, e.app+"/"), "%q", lease.Spec.HolderIdentity)
	uid := podUIDIn(e.c, e.ns, name)
	require.NotEmpty(t, uid)
	return lease, uid
}

// stop deletes the Deployment (its Pod's shim gets SIGTERM, within its
// grace) and waits until the sandbox is stopped and its Lease released.
func (e *shimPodEnv) stop(name string) {
	e.t.Helper()
	e.call(http.MethodDelete, "/apis/apps/v1/namespaces/"+e.ns+"/deployments/"+e.app, nil)
	assert.Eventually(e.t, func() bool {
		_, held := leaseIn(e.c, e.ns, name)
		return podUIDIn(e.c, e.ns, name) == "" && !held && len(shimPods(e.c, e.ns, e.app)) == 0
	}, 2*time.Minute, 500*time.Millisecond, "the stopped shim's sandbox Pod and Lease are gone")
}

// TestKubernetesTheShimAsAPodFindsItsSandboxAfterARestart runs
// oac-shim-kubernetes as a Deployment's Pod of the test cluster with its
// in-cluster configuration. The shim Pod is deleted with no grace; the
// Deployment's next Pod, another shim process with an empty file system,
// finds the sandbox as its holder's: it takes the Lease over, removes the
// Pod its predecessor left and runs the sandbox afresh (a throwaway
// sandbox is not resumed: docs/kubernetes.md#the-shim-as-a-pod).
// Deleting the Deployment stops the sandbox and leaves nothing.
func TestKubernetesTheShimAsAPodFindsItsSandboxAfterARestart(t *testing.T) {
	e := newShimPodEnv(t)
	name := uniqueName("inpod")
	e.deploy(serveBootstrap(name), map[string]any{"name": "keep", "emptyDir": map[string]any{}}, append([]string{"run", "--provider=kubernetes", "--name=" + name}, e.providerArgs()...)...)

	first := e.ready("")
	lease, pod := e.held(name)
	e.restart(first)
	e.tookOver(name, lease, pod)

	e.stop(name)
	assert.Empty(t, kubeLeftovers(e.c, name), "the stopped shim left nothing")
}

// TestKubernetesTheShimAsAPodKeepsItsKeptSandboxAcrossARestart: a kept
// sandbox, created with the Deployment's holder into a keep root that
// outlives the shim's Pod (a host directory here, a claim in
// examples/kubernetes/shim-deployment.yaml), is started by the shim in
// the Pod (its first start makes its claim). Killed and restarted, the next shim finds its record, takes
// the Lease over and starts it again on the same claim; stopped, the
// sandbox's claim is kept, and destroy removes everything.
func TestKubernetesTheShimAsAPodKeepsItsKeptSandboxAcrossARestart(t *testing.T) {
	e := newShimPodEnv(t)
	name := uniqueName("inpod-kept")
	root := keepRootFor(t)
	create := append([]string{"create", "--provider", "kubernetes", "--name", name, "--keep-root", root, "--k8s-namespace=" + e.ns}, e.providerArgs()...)
	cmd := exec.Command(bins.shim, create...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+e.c.Kubeconfig)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)

	e.deploy(serveBootstrap(name), map[string]any{"name": "keep", "hostPath": map[string]any{"path": root, "type": "Directory"}}, "start", "--name="+name)
	first := e.ready("")
	// The first start made the claim.
	var claim struct{ Metadata struct{ UID string } }
	require.NoError(t, e.c.Get(context.Background(), "/api/v1/namespaces/"+e.ns+"/persistentvolumeclaims/oac-"+name+"-kept", &claim))
	lease, pod := e.held(name)
	e.restart(first)
	e.tookOver(name, lease, pod)
	var again struct{ Metadata struct{ UID string } }
	require.NoError(t, e.c.Get(context.Background(), "/api/v1/namespaces/"+e.ns+"/persistentvolumeclaims/oac-"+name+"-kept", &again))
	assert.Equal(t, claim.Metadata.UID, again.Metadata.UID, "the kept sandbox's claim is the one it was created with")

	e.stop(name)
	require.NoError(t, e.c.Get(context.Background(), "/api/v1/namespaces/"+e.ns+"/persistentvolumeclaims/oac-"+name+"-kept", &again), "stopped, the kept sandbox keeps its claim")
	assert.Equal(t, claim.Metadata.UID, again.Metadata.UID)
	cmd = exec.Command(bins.shim, "destroy", "--name", name, "--keep-root", root)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+e.c.Kubeconfig)
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Empty(t, kubeLeftovers(e.c, name))
}
