//go:build linux

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

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
	var left []string
	ctx := context.Background()
	var claims struct {
		Items []struct{ Metadata struct{ Name string } }
	}
	if err := c.Get(ctx, claimsPath+"?labelSelector=app.kubernetes.io%2Fmanaged-by%3Doac-shim%2Coac.dev%2Fsandbox%3D"+name, &claims); err != nil {
		return []string{fmt.Sprintf("cannot list sandboxclaims: %v", err)}
	}
	for _, it := range claims.Items {
		left = append(left, "sandboxclaim default/"+it.Metadata.Name)
	}
	var sandboxes struct {
		Items []struct {
			Metadata struct {
				Name            string
				OwnerReferences []struct{ Kind, Name string }
			}
		}
	}
	if err := c.Get(ctx, asSandboxes, &sandboxes); err != nil {
		return append(left, fmt.Sprintf("cannot list sandboxes: %v", err))
	}
	for _, sb := range sandboxes.Items {
		for _, o := range sb.Metadata.OwnerReferences {
			if o.Kind == "SandboxClaim" && o.Name == "oac-"+name {
				left = append(left, "sandbox default/"+sb.Metadata.Name+" of claim "+o.Name)
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
				"--k8s-api", "agent-sandbox", "--k8s-warm-pool", pool)},
		bootTimeout: 2 * time.Minute,
		stateDir:    runDir,
		carrier:     carrierSession,
		cluster:     true,
		leftovers: func(name string) []string {
			return append(kubeLeftovers(c, name), claimLeftovers(c, name)...)
		},
	}
}
