//go:build linux

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/internal/kcluster"
)

// The warm pool the kubernetes-via-agent-sandbox row claims from.
const (
	warmTemplate = "oac"
	warmPoolName = "oac-warm"
	warmReplicas = 2
	claimsPath   = "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/default/sandboxclaims"
	poolsPath    = "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/default/sandboxwarmpools"
	asSandboxes  = "/apis/agents.x-k8s.io/v1beta1/namespaces/default/sandboxes"
)

var warmPool struct {
	once sync.Once
	err  error
}

// needWarmPool runs agent-sandbox's controller on the test cluster and
// applies what oac-shim warm-pool writes for the row's flags, as an
// operator would, then waits until the pool has its Pods ready.
func needWarmPool(t *testing.T, c *kcluster.Cluster, shim, image string) string {
	t.Helper()
	warmPool.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		t0 := time.Now()
		if warmPool.err = c.StartAgentSandbox(ctx, kcluster.AgentSandboxOptions{BinDir: os.Getenv("KCLUSTER_AGENT_SANDBOX_DIR")}); warmPool.err != nil {
			return
		}
		out, err := exec.Command(shim, "warm-pool", "--k8s-image", image, "--k8s-pull-policy", "Never",
			"--template", warmTemplate, "--pool", warmPoolName, "--replicas", fmt.Sprint(warmReplicas)).Output()
		if err != nil {
			warmPool.err = fmt.Errorf("oac-shim warm-pool: %w", err)
			return
		}
		docs := bytes.Split(out, []byte("\n---\n"))
		for i, path := range []string{"/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/default/sandboxtemplates", poolsPath} {
			var obj map[string]any
			if warmPool.err = yaml.Unmarshal(docs[i], &obj); warmPool.err != nil {
				return
			}
			if warmPool.err = c.Do(ctx, http.MethodPost, path, obj, nil); warmPool.err != nil {
				return
			}
		}
		warmPool.err = waitPoolReady(ctx, c, warmReplicas)
		fmt.Fprintf(os.Stderr, "e2e: agent-sandbox and a warm pool of %d ready in %s\n", warmReplicas, time.Since(t0).Round(time.Millisecond))
	})
	require.NoError(t, warmPool.err, "agent-sandbox's warm pool on the test cluster")
	return warmPoolName
}

// waitPoolReady waits until the pool has n Pods ready.
func waitPoolReady(ctx context.Context, c *kcluster.Cluster, n int32) error {
	for {
		var pool struct{ Status struct{ ReadyReplicas int32 } }
		err := c.Get(ctx, poolsPath+"/"+warmPoolName, &pool)
		if err == nil && pool.Status.ReadyReplicas >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the warm pool has %d of %d Pods ready (%v): %w", pool.Status.ReadyReplicas, n, err, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// claimLeftovers lists what of a sandbox a claim leaves: the claim, and a
// Sandbox (with its Pod) the claim controlled.
func claimLeftovers(c *kcluster.Cluster, name string) []string {
	return claimLeftoversIn(c, "default", name)
}

// claimLeftoversIn is claimLeftovers in namespace ns.
func claimLeftoversIn(c *kcluster.Cluster, ns, name string) []string {
	var left []string
	ctx := context.Background()
	var claims struct {
		Items []struct{ Metadata struct{ Name string } }
	}
	if err := c.Get(ctx, "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/"+ns+"/sandboxclaims?labelSelector=app.kubernetes.io%2Fmanaged-by%3Doac-shim%2Coac.dev%2Fsandbox%3D"+name, &claims); err != nil {
		return []string{fmt.Sprintf("cannot list sandboxclaims: %v", err)}
	}
	for _, it := range claims.Items {
		left = append(left, "sandboxclaim "+ns+"/"+it.Metadata.Name)
	}
	var sandboxes struct {
		Items []struct {
			Metadata struct {
				Name            string
				OwnerReferences []struct{ Kind, Name string }
			}
		}
	}
	if err := c.Get(ctx, "/apis/agents.x-k8s.io/v1beta1/namespaces/"+ns+"/sandboxes", &sandboxes); err != nil {
		return append(left, fmt.Sprintf("cannot list sandboxes: %v", err))
	}
	for _, sb := range sandboxes.Items {
		for _, o := range sb.Metadata.OwnerReferences {
			if o.Kind == "SandboxClaim" && o.Name == "oac-"+name {
				left = append(left, "sandbox "+ns+"/"+sb.Metadata.Name+" of claim "+o.Name)
			}
		}
	}
	return left
}

// rowKubernetesAgentSandbox is the kubernetes provider as a fleet with
// agent-sandbox runs it: every throwaway sandbox a SandboxClaim on a warm
// pool of the provider's own template, bound to a warm Pod. Kept
// sandboxes stay bare Pods (a warm Pod cannot mount a sandbox's own
// volume claim), so the kept columns prove that they still are.
func rowKubernetesAgentSandbox(t *testing.T, f *confFixtures) confEnv {
	c := needKubernetes(t)
	image := kubeImage(t, c)
	pool := needWarmPool(t, c, f.private.shim, image)
	return confEnv{
		spec: sandboxSpec{provider: "kubernetes", shim: f.private.shim, agent: f.private.guest,
			args: f.args("--kubeconfig", c.Kubeconfig, "--k8s-image", image, "--k8s-pull-policy", "Never",
				"--k8s-api", "agent-sandbox", "--k8s-warm-pool", pool, "--k8s-lease-duration", "3s")},
		bootTimeout: 2 * time.Minute,
		stateDir:    runDir,
		carrier:     carrierSession,
		cluster:     true,
		leftovers: func(name string) []string {
			return append(kubeLeftovers(c, name), claimLeftovers(c, name)...)
		},
	}
}

// podObject is what these tests read of a Pod or a Sandbox.
type podObject struct {
	Metadata struct {
		Name, UID         string
		CreationTimestamp time.Time
		Labels            map[string]string
		OwnerReferences   []struct {
			Kind, Name, UID string
			Controller      bool
		}
	}
	Status struct {
		Conditions []struct{ Type, Status string }
	}
}

// warmPods are the pool's Sandboxes' Pods that are Ready, by UID.
func warmPods(t *testing.T, c *kcluster.Cluster) map[string]string {
	t.Helper()
	ctx := context.Background()
	var sandboxes struct{ Items []podObject }
	require.NoError(t, c.Get(ctx, asSandboxes, &sandboxes))
	pool := map[string]bool{}
	for _, sb := range sandboxes.Items {
		for _, o := range sb.Metadata.OwnerReferences {
			if o.Controller && o.Kind == "SandboxWarmPool" && o.Name == warmPoolName {
				pool[sb.Metadata.Name] = true
			}
		}
	}
	var pods struct{ Items []podObject }
	require.NoError(t, c.Get(ctx, "/api/v1/namespaces/default/pods", &pods))
	out := map[string]string{}
	for _, p := range pods.Items {
		for _, o := range p.Metadata.OwnerReferences {
			if o.Controller && o.Kind == "Sandbox" && pool[o.Name] {
				for _, cond := range p.Status.Conditions {
					if cond.Type == "Ready" && cond.Status == "True" {
						out[p.Metadata.UID] = p.Metadata.Name
					}
				}
			}
		}
	}
	return out
}

// TestKubernetesAClaimRunsInAPodThePoolHadWarm: with the pool full, a
// sandbox run with --k8s-api agent-sandbox reaches ready in one of the
// Pods that were warm before it ran (no Pod made for it), says that the
// Pod's name stays its hostname, and leaves nothing once stopped while
// the pool makes another warm Pod.
func TestKubernetesAClaimRunsInAPodThePoolHadWarm(t *testing.T) {
	c := needKubernetes(t)
	image := kubeImage(t, c)
	pool := needWarmPool(t, c, bins.shim, image)
	ctx := context.Background()
	require.NoError(t, waitPoolReady(ctx, c, warmReplicas))
	warm := warmPods(t, c)
	require.Len(t, warm, warmReplicas)

	s := startShim(t, sandboxSpec{provider: "kubernetes",
		name: uniqueName("claimed"), bootstrap: strings.Replace(serveBootstrap("claimed"), `{"version":1,`, `{"version":1,"hostname":"tenant-host",`, 1),
		args: []string{"--kubeconfig", c.Kubeconfig, "--k8s-pull-policy", "Never", "--k8s-api", "agent-sandbox", "--k8s-warm-pool", pool}})
	s.waitState(api.StateReady, 2*time.Minute)

	var claim struct {
		Status struct{ Sandbox struct{ Name string } }
	}
	require.NoError(t, c.Get(ctx, claimsPath+"/oac-"+s.name, &claim))
	var sb podObject
	require.NoError(t, c.Get(ctx, asSandboxes+"/"+claim.Status.Sandbox.Name, &sb))
	var pod podObject
	require.NoError(t, c.Get(ctx, "/api/v1/namespaces/default/pods/"+claim.Status.Sandbox.Name, &pod))
	assert.Contains(t, warm, pod.Metadata.UID, "the sandbox runs in a Pod that was warm before it was asked for: %s", pod.Metadata.Name)
	assert.Equal(t, "warm", sb.Metadata.Labels["agents.x-k8s.io/launch-type"], "agent-sandbox says it adopted a warm sandbox")
	started := s.find(func(e api.Event) bool {
		return e.State == api.StateReady || e.State == api.StateStarting
	})
	notes := ""
	for _, e := range started {
		notes += e.Message + "\n"
	}
	assert.Contains(t, notes, "hostname tenant-host (this runtime's guest root cannot set it; the runtime's name "+pod.Metadata.Name+" holds)",
		"the Pod's name stays the hostname, and the events say so")

	require.NoError(t, waitPoolReady(ctx, c, warmReplicas), "the pool made another warm Pod")
	t0 := time.Now()
	s.signal(syscall.SIGTERM)
	assert.Equal(t, 0, s.exit(time.Minute))
	t.Logf("stopped, its claim, Sandbox and Pod gone, in %s", time.Since(t0).Round(time.Millisecond))
	assert.Empty(t, claimLeftovers(c, s.name))
	err := c.Get(ctx, "/api/v1/namespaces/default/pods/"+pod.Metadata.Name, &podObject{})
	assert.True(t, kcluster.IsNotFound(err), "the claimed Pod is gone with its claim: %v", err)
}

// TestKubernetesAPoolWhosePodsMayReachTheNetworkIsRefused: a template
// that is oac's but leaves agent-sandbox's default policy (public
// egress) in force is refused before any claim is made.
func TestKubernetesAPoolWhosePodsMayReachTheNetworkIsRefused(t *testing.T) {
	c := needKubernetes(t)
	image := kubeImage(t, c)
	needWarmPool(t, c, bins.shim, image)
	ctx := context.Background()
	out, err := exec.Command(bins.shim, "warm-pool", "--k8s-image", image, "--k8s-pull-policy", "Never",
		"--template", "open", "--pool", "open-pool", "--replicas", "0").Output()
	require.NoError(t, err)
	docs := bytes.Split(out, []byte("\n---\n"))
	var tmpl, pool map[string]any
	require.NoError(t, yaml.Unmarshal(docs[0], &tmpl))
	require.NoError(t, yaml.Unmarshal(docs[1], &pool))
	delete(tmpl["spec"].(map[string]any), "networkPolicy")
	require.NoError(t, c.Do(ctx, http.MethodPost, "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/default/sandboxtemplates", tmpl, nil))
	require.NoError(t, c.Do(ctx, http.MethodPost, poolsPath, pool, nil))
	t.Cleanup(func() {
		_ = c.Do(context.Background(), http.MethodDelete, poolsPath+"/open-pool", nil, nil)
		_ = c.Do(context.Background(), http.MethodDelete, "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/default/sandboxtemplates/open", nil, nil)
	})

	s := startShim(t, sandboxSpec{provider: "kubernetes",
		name: uniqueName("open"), bootstrap: serveBootstrap("open"),
		args: []string{"--kubeconfig", c.Kubeconfig, "--k8s-api", "agent-sandbox", "--k8s-warm-pool", "open-pool"}})
	failed := s.exitFailed("provider_unavailable", time.Minute)
	assert.Contains(t, failed.Message, "SandboxTemplate open lets its Pods reach the network")
	assert.Empty(t, claimLeftovers(c, s.name), "no claim made")
}

// TestKubernetesCheckSaysWhetherTheClusterOffersAgentSandbox: oac-shim
// check names the way sandboxes would be made, says that agent-sandbox is
// served, and refuses a pool the namespace does not have.
func TestKubernetesCheckSaysWhetherTheClusterOffersAgentSandbox(t *testing.T) {
	c := needKubernetes(t)
	image := kubeImage(t, c)
	pool := needWarmPool(t, c, bins.shim, image)
	check := func(args ...string) string {
		out, _ := exec.Command(bins.shim, append([]string{"check", "--kubeconfig", c.Kubeconfig, "--k8s-image", image}, args...)...).CombinedOutput()
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, "kubernetes: ") {
				return line
			}
		}
		t.Fatalf("no kubernetes line in oac-shim check's output:\n%s", out)
		return ""
	}
	assert.Contains(t, check(), "one bare Pod per sandbox (agent-sandbox served (--k8s-api agent-sandbox claims from its warm pools))")
	assert.Contains(t, check("--k8s-api", "agent-sandbox", "--k8s-warm-pool", pool), "sandboxes claimed from SandboxWarmPool "+pool)
	assert.Contains(t, check("--k8s-api", "agent-sandbox", "--k8s-warm-pool", "nope"), "unavailable: kubernetes: no SandboxWarmPool nope in namespace default")
}
