//go:build linux

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/internal/kcluster"
)

// roleRule is one rule of a Role.
type roleRule struct {
	APIGroups []string `json:"apiGroups"`
	Resources []string `json:"resources"`
	Verbs     []string `json:"verbs"`
}

// publishedRole reads the Role of examples/kubernetes/role.yaml.
func publishedRole(t *testing.T) []roleRule {
	t.Helper()
	b, err := os.ReadFile("../examples/kubernetes/role.yaml")
	require.NoError(t, err)
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var obj struct {
			Kind  string     `json:"kind"`
			Rules []roleRule `json:"rules"`
		}
		require.NoError(t, yaml.Unmarshal([]byte(doc), &obj))
		if obj.Kind == "Role" {
			return obj.Rules
		}
	}
	t.Fatal("examples/kubernetes/role.yaml holds no Role")
	return nil
}

// rbacNamespace is a namespace of the test's own where a user is bound to
// the rules grant gives (replaced on each call).
type rbacNamespace struct {
	c          *kcluster.Cluster
	ns, user   string
	kubeconfig string
	image      string
}

func newRBACNamespace(t *testing.T) *rbacNamespace {
	c := needKubernetes(t)
	r := &rbacNamespace{c: c, ns: uniqueName("rbac"), user: uniqueName("oac-shim"), image: kubeImage(t, c)}
	ctx := context.Background()
	require.NoError(t, c.Do(ctx, http.MethodPost, "/api/v1/namespaces", map[string]any{"metadata": map[string]any{"name": r.ns}}, nil))
	t.Cleanup(func() { _ = c.Do(context.Background(), http.MethodDelete, "/api/v1/namespaces/"+r.ns, nil, nil) })
	var err error
	r.kubeconfig, err = c.UserKubeconfig(r.user)
	require.NoError(t, err)
	binding := map[string]any{
		"metadata": map[string]any{"name": "oac-shim"},
		"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "oac-shim"},
		"subjects": []any{map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": r.user}},
	}
	require.NoError(t, c.Do(ctx, http.MethodPost, "/apis/rbac.authorization.k8s.io/v1/namespaces/"+r.ns+"/rolebindings", binding, nil))
	// The ServiceAccount admission plugin refuses Pods until the
	// namespace's default account exists.
	require.Eventually(t, func() bool {
		return c.Get(ctx, "/api/v1/namespaces/"+r.ns+"/serviceaccounts/default", nil) == nil
	}, time.Minute, 200*time.Millisecond, "the namespace's default service account")
	return r
}

// grant makes the Role hold rules (none: no Role).
func (r *rbacNamespace) grant(t *testing.T, rules []roleRule) {
	t.Helper()
	ctx := context.Background()
	path := "/apis/rbac.authorization.k8s.io/v1/namespaces/" + r.ns + "/roles"
	_ = r.c.Do(ctx, http.MethodDelete, path+"/oac-shim", nil, nil)
	if len(rules) > 0 {
		require.NoError(t, r.c.Do(ctx, http.MethodPost, path, map[string]any{"metadata": map[string]any{"name": "oac-shim"}, "rules": rules}, nil))
	}
	// The authorizer's cache: wait until the user sees exactly this.
	time.Sleep(time.Second)
}

func (r *rbacNamespace) args() []string {
	return []string{"--kubeconfig", r.kubeconfig, "--k8s-namespace", r.ns, "--k8s-image", r.image, "--k8s-pull-policy", "Never"}
}

func (r *rbacNamespace) run(t *testing.T) *shim {
	return startShim(t, sandboxSpec{provider: "kubernetes", name: uniqueName("rbac"), bootstrap: serveBootstrap("rbac"), args: r.args()})
}

// serveBootstrap runs the daemon stand-in with a health check.
func serveBootstrap(marker string) string {
	argv, _ := json.Marshal([]string{daemonBin, "serve", "--hostname", "127.0.0.1", "--port", "4096", "--marker", marker})
	return `{"version":1,"daemon":{"argv":` + string(argv) + `},` +
		`"credentials":{"username_env":"OAC_SERVER_USERNAME","password_env":"OAC_SERVER_PASSWORD"},"health":{"port":4096}}`
}

// without returns rules without the one whose first resource is
// resource.
func without(rules []roleRule, resource string) []roleRule {
	var out []roleRule
	for _, r := range rules {
		if r.Resources[0] != resource {
			out = append(out, r)
		}
	}
	return out
}

// TestKubernetesTheRoleIsExactlyEnough runs the provider as a user bound
// to nothing but examples/kubernetes/role.yaml: a throwaway and a kept
// sandbox work with it, and each of its rules is needed (without it
// something the provider promises breaks, and says what to grant).
func TestKubernetesTheRoleIsExactlyEnough(t *testing.T) {
	r := newRBACNamespace(t)
	rules := publishedRole(t)
	require.Len(t, rules, 9, "pods, pods/exec, pods/log, networkpolicies, leases, persistentvolumeclaims, sandboxclaims, sandboxwarmpools and sandboxtemplates, sandboxes")

	t.Run("with no Role the shim says what to grant", func(t *testing.T) {
		r.grant(t, nil)
		s := r.run(t)
		failed := s.exitFailed("provider_unavailable", time.Minute)
		assert.Contains(t, failed.Message, "grant the Role in docs/kubernetes.md")
	})

	r.grant(t, rules)
	t.Run("with the Role a sandbox runs, its agent's log reaches the shim, and it stops leaving nothing", func(t *testing.T) {
		s := r.run(t)
		s.waitState(api.StateReady, 2*time.Minute)
		var np struct {
			Metadata struct {
				OwnerReferences []struct{ Kind, Name string }
			}
		}
		require.NoError(t, r.c.Get(context.Background(), "/apis/networking.k8s.io/v1/namespaces/"+r.ns+"/networkpolicies/oac-"+s.name, &np))
		require.Len(t, np.Metadata.OwnerReferences, 1, "the Pod owns its NetworkPolicy")
		assert.Equal(t, "Pod", np.Metadata.OwnerReferences[0].Kind)
		require.Eventually(t, func() bool { return strings.Contains(s.stderr.String(), "msg=connected") }, 30*time.Second, 100*time.Millisecond,
			"the agent's log (pods/log) in the shim's stderr")
		s.signal(syscall.SIGTERM)
		s.waitState(api.StateStopped, time.Minute)
		assert.Equal(t, 0, s.exit(time.Minute))
		assert.Empty(t, kubeLeftovers(r.c, s.name))
	})

	t.Run("with the Role a kept sandbox is created, started and destroyed", func(t *testing.T) {
		root := keepRootFor(t)
		name := uniqueName("rbac-kept")
		out, err := exec.Command(bins.shim, append([]string{"create", "--provider", "kubernetes", "--name", name, "--keep-root", root}, r.args()...)...).CombinedOutput()
		require.NoError(t, err, "%s", out)
		s := startShim(t, sandboxSpec{name: name, command: "start", bootstrap: serveBootstrap(name), args: []string{"--keep-root", root}})
		s.waitState(api.StateReady, 2*time.Minute)
		s.signal(syscall.SIGTERM)
		assert.Equal(t, 0, s.exit(time.Minute))
		out, err = exec.Command(bins.shim, "destroy", "--name", name, "--keep-root", root).CombinedOutput()
		require.NoError(t, err, "%s", out)
		assert.Empty(t, kubeLeftovers(r.c, name))
	})

	for res, lacks := range map[string]string{"pods": "create pods, get pods", "pods/exec": "create pods/exec, get pods/exec", "networkpolicies": "create networkpolicies.networking.k8s.io",
		"leases": "create leases.coordination.k8s.io, get leases.coordination.k8s.io, update leases.coordination.k8s.io, delete leases.coordination.k8s.io"} {
		t.Run("without the rule for "+res+" no sandbox runs and the shim says what to grant", func(t *testing.T) {
			r.grant(t, without(rules, res))
			s := r.run(t)
			failed := s.exitFailed("provider_unavailable", 2*time.Minute)
			assert.Contains(t, failed.Message, "may not "+lacks)
			assert.Contains(t, failed.Message, "grant the Role in docs/kubernetes.md")
			assert.Empty(t, s.find(func(e api.Event) bool { return e.Event == api.KindState && e.State == api.StateReady }))
			assert.Empty(t, kubeLeftovers(r.c, s.name), "a refused start leaves nothing")
		})
	}
	t.Run("without the rule for pods/log the agent's log does not reach the shim", func(t *testing.T) {
		r.grant(t, without(rules, "pods/log"))
		s := r.run(t)
		s.waitState(api.StateReady, 2*time.Minute)
		require.Eventually(t, func() bool { return strings.Contains(s.stderr.String(), "grant get on pods/log") }, 30*time.Second, 100*time.Millisecond,
			"the shim says why it shows no agent log")
		assert.NotContains(t, s.stderr.String(), "msg=connected")
		s.signal(syscall.SIGTERM)
		assert.Equal(t, 0, s.exit(time.Minute))
	})
	t.Run("without the rule for persistentvolumeclaims no kept sandbox is made", func(t *testing.T) {
		r.grant(t, without(rules, "persistentvolumeclaims"))
		name := uniqueName("rbac-kept")
		out, err := exec.Command(bins.shim, append([]string{"create", "--provider", "kubernetes", "--name", name, "--keep-root", keepRootFor(t)}, r.args()...)...).CombinedOutput()
		require.Error(t, err)
		assert.Contains(t, string(out), "may not create persistentvolumeclaims, get persistentvolumeclaims, delete persistentvolumeclaims")
		assert.Empty(t, kubeLeftovers(r.c, name))
	})
}

// TestKubernetesTheRoleIsExactlyEnoughForClaims runs throwaway sandboxes
// with --k8s-api agent-sandbox as a user bound to nothing but the
// published Role less what only bare Pods need (create pods, the
// NetworkPolicy rule): a claim on a warm pool of the namespace reaches
// ready, and each agent-sandbox rule is needed.
func TestKubernetesTheRoleIsExactlyEnoughForClaims(t *testing.T) {
	r := newRBACNamespace(t)
	needWarmPool(t, r.c, bins.shim, r.image) // agent-sandbox's controller
	ctx := context.Background()
	out, err := exec.Command(bins.shim, "warm-pool", "--k8s-image", r.image, "--k8s-pull-policy", "Never", "--replicas", "1").Output()
	require.NoError(t, err)
	docs := strings.Split(string(out), "\n---\n")
	for i, kind := range []string{"sandboxtemplates", "sandboxwarmpools"} {
		var obj map[string]any
		require.NoError(t, yaml.Unmarshal([]byte(docs[i]), &obj))
		require.NoError(t, r.c.Do(ctx, http.MethodPost, "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/"+r.ns+"/"+kind, obj, nil))
	}
	var rules []roleRule
	for _, rule := range publishedRole(t) {
		switch rule.Resources[0] {
		case "networkpolicies", "persistentvolumeclaims":
			continue
		case "pods":
			rule.Verbs = slices.DeleteFunc(slices.Clone(rule.Verbs), func(v string) bool { return v == "create" })
		}
		rules = append(rules, rule)
	}
	args := append(r.args(), "--k8s-api", "agent-sandbox", "--k8s-warm-pool", "oac-warm")
	run := func() *shim {
		return startShim(t, sandboxSpec{provider: "kubernetes", name: uniqueName("rbac-claim"), bootstrap: serveBootstrap("rbac"), args: args})
	}

	r.grant(t, rules)
	t.Run("with the claims' rules a claimed sandbox runs and stops leaving nothing", func(t *testing.T) {
		s := run()
		s.waitState(api.StateReady, 2*time.Minute)
		s.signal(syscall.SIGTERM)
		assert.Equal(t, 0, s.exit(time.Minute))
		assert.Empty(t, claimLeftoversIn(r.c, r.ns, s.name))
	})
	for res, lacks := range map[string]string{
		"sandboxclaims":    "create sandboxclaims.extensions.agents.x-k8s.io",
		"sandboxwarmpools": "get sandboxwarmpools.extensions.agents.x-k8s.io, get sandboxtemplates.extensions.agents.x-k8s.io",
		"sandboxes":        "get sandboxes.agents.x-k8s.io, delete sandboxes.agents.x-k8s.io",
	} {
		t.Run("without the rule for "+res+" no claim is made and the shim says what to grant", func(t *testing.T) {
			r.grant(t, without(rules, res))
			s := run()
			failed := s.exitFailed("provider_unavailable", 2*time.Minute)
			assert.Contains(t, failed.Message, "may not "+lacks)
			assert.Empty(t, claimLeftoversIn(r.c, r.ns, s.name), "a refused start leaves nothing")
		})
	}
}

// keepRootFor is a keep root of the test's own.
func keepRootFor(t *testing.T) string {
	root, err := os.MkdirTemp("", "oac-e2e-keep-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(root) })
	require.NoError(t, os.Chmod(root, 0o711))
	return root
}

// eventsText is every event the shim printed, as text.
func eventsText(s *shim) string {
	var b strings.Builder
	for _, e := range s.find(func(api.Event) bool { return true }) {
		fmt.Fprintf(&b, "%s %s %s\n", e.Event, e.Message, e.Line)
	}
	return b.String()
}
