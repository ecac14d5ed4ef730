package kcluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// NetworkPolicyVersion is the version of kube-router
// (github.com/cloudnativelabs/kube-router/v2) tools/netpol builds.
const NetworkPolicyVersion = "v2.1.0"

// NetworkPolicyController is the NetworkPolicy enforcer's binary
// (kube-router, run with its firewall only), and the user (a client
// certificate's CN) it runs as in the cluster.
const NetworkPolicyController = "kube-router"

// NetworkPolicyNodePorts is the node-port range the enforcer is told of:
// it lets any Pod reach the node's addresses on these ports whatever the
// policies say (NodePort Services; the cluster has no proxy for them), so
// the range is one nothing here listens on, kept as narrow as it allows.
const NetworkPolicyNodePorts = "30000-30001"

// NetworkPolicyOptions says where the enforcer comes from. The zero
// value builds it into the user cache directory once.
type NetworkPolicyOptions struct {
	// BinDir holds a prebuilt kube-router; nothing is built.
	BinDir string
	// CacheDir is where it is built once and then reused (default: the
	// user cache directory's sandbox-agent/netpol/VERSION).
	CacheDir string
	// ToolsDir is tools/netpol (default: found from the working directory
	// upwards).
	ToolsDir string
	// Log, when set, receives progress lines.
	Log func(format string, a ...any)
}

// EnsureNetworkPolicy builds the enforcer into the cache directory o
// names unless it is there, and returns that directory: `make k8s-bins`
// runs it before the e2e tests, so a cold build is not paid inside their
// time limit.
func EnsureNetworkPolicy(ctx context.Context, o NetworkPolicyOptions) (string, error) {
	logf := o.Log
	if logf == nil {
		logf = func(string, ...any) {}
	}
	return cached(ctx, cachedBuild{
		binDir: o.BinDir, cacheDir: o.CacheDir, toolsDir: o.ToolsDir, logf: logf,
		what: NetworkPolicyController, cacheName: "netpol", version: NetworkPolicyVersion, tools: "netpol",
		cost: "about two minutes on a cold cache",
		have: func(dir string) bool {
			st, err := os.Stat(filepath.Join(dir, NetworkPolicyController))
			return err == nil && st.Mode()&0o111 != 0
		},
		build: BuildNetworkPolicy,
	})
}

// BuildNetworkPolicy builds kube-router from toolsDir (tools/netpol,
// whose go.mod pins it and raises its dependencies) into outDir
// statically; the binary is moved in last, so a directory holding it is
// complete.
func BuildNetworkPolicy(ctx context.Context, toolsDir, outDir string) error {
	tmp, err := os.MkdirTemp(outDir, ".build-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	// The version it logs, as kube-router's own build sets it.
	ldflags := "-s -w -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=" + NetworkPolicyVersion
	cmd := exec.CommandContext(ctx, goTool(), "build", "-trimpath", "-ldflags", ldflags, "-o", tmp+"/",
		"github.com/cloudnativelabs/kube-router/v2/cmd/"+NetworkPolicyController)
	cmd.Dir = toolsDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("kcluster: build tools/netpol: %w: %s", err, out)
	}
	return os.Rename(filepath.Join(tmp, NetworkPolicyController), filepath.Join(outDir, NetworkPolicyController))
}

// networkPolicyRules are what the enforcer reads: Pods, Namespaces and
// NetworkPolicies it enforces, its Node (for its address), and the
// Services and endpoints its informers list even with the proxy off.
var networkPolicyRules = []any{
	map[string]any{"apiGroups": []any{""}, "resources": []any{"namespaces", "pods", "services", "nodes", "endpoints"}, "verbs": []any{"get", "list", "watch"}},
	map[string]any{"apiGroups": []any{"networking.k8s.io"}, "resources": []any{"networkpolicies"}, "verbs": []any{"get", "list", "watch"}},
	map[string]any{"apiGroups": []any{"discovery.k8s.io"}, "resources": []any{"endpointslices"}, "verbs": []any{"get", "list", "watch"}},
}

// StartNetworkPolicy runs a NetworkPolicy enforcer on the cluster:
// kube-router with its firewall only (no routing, no service proxy), as
// a process of the cluster with a client certificate of its own user
// bound to a ClusterRole that reads what it enforces. It filters the
// node's INPUT, FORWARD and OUTPUT with iptables chains and ipsets, so a
// Pod a policy selects is confined on the bridge, towards the node's
// addresses and from the node alike. It returns once the enforcer
// reports healthy (its first full sync done). Stop ends it and removes
// its chains and ipsets.
func (c *Cluster) StartNetworkPolicy(ctx context.Context, o NetworkPolicyOptions) error {
	if c.proc(NetworkPolicyController) != nil {
		return errors.New("kcluster: the NetworkPolicy enforcer already runs on this cluster")
	}
	if _, err := exec.LookPath("ipset"); err != nil {
		return errors.New("kcluster: the NetworkPolicy enforcer needs ipset: apt-get install -y ipset (or run make test-deps)")
	}
	if o.Log == nil {
		o.Log = c.logf
	}
	t0 := time.Now()
	dir, err := EnsureNetworkPolicy(ctx, o)
	if err != nil {
		return err
	}
	c.Timings["netpol binary"] = time.Since(t0)
	t := time.Now()
	c.ipsetsPre = append([]string{}, ipsets()...)
	role := "oac:" + NetworkPolicyController
	if err := c.Do(ctx, http.MethodPost, "/apis/rbac.authorization.k8s.io/v1/clusterroles", map[string]any{
		"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
		"metadata": map[string]any{"name": role},
		"rules":    networkPolicyRules,
	}, nil); err != nil && !isConflict(err) {
		return fmt.Errorf("kcluster: the enforcer's ClusterRole: %w", err)
	}
	if err := c.Do(ctx, http.MethodPost, "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", map[string]any{
		"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
		"metadata": map[string]any{"name": role},
		"subjects": []any{map[string]any{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": NetworkPolicyController}},
		"roleRef":  map[string]any{"kind": "ClusterRole", "apiGroup": "rbac.authorization.k8s.io", "name": role},
	}, nil); err != nil && !isConflict(err) {
		return fmt.Errorf("kcluster: the enforcer's ClusterRoleBinding: %w", err)
	}
	kc, err := c.componentKubeconfig(NetworkPolicyController, NetworkPolicyController)
	if err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	if err := c.spawn(NetworkPolicyController, filepath.Join(dir, NetworkPolicyController),
		"--kubeconfig", kc,
		"--hostname-override", c.NodeName,
		"--run-firewall=true", "--run-router=false", "--run-service-proxy=false",
		"--enable-ipv4=true", "--enable-ipv6=false",
		"--service-cluster-ip-range", ServiceSubnet,
		"--service-node-port-range", NetworkPolicyNodePorts,
		"--health-port", strconv.Itoa(port),
		"--metrics-port", "0",
	); err != nil {
		return err
	}
	url := "http://127.0.0.1:" + strconv.Itoa(port) + "/healthz"
	hc := &http.Client{Timeout: 5 * time.Second}
	defer hc.CloseIdleConnections()
	if err := c.waitFor(ctx, NetworkPolicyController, time.Minute, func() error {
		resp, err := hc.Get(url)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("healthz status %d", resp.StatusCode)
		}
		// Healthy once every controller has beaten; its chains are
		// there once the first full sync has run.
		if !slices.Contains(iptablesChains("filter"), "KUBE-ROUTER-FORWARD") {
			return errors.New("no KUBE-ROUTER-FORWARD chain yet")
		}
		return nil
	}); err != nil {
		return err
	}
	c.Timings["netpol"] = time.Since(t)
	return nil
}

// iptablesChains lists the chains of table.
func iptablesChains(table string) []string {
	out, err := exec.Command("iptables", "-w", "-t", table, "-S").Output()
	if err != nil {
		return nil
	}
	var chains []string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && (f[0] == "-N" || f[0] == "-P") {
			chains = append(chains, f[1])
		}
	}
	return chains
}

// ipsetPrefixes begin the names of the ipsets the enforcer makes (its
// policies' sources and destinations, and the temporary sets it swaps
// them with).
var ipsetPrefixes = []string{"KUBE-SRC-", "KUBE-DST-", "TMP-"}

// ipsets lists the host's ipsets (none when ipset is not installed).
func ipsets() []string {
	if _, err := exec.LookPath("ipset"); err != nil {
		return nil
	}
	out, err := exec.Command("ipset", "list", "-n").Output()
	if err != nil {
		return nil
	}
	return strings.Fields(string(out))
}

// enforcerIPSets are the ipsets of the enforcer's names that were not
// there when it started.
func (c *Cluster) enforcerIPSets() []string {
	if c.ipsetsPre == nil {
		return nil
	}
	var out []string
	for _, s := range ipsets() {
		if slices.Contains(c.ipsetsPre, s) {
			continue
		}
		for _, p := range ipsetPrefixes {
			if strings.HasPrefix(s, p) {
				out = append(out, s)
				break
			}
		}
	}
	return out
}

// removeIPSets destroys the enforcer's ipsets; Stop calls it once the
// iptables rules that match on them are gone.
func (c *Cluster) removeIPSets() error {
	var errs []error
	for _, s := range c.enforcerIPSets() {
		if out, err := exec.Command("ipset", "destroy", s).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("remove ipset %s: %v: %s", s, err, out))
		}
	}
	return errors.Join(errs...)
}

// PodPolicies lists the NetworkPolicies (by name) the enforcer runs the
// Pod's traffic through, as its iptables rules say: empty until it has
// seen the Pod's address and a policy that selects it (a Pod no policy
// selects goes through its default chain, which allows everything). A
// test waits for a policy here before it probes.
func PodPolicies(namespace, pod string) []string {
	out, err := exec.Command("iptables", "-w", "-t", "filter", "-S").Output()
	if err != nil {
		return nil
	}
	lines := strings.Split(string(out), "\n")
	// The Pod's own chain, named in the comments of the jumps to it.
	who := "POD name:" + pod + " namespace: " + namespace + " to chain "
	chain := ""
	for _, line := range lines {
		if _, after, ok := strings.Cut(line, who); ok {
			chain, _, _ = strings.Cut(after, "\"")
			break
		}
	}
	if chain == "" {
		return nil
	}
	var names []string
	for _, line := range lines {
		if !strings.HasPrefix(line, "-A "+chain+" ") {
			continue
		}
		if _, after, ok := strings.Cut(line, "run through nw policy "); ok {
			name, _, _ := strings.Cut(after, "\"")
			if !slices.Contains(names, name) {
				names = append(names, name)
			}
		}
	}
	return names
}
