//go:build linux

package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
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

// kubeKeepImageRef is the image whose agent keeps the Pod's interfaces.
const kubeKeepImageRef = "oac.local/e2e/guest-keep-interfaces:1"

// dialprobeBin is where the images of this file hold dialprobe.
const dialprobeBin = "/usr/local/bin/oac-dialprobe"

// kubeKeepInterfacesImage builds the run's guest image with the agent
// built with oac_keep_interfaces (its --offline deletes no interface)
// and dialprobe, and imports it into the cluster once. Only this test
// image has such an agent: no flag, environment variable or bootstrap
// field of the real one keeps the interfaces.
func kubeKeepInterfacesImage(t *testing.T, c *kcluster.Cluster) string {
	t.Helper()
	needImageBuild(t)
	testCA(t)
	kube.keepOnce.Do(func() {
		dir := filepath.Join(bins.dir, "image-oci-keep-interfaces")
		out, err := exec.Command(bins.image, "build", "--agent", bins.guestKeepInterfaces, "--sandbox-io", bins.sandboxIO,
			"--ca-bundle", runCA.bundle, "--file", bins.dialprobe+":"+dialprobeBin+":0755",
			"--output", "oci", "--ref", kubeKeepImageRef, "--epoch", "1", "-o", dir).CombinedOutput()
		if err != nil {
			kube.keepErr = fmt.Errorf("oac-image build: %w: %s", err, out)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		kube.keepErr = c.ImportLayout(ctx, filepath.Join(dir, "oci"))
		kube.keepImage = kubeKeepImageRef
	})
	require.NoError(t, kube.keepErr, "import the keep-interfaces guest image into the cluster")
	return kube.keepImage
}

// TestKubernetesAPodWhoseAgentKeptItsInterfacesReachesNothing runs a
// sandbox whose agent did not delete the Pod's interfaces (the test
// build): the Pod still has its interface and address, and the
// provider's NetworkPolicy alone, enforced by the cluster, keeps it from
// every Pod and every address of the node.
func TestKubernetesAPodWhoseAgentKeptItsInterfacesReachesNothing(t *testing.T) {
	c := needKubernetes(t)
	image := kubeKeepInterfacesImage(t, c)
	name := uniqueName("keepnet")
	// No workload: one would need a network namespace of its own, which
	// the Pod's agent (no CAP_SYS_ADMIN) cannot make.
	s := startShim(t, sandboxSpec{provider: "kubernetes", name: name, bootstrap: `{"version":1,"hostname":"keepnet"}`,
		args: []string{"--kubeconfig", c.Kubeconfig, "--k8s-image", image, "--k8s-pull-policy", "Never"}})
	s.waitState(api.StateReady, 2*time.Minute)
	// The provider names the Pod, its agent's container and its
	// NetworkPolicy so (host/provider/kubernetes: ObjectName,
	// ContainerName).
	assertPodReachesNothing(t, c, image, "default", "oac-"+name, "agent", "oac-"+name)
	s.signal(syscall.SIGTERM)
	assert.Equal(t, 0, s.exit(time.Minute))
	assert.Empty(t, kubeLeftovers(c, s.name))
}

// assertPodReachesNothing proves that the Pod (namespace/pod), whose
// container holds dialprobe at dialprobeBin and whose agent kept its
// interfaces, reaches no Pod and no address of the node once the
// enforcer runs its traffic through policy: from inside it, a Pod of
// image (which holds dialprobe) listening without a policy, a listener
// of this test on all the node's addresses (through the bridge's gateway
// and the node's InternalIP), the kubelet and the apiserver's port are
// all refused, while that Pod reaches the listener, so the test cannot
// pass by a broken network. (That no Pod reaches a confined one is
// internal/kcluster's TestCluster's.) It serves a bare provider Pod and a
// warm pool's (agent-sandbox) Pod, whose policy is its template's, alike.
func assertPodReachesNothing(t *testing.T, c *kcluster.Cluster, image, namespace, pod, container, policy string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	probe := func(in, ctr string, args ...string) string {
		t.Helper()
		res, err := c.Exec(ctx, namespace, in, ctr, append([]string{dialprobeBin}, args...)...)
		require.NoError(t, err, "exec dialprobe in %s", in)
		require.Equal(t, "Success", res.Status, "dialprobe %v in %s: %s %s", args, in, res.Message, res.Stderr)
		return strings.TrimSpace(string(res.Stdout))
	}
	connect := func(from, ctr string, targets ...string) map[string]string {
		t.Helper()
		out := probe(from, ctr, append([]string{"connect", "1500"}, targets...)...)
		t.Logf("from %s:\n%s", from, out)
		got := map[string]string{}
		for _, line := range strings.Split(out, "\n") {
			addr, result, _ := strings.Cut(line, " ")
			got[addr] = result
		}
		return got
	}

	// What makes the test mean something: the agent kept the interface.
	ifaces := probe(pod, container, "interfaces")
	require.NotEmpty(t, ifaces, "the agent deleted the Pod's interfaces: this test needs the oac_keep_interfaces build")
	var p struct {
		Status struct{ PodIP string }
	}
	require.NoError(t, c.Get(ctx, "/api/v1/namespaces/"+namespace+"/pods/"+pod, &p))
	require.NotEmpty(t, p.Status.PodIP)
	t.Logf("pod %s keeps %q, address %s", pod, ifaces, p.Status.PodIP)

	// A Pod no policy selects, listening.
	peer := "oac-netpol-peer-" + strings.ToLower(strconv.FormatInt(time.Now().UnixNano()%1e9, 36))
	require.NoError(t, c.Do(ctx, http.MethodPost, "/api/v1/namespaces/"+namespace+"/pods", map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": peer, "namespace": namespace},
		"spec": map[string]any{
			"automountServiceAccountToken": false, "terminationGracePeriodSeconds": 1,
			"containers": []any{map[string]any{
				"name": "peer", "image": image, "imagePullPolicy": "Never",
				"command": []any{dialprobeBin, "listen", "8080"},
			}},
		},
	}, nil))
	t.Cleanup(func() {
		_ = c.Do(context.Background(), http.MethodDelete, "/api/v1/namespaces/"+namespace+"/pods/"+peer,
			map[string]any{"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 1}, nil)
	})
	var peerIP string
	require.Eventually(t, func() bool {
		var pp struct{ Status struct{ Phase, PodIP string } }
		if c.Get(ctx, "/api/v1/namespaces/"+namespace+"/pods/"+peer, &pp) != nil || pp.Status.Phase != "Running" {
			return false
		}
		peerIP = pp.Status.PodIP
		return true
	}, 2*time.Minute, 200*time.Millisecond, "the peer Pod runs")

	// A listener of the node on all its addresses.
	l, err := net.Listen("tcp4", "0.0.0.0:0")
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
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
	require.NoError(t, c.Get(ctx, "/api/v1/nodes/"+c.NodeName, &node))
	_, apiPort, _ := net.SplitHostPort(strings.TrimPrefix(c.URL, "https://"))

	// The enforcer runs the Pod's traffic through its policy.
	require.Eventually(t, func() bool { return slices.Contains(kcluster.PodPolicies(namespace, pod), policy) },
		30*time.Second, 100*time.Millisecond, "the enforcer runs %s's traffic through %s: %v", pod, policy, kcluster.PodPolicies(namespace, pod))

	viaGateway := net.JoinHostPort(kcluster.PodGateway, hostPort)
	got := connect(peer, "peer", viaGateway)
	if got[viaGateway] != "ok" {
		// What held it back: the rules that counted packets, the
		// enforcer's log.
		rules, _ := exec.Command("iptables-save", "-c").Output()
		nft, _ := exec.Command("nft", "list", "ruleset").Output()
		t.Logf("the peer %s is firewalled through %q\niptables:\n%s\nnft drops:\n%s\nkube-router:\n%s", peerIP,
			kcluster.PodPolicies(namespace, peer), rules, grepLines(string(nft), "drop"), c.LogTail(kcluster.NetworkPolicyController, 4000))
	}
	require.Equal(t, "ok", got[viaGateway], "a Pod without a policy reaches the node's listener")

	targets := []string{
		net.JoinHostPort(peerIP, "8080"),
		viaGateway,
		net.JoinHostPort(c.NodeIP, hostPort),
		net.JoinHostPort(c.NodeIP, strconv.Itoa(node.Status.DaemonEndpoints.KubeletEndpoint.Port)),
		net.JoinHostPort("127.0.0.1", apiPort),
		net.JoinHostPort(c.NodeIP, apiPort),
		net.JoinHostPort(kcluster.PodGateway, apiPort),
	}
	got = connect(pod, container, targets...)
	for _, a := range targets {
		assert.True(t, strings.HasPrefix(got[a], "fail:"), "the confined Pod reaches %s: %q", a, got[a])
	}
}

// The keep-interfaces template and warm pool of the agent-sandbox variant.
const (
	keepTemplate = "oac-keep-interfaces"
	keepPool     = "oac-keep-interfaces-warm"
)

// TestKubernetesAWarmPodWhoseAgentKeptItsInterfacesReachesNothing is the
// same for --k8s-api agent-sandbox: a sandbox claimed from a warm pool of
// oac's template whose image's agent keeps the Pod's interfaces runs in
// a Pod that the template's NetworkPolicy (agent-sandbox's, one per
// template) alone keeps from every Pod and every address of the node.
func TestKubernetesAWarmPodWhoseAgentKeptItsInterfacesReachesNothing(t *testing.T) {
	c := needKubernetes(t)
	needWarmPool(t, c, bins.shim, kubeImage(t, c)) // agent-sandbox's controller runs
	image := kubeKeepInterfacesImage(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	out, err := exec.Command(bins.shim, "warm-pool", "--k8s-image", image, "--k8s-pull-policy", "Never",
		"--template", keepTemplate, "--pool", keepPool, "--replicas", "1").Output()
	require.NoError(t, err, "oac-shim warm-pool")
	docs := strings.Split(string(out), "\n---\n")
	require.Len(t, docs, 2, "a SandboxTemplate and a SandboxWarmPool")
	templates := "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/default/sandboxtemplates"
	for i, path := range []string{templates, poolsPath} {
		var obj map[string]any
		require.NoError(t, yaml.Unmarshal([]byte(docs[i]), &obj))
		require.NoError(t, c.Do(ctx, http.MethodPost, path, obj, nil))
	}
	t.Cleanup(func() {
		for _, path := range []string{poolsPath + "/" + keepPool, templates + "/" + keepTemplate} {
			_ = c.Do(context.Background(), http.MethodDelete, path, nil, nil)
		}
	})
	require.Eventually(t, func() bool {
		var pool struct{ Status struct{ ReadyReplicas int32 } }
		return c.Get(ctx, poolsPath+"/"+keepPool, &pool) == nil && pool.Status.ReadyReplicas >= 1
	}, 2*time.Minute, 100*time.Millisecond, "the keep-interfaces pool has a warm Pod")

	name := uniqueName("warmkeep")
	s := startShim(t, sandboxSpec{provider: "kubernetes", name: name, bootstrap: `{"version":1,"hostname":"warmkeep"}`,
		args: []string{"--kubeconfig", c.Kubeconfig, "--k8s-pull-policy", "Never", "--k8s-api", "agent-sandbox", "--k8s-warm-pool", keepPool}})
	s.waitState(api.StateReady, 2*time.Minute)
	var claim struct {
		Status struct{ Sandbox struct{ Name string } }
	}
	require.NoError(t, c.Get(ctx, claimsPath+"/oac-"+name, &claim))
	// The claimed Pod is named after its Sandbox; agent-sandbox names the
	// template's NetworkPolicy after the template.
	assertPodReachesNothing(t, c, image, "default", claim.Status.Sandbox.Name, "agent", keepTemplate+"-network-policy")
	s.signal(syscall.SIGTERM)
	assert.Equal(t, 0, s.exit(time.Minute))
	assert.Empty(t, claimLeftovers(c, s.name))
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
