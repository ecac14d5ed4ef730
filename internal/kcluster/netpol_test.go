//go:build k8s && linux

package kcluster

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// testNetworkPolicy starts the enforcer and proves a deny-all policy
// (ingress and egress, no rules) confines the Pod it selects: from inside
// it, no connection reaches another Pod, a listener of the node on all
// its addresses, the kubelet, or the apiserver's port, on any address it
// has a route to (the Pod subnet, the node's end of it among them) or
// not; and no Pod reaches it. A Pod without a policy reaches the same
// listeners in the same test, so it cannot pass by a broken network; and
// once the policy is deleted the same Pod reaches them again, so it is
// the policy that confined it. (The cluster's Pods have no default route:
// the node's InternalIP is unreachable from any Pod, and is probed from
// the confined one only.)
func testNetworkPolicy(ctx context.Context, t *testing.T, c *Cluster) {
	t0 := time.Now()
	if err := c.StartNetworkPolicy(ctx, NetworkPolicyOptions{BinDir: os.Getenv("KCLUSTER_NETPOL_DIR"), Log: t.Logf}); err != nil {
		t.Fatal(err)
	}
	t.Logf("enforcer started: %s (binary %s, start %s)", time.Since(t0).Round(time.Millisecond),
		c.Timings["netpol binary"].Round(time.Millisecond), c.Timings["netpol"].Round(time.Millisecond))

	// A listener of the host on all its addresses.
	l, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			conn.Close()
		}
	}()
	hostPort := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	var node struct {
		Status struct {
			DaemonEndpoints struct{ KubeletEndpoint struct{ Port int } }
		}
	}
	if err := c.Get(ctx, "/api/v1/nodes/"+c.NodeName, &node); err != nil {
		t.Fatal(err)
	}
	kubelet := net.JoinHostPort(c.NodeIP, strconv.Itoa(node.Status.DaemonEndpoints.KubeletEndpoint.Port))
	gateway := PodGateway
	_, apiPort, _ := net.SplitHostPort(strings.TrimPrefix(c.URL, "https://"))
	// Reached from a Pod without a policy.
	hostTargets := []string{net.JoinHostPort(gateway, hostPort)}

	policy := map[string]any{
		"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
		"metadata": map[string]any{"name": "deny-all", "namespace": "default"},
		"spec": map[string]any{
			"podSelector": map[string]any{"matchLabels": map[string]any{"oac-netpol": "closed"}},
			"policyTypes": []any{"Ingress", "Egress"},
		},
	}
	if err := c.Do(ctx, http.MethodPost, "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies", policy, nil); err != nil {
		t.Fatal(err)
	}
	policyPath := "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies/deny-all"
	for _, name := range []string{"open", "peer", "closed"} {
		p := newPod(name, probeImage)
		p["metadata"].(map[string]any)["labels"] = map[string]any{"oac-netpol": name}
		p["spec"].(map[string]any)["automountServiceAccountToken"] = false
		p["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)["args"] = []any{"listen", "8080"}
		if err := c.Do(ctx, http.MethodPost, "/api/v1/namespaces/default/pods", p, nil); err != nil {
			t.Fatal(err)
		}
		defer deleteAndWait(ctx, t, c, "/api/v1/namespaces/default/pods/"+name)
	}
	ip := map[string]string{}
	for _, name := range []string{"open", "peer", "closed"} {
		ip[name] = waitRunning(ctx, t, c, name).Status.PodIP
	}
	t1 := time.Now()
	eventually(t, 30*time.Second, "the enforcer runs the closed Pod's traffic through deny-all", func() error {
		if got := PodPolicies("default", "closed"); !slices.Equal(got, []string{"deny-all"}) {
			return fmt.Errorf("policies %q", got)
		}
		return nil
	})
	t.Logf("closed Pod Running to enforced: %s", time.Since(t1).Round(time.Millisecond))
	if got := PodPolicies("default", "open"); len(got) > 0 {
		t.Errorf("the enforcer runs the open Pod's traffic through %q, which select other Pods", got)
	}
	pod := func(name string) string { return net.JoinHostPort(ip[name], "8080") }

	connect := func(from string, targets ...string) map[string]string {
		t.Helper()
		res, err := c.Exec(ctx, "default", from, "main", append([]string{"/bin/probe", "connect", "1500"}, targets...)...)
		if err != nil || res.Status != "Success" {
			t.Fatalf("exec connect in %s: %+v %v", from, res, err)
		}
		got := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(string(res.Stdout)), "\n") {
			addr, result, _ := strings.Cut(line, " ")
			got[addr] = result
		}
		t.Logf("from %s: %s", from, strings.TrimSpace(string(res.Stdout)))
		return got
	}

	// Without a policy: another Pod and the node's listeners are reached;
	// the closed Pod is not.
	got := connect("open", append([]string{pod("peer"), pod("closed")}, hostTargets...)...)
	for _, a := range append([]string{pod("peer")}, hostTargets...) {
		if got[a] != "ok" {
			t.Errorf("the open Pod does not reach %s: %s", a, got[a])
		}
	}
	if got[pod("closed")] == "ok" {
		t.Errorf("the open Pod reaches the closed Pod at %s, which denies all ingress", pod("closed"))
	}

	// Selected by deny-all: nothing is reached, the apiserver's port on
	// any address included.
	all := append([]string{pod("peer"), pod("open")}, hostTargets...)
	all = append(all, net.JoinHostPort(c.NodeIP, hostPort), kubelet,
		net.JoinHostPort("127.0.0.1", apiPort), net.JoinHostPort(c.NodeIP, apiPort), net.JoinHostPort(gateway, apiPort))
	got = connect("closed", all...)
	for _, a := range all {
		if !strings.HasPrefix(got[a], "fail:") {
			t.Errorf("the closed Pod reaches %s: %q", a, got[a])
		}
	}

	// The policy deleted, the same Pod reaches them again.
	deleteAndWait(ctx, t, c, policyPath)
	eventually(t, 30*time.Second, "the enforcer lets the closed Pod's traffic go through no policy", func() error {
		if got := PodPolicies("default", "closed"); len(got) > 0 {
			return fmt.Errorf("policies %q", got)
		}
		return nil
	})
	got = connect("closed", append([]string{pod("peer")}, hostTargets...)...)
	for _, a := range append([]string{pod("peer")}, hostTargets...) {
		if got[a] != "ok" {
			t.Errorf("without the policy, the closed Pod does not reach %s: %s", a, got[a])
		}
	}
}
