//go:build linux

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path"
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

// The Kubernetes cluster: a real single node (internal/kcluster: etcd, a
// private containerd, the API server, scheduler, controller manager and
// kubelet built from k8s.io/kubernetes, and a NetworkPolicy enforcer),
// started once per test binary by the first test that needs it and
// stopped by TestMain, leaving nothing.
var kube struct {
	once sync.Once
	c    *kcluster.Cluster
	err  error
	// The guest image, and the one whose agent keeps the Pod's
	// interfaces (kubernetes_netpol_test.go).
	image, keepImage kubeImageOnce
}

// kubeImageRef is the run's guest image in the cluster's containerd.
const kubeImageRef = "oac.local/e2e/guest:1"

// kubeStartTimeout bounds the cluster's start, a cold build of its
// binaries included.
const kubeStartTimeout = 25 * time.Minute

// needKubernetes returns the run's cluster, starting it on first use.
func needKubernetes(t *testing.T) *kcluster.Cluster {
	t.Helper()
	missing := kcluster.Missing()
	need(t, missing == "", missing)
	need(t, os.Geteuid() == 0, "the test cluster runs containerd and a kubelet: run the e2e tests as root (sudo make test)")
	kube.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), kubeStartTimeout)
		defer cancel()
		t0 := time.Now()
		kube.c, kube.err = kcluster.Start(ctx, kcluster.Options{})
		if kube.err == nil {
			fmt.Fprintf(os.Stderr, "e2e: Kubernetes cluster %s ready in %s (%v)\n", kcluster.Version, time.Since(t0).Round(time.Second), kube.c.Timings)
			kube.err = installSeccompProfile(kube.c)
		}
		if kube.err == nil {
			// Every kubernetes row runs with NetworkPolicy enforced, as a
			// fleet's cluster does (the agent's session goes over
			// pods/exec, which no policy touches).
			kube.err = kube.c.StartNetworkPolicy(ctx, kcluster.NetworkPolicyOptions{})
		}
	})
	require.NoError(t, kube.err, "the test cluster")
	return kube.c
}

// installSeccompProfile does what docs/kubernetes.md asks of an operator:
// the agent's profile in the kubelet's seccomp directory.
func installSeccompProfile(c *kcluster.Cluster) error {
	b, err := os.ReadFile("../examples/kubernetes/oac-seccomp.json")
	if err != nil {
		return err
	}
	return c.InstallSeccompProfile("oac-seccomp.json", b)
}

// kubeImage builds the run's guest image as an OCI image (the stand-ins
// in it: a node cannot see this host's files) and imports it into the
// cluster's containerd once; Pods run it with --k8s-pull-policy Never.
func kubeImage(t *testing.T, c *kcluster.Cluster) string {
	t.Helper()
	return kube.image.get(t, c, "the guest image", bins.guest, bins.daemon+":"+daemonBin+":0755", kubeImageRef)
}

// kubeImageOnce is an image built and imported into the cluster once.
type kubeImageOnce struct {
	once sync.Once
	ref  string
	err  error
}

// get builds an OCI image of agent with the stand-ins and file (oac-image
// build's --file SRC:DST:MODE), named ref, and imports it into the
// cluster's containerd the first time; Pods run it with
// --k8s-pull-policy Never.
func (k *kubeImageOnce) get(t *testing.T, c *kcluster.Cluster, what, agent, file, ref string) string {
	t.Helper()
	needImageBuild(t)
	testCA(t)
	k.once.Do(func() {
		dir := filepath.Join(bins.dir, "image-oci-"+strings.ReplaceAll(path.Base(ref), ":", "-"))
		out, err := exec.Command(bins.image, "build", "--agent", agent, "--sandbox-io", bins.sandboxIO,
			"--ca-bundle", runCA.bundle, "--file", file,
			"--output", "oci", "--ref", ref, "--epoch", "1", "-o", dir).CombinedOutput()
		if err != nil {
			k.err = fmt.Errorf("oac-image build: %w: %s", err, out)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		k.err = c.ImportLayout(ctx, filepath.Join(dir, "oci"))
		k.ref = ref
	})
	require.NoError(t, k.err, "import %s into the cluster", what)
	return k.ref
}

// kubeLeftovers lists the cluster's objects of sandbox name: Pods,
// NetworkPolicies and claims the provider labelled with it.
func kubeLeftovers(c *kcluster.Cluster, name string) []string {
	var left []string
	sel := "labelSelector=app.kubernetes.io%2Fmanaged-by%3Doac-shim%2Coac.dev%2Fsandbox%3D" + name
	for _, kind := range []string{"/api/v1/pods", "/apis/networking.k8s.io/v1/networkpolicies", "/api/v1/persistentvolumeclaims"} {
		var list struct {
			Items []struct {
				Metadata struct{ Namespace, Name string }
			}
		}
		if err := c.Get(context.Background(), kind+"?"+sel, &list); err != nil {
			left = append(left, fmt.Sprintf("cannot list %s: %v", kind, err))
			continue
		}
		for _, it := range list.Items {
			left = append(left, fmt.Sprintf("%s %s/%s", strings.TrimPrefix(kind[strings.LastIndex(kind, "/"):], "/"), it.Metadata.Namespace, it.Metadata.Name))
		}
	}
	return left
}

// stopKube stops the cluster if the run started one.
func stopKube() error {
	if kube.c == nil {
		return nil
	}
	return kube.c.Stop()
}

func rowKubernetes(t *testing.T, f *confFixtures) confEnv {
	c := needKubernetes(t)
	image := kubeImage(t, c)
	return confEnv{
		spec: sandboxSpec{provider: "kubernetes", shim: f.private.shim, agent: f.private.guest,
			// A killed shim's sandbox is taken over 3s after its last
			// renewal, not the default 15s.
			args: f.args("--kubeconfig", c.Kubeconfig, "--k8s-image", image, "--k8s-pull-policy", "Never", "--k8s-lease-duration", "3s")},
		bootTimeout: 2 * time.Minute,
		stateDir:    runDir,
		carrier:     carrierSession,
		cluster:     true,
		leftovers:   func(name string) []string { return kubeLeftovers(c, name) },
	}
}

// TestKubernetesWhatAKilledShimLeftIsFoundByItsLabels kills a shim with
// SIGKILL and, once its Lease went unrenewed, runs another sandbox: its
// create finds the dead sandbox's Pod and policy by their labels and
// removes them. A Pod of the name that
// another host's shim holds is refused and left alone.
func TestKubernetesWhatAKilledShimLeftIsFoundByItsLabels(t *testing.T) {
	c := needKubernetes(t)
	image := kubeImage(t, c)
	args := []string{"--kubeconfig", c.Kubeconfig, "--k8s-image", image, "--k8s-pull-policy", "Never", "--k8s-lease-duration", "1s"}

	dead := startShim(t, sandboxSpec{provider: "kubernetes", name: uniqueName("killed"), bootstrap: serveBootstrap("killed"), args: args})
	dead.waitState(api.StateReady, 2*time.Minute)
	dead.signal(syscall.SIGKILL)
	dead.exit(30 * time.Second)
	require.NotEmpty(t, kubeLeftovers(c, dead.name), "the killed shim left its Pod and policy")
	leaseIdle(t, c, dead.name)

	next := startShim(t, sandboxSpec{provider: "kubernetes", name: uniqueName("next"), bootstrap: serveBootstrap("next"), args: args})
	next.waitState(api.StateReady, 2*time.Minute)
	require.Eventually(t, func() bool { return len(kubeLeftovers(c, dead.name)) == 0 }, time.Minute, 200*time.Millisecond,
		"the next create removed what the killed shim left: %v", kubeLeftovers(c, dead.name))
	next.signal(syscall.SIGTERM)
	assert.Equal(t, 0, next.exit(time.Minute))
	assert.Empty(t, kubeLeftovers(c, next.name))

	name := uniqueName("elsewhere")
	ctx := context.Background()
	pod := map[string]any{
		"metadata": map[string]any{
			"name":        "oac-" + name,
			"labels":      map[string]any{"app.kubernetes.io/managed-by": "oac-shim", "oac.dev/sandbox": name, "oac.dev/kept": "false"},
			"annotations": map[string]any{"oac.dev/holder": "another-host"},
		},
		"spec": map[string]any{
			"automountServiceAccountToken": false, "terminationGracePeriodSeconds": 0,
			"containers": []any{map[string]any{"name": "pause", "image": kcluster.PauseImage, "imagePullPolicy": "Never"}},
		},
	}
	require.NoError(t, c.Do(ctx, http.MethodPost, "/api/v1/namespaces/default/pods", pod, nil))
	t.Cleanup(func() {
		_ = c.Do(context.Background(), http.MethodDelete, "/api/v1/namespaces/default/pods/oac-"+name, nil, nil)
	})
	s := startShim(t, sandboxSpec{provider: "kubernetes", name: name, bootstrap: serveBootstrap(name), args: args})
	failed := s.exitFailed("invalid_config", time.Minute)
	assert.Contains(t, failed.Message, "runs in namespace default from host another-host")
	require.NoError(t, c.Get(ctx, "/api/v1/namespaces/default/pods/oac-"+name, nil), "another host's Pod is left alone")
}

// TestKubernetesRequiredUserNamespacesAreRefusedWhereNoNodeHasThem: the
// test cluster's containerd 1.6 reports no user namespace support, so a
// run that requires them is refused before anything is made, and says
// which node lacks them.
func TestKubernetesRequiredUserNamespacesAreRefusedWhereNoNodeHasThem(t *testing.T) {
	c := needKubernetes(t)
	image := kubeImage(t, c)
	s := startShim(t, sandboxSpec{provider: "kubernetes", name: uniqueName("userns"), bootstrap: serveBootstrap("userns"),
		args: []string{"--kubeconfig", c.Kubeconfig, "--k8s-image", image, "--k8s-pull-policy", "Never", "--k8s-user-namespaces", "require"}})
	failed := s.exitFailed("provider_unavailable", time.Minute)
	assert.Contains(t, failed.Message, "user namespaces are required (--k8s-user-namespaces require) but node "+c.NodeName+"'s runtime does not support them")
	assert.Empty(t, kubeLeftovers(c, s.name))
}
