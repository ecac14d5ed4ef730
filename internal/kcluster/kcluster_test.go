//go:build k8s && linux

package kcluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestCluster starts a real single-node cluster, runs a Pod of the pause
// image on it until Running, execs in another, proves the scheduler, the
// default StorageClass, the garbage collector and RBAC behave as in a real
// cluster (the subtests), deletes the Pods, stops the cluster and checks
// that nothing is left. KCLUSTER_BIN_DIR names prebuilt binaries; else
// they are built once into KCLUSTER_CACHE_DIR, by default the user cache
// directory.
func TestCluster(t *testing.T) {
	if m := Missing(); m != "" {
		t.Fatal(m)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	t0 := time.Now()
	c, err := Start(ctx, Options{BinDir: os.Getenv("KCLUSTER_BIN_DIR"), CacheDir: os.Getenv("KCLUSTER_CACHE_DIR"), Log: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = c.Stop()
		}
	}()
	t.Logf("start to node Ready: %s (steps: %v)", time.Since(t0).Round(time.Millisecond), c.Timings)

	var node struct {
		Status struct {
			NodeInfo  struct{ KubeletVersion, ContainerRuntimeVersion string }
			Addresses []struct{ Type, Address string }
		}
	}
	if err := c.Get(ctx, "/api/v1/nodes/"+c.NodeName, &node); err != nil {
		t.Fatal(err)
	}
	t.Logf("node %s: kubelet %s, runtime %s, addresses %v", c.NodeName, node.Status.NodeInfo.KubeletVersion,
		node.Status.NodeInfo.ContainerRuntimeVersion, node.Status.Addresses)
	if node.Status.NodeInfo.KubeletVersion != Version {
		t.Errorf("kubelet version %q, want %q", node.Status.NodeInfo.KubeletVersion, Version)
	}

	// The kubeconfig works for kubectl when there is one.
	if kubectl, err := exec.LookPath("kubectl"); err == nil {
		out, err := exec.Command(kubectl, "--kubeconfig", c.Kubeconfig, "get", "nodes").CombinedOutput()
		t.Logf("kubectl get nodes: %v\n%s", err, out)
	}

	// Idle memory, once the node has settled.
	time.Sleep(10 * time.Second)
	for name, rss := range c.RSS() {
		t.Logf("idle RSS %s: %d MiB", name, rss>>20)
	}

	pod := map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": "pause", "namespace": "default"},
		"spec": map[string]any{
			"nodeName":                      c.NodeName,
			"automountServiceAccountToken":  false,
			"terminationGracePeriodSeconds": 2,
			"containers": []any{map[string]any{
				"name": "pause", "image": PauseImage, "imagePullPolicy": "Never",
			}},
		},
	}
	t1 := time.Now()
	if err := c.Do(ctx, http.MethodPost, "/api/v1/namespaces/default/pods", pod, nil); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Status struct {
			Phase, PodIP string
			Conditions   []struct{ Type, Status, Reason, Message string }
		}
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if err := c.Get(ctx, "/api/v1/namespaces/default/pods/pause", &got); err != nil {
			t.Fatal(err)
		}
		if got.Status.Phase == "Running" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod not Running within 2m: %+v\nkubelet: %s", got.Status, c.LogTail("kubelet", 4000))
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("pod create to Running: %s (pod IP %s)", time.Since(t1).Round(time.Millisecond), got.Status.PodIP)
	if !strings.HasPrefix(got.Status.PodIP, "198.18.0.") {
		t.Errorf("pod IP %q is not in %s", got.Status.PodIP, PodSubnet)
	}
	if _, err := os.Stat("/sys/class/net/" + c.bridge); err != nil {
		t.Errorf("the CNI bridge %s is not there while a pod runs: %v", c.bridge, err)
	}

	// A second image, imported by ImportImage, and exec through the API.
	src := t.TempDir()
	if err := os.WriteFile(src+"/go.mod", []byte("module probe\n\ngo 1.22\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(src+"/main.go", []byte(probeSource), 0o644); err != nil {
		t.Fatal(err)
	}
	archive := t.TempDir() + "/probe.oci.tar"
	if err := StaticBinaryImage(ctx, src, "probe", probeImage, archive); err != nil {
		t.Fatal(err)
	}
	if err := c.ImportImage(ctx, archive); err != nil {
		t.Fatal(err)
	}
	probe := map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": "probe", "namespace": "default"},
		"spec": map[string]any{
			"nodeName":                      c.NodeName,
			"automountServiceAccountToken":  false,
			"terminationGracePeriodSeconds": 2,
			"containers": []any{map[string]any{
				"name": "probe", "image": probeImage, "imagePullPolicy": "Never",
			}},
		},
	}
	if err := c.Do(ctx, http.MethodPost, "/api/v1/namespaces/default/pods", probe, nil); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(2 * time.Minute)
	for {
		if err := c.Get(ctx, "/api/v1/namespaces/default/pods/probe", &got); err != nil {
			t.Fatal(err)
		}
		if got.Status.Phase == "Running" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("probe pod not Running within 2m: %+v", got.Status)
		}
		time.Sleep(200 * time.Millisecond)
	}
	te := time.Now()
	res, err := c.Exec(ctx, "default", "probe", "probe", "/bin/probe", "echo", "hello", "world")
	if err != nil {
		t.Fatalf("exec: %v\nkubelet: %s", err, c.LogTail("kubelet", 3000))
	}
	t.Logf("exec: %s: stdout %q stderr %q status %q %q", time.Since(te).Round(time.Millisecond), res.Stdout, res.Stderr, res.Status, res.Message)
	if string(res.Stdout) != "hello world\n" || string(res.Stderr) != "to stderr\n" || res.Status != "Success" {
		t.Errorf("exec echo: %+v", res)
	}
	res, err = c.Exec(ctx, "default", "probe", "probe", "/bin/probe", "exit", "3")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("exec exit 3: status %q %q", res.Status, res.Message)
	if res.Status != "Failure" || !strings.Contains(res.Message, "3") {
		t.Errorf("exec exit 3: %+v", res)
	}

	t.Run("a Pod that names no node is scheduled onto the node and runs", func(t *testing.T) {
		testScheduled(ctx, t, c)
	})
	t.Run("a claim binds to a hostPath volume a Pod writes into, and deleting the claim removes its directory", func(t *testing.T) {
		testStorage(ctx, t, c)
	})
	t.Run("a ConfigMap owned by a Pod is garbage-collected once the Pod is deleted", func(t *testing.T) {
		testGarbageCollection(ctx, t, c)
	})
	t.Run("an unprivileged user is refused until a Role grants it, then allowed exactly that", func(t *testing.T) {
		testRBAC(ctx, t, c)
	})
	t.Run("with the NetworkPolicy enforcer on, a Pod a deny-all policy selects reaches no Pod and no address of the node, and no Pod reaches it, while a Pod without a policy reaches them all", func(t *testing.T) {
		testNetworkPolicy(ctx, t, c)
	})
	t.Run("agent-sandbox binds a claim to its warm pool's Ready Pod of a tight template, refills, and deleting the claim leaves nothing", func(t *testing.T) {
		testAgentSandbox(ctx, t, c)
	})

	t2 := time.Now()
	if err := c.Do(ctx, http.MethodDelete, "/api/v1/namespaces/default/pods/pause",
		map[string]any{"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 1}, nil); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(2 * time.Minute)
	for {
		err := c.Get(ctx, "/api/v1/namespaces/default/pods/pause", &got)
		if IsNotFound(err) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod not gone within 2m: %+v", got.Status)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("pod delete to gone: %s", time.Since(t2).Round(time.Millisecond))

	pids := c.PIDs()
	t3 := time.Now()
	stopped = true
	if err := c.Stop(); err != nil {
		t.Errorf("Stop: %v", err)
	}
	t.Logf("Stop: %s", time.Since(t3).Round(time.Millisecond))
	if left := c.Leftovers(); len(left) > 0 {
		t.Errorf("left after Stop: %v", left)
	}
	for name, pid := range pids {
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
			t.Errorf("%s (pid %d) still runs", name, pid)
		}
	}
	if _, err := os.Stat("/sys/class/net/" + c.bridge); err == nil {
		t.Errorf("the CNI bridge %s is left after Stop", c.bridge)
	}
}

// pod is what the tests read of a Pod.
type pod struct {
	Metadata struct{ UID string }
	Spec     struct {
		NodeName, ServiceAccountName string
		Volumes                      []struct {
			Name      string
			Projected *struct{}
		}
	}
	Status struct {
		Phase, PodIP string
		Conditions   []struct{ Type, Status, Reason, Message string }
	}
}

// newPod is a Pod of image in namespace default that names no node.
func newPod(name, image string) map[string]any {
	return map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": name, "namespace": "default"},
		"spec": map[string]any{
			"terminationGracePeriodSeconds": 2,
			"containers": []any{map[string]any{
				"name": "main", "image": image, "imagePullPolicy": "Never",
			}},
		},
	}
}

// eventually polls check every 200ms until it returns nil, and fails the
// test with its last error after timeout.
func eventually(t *testing.T, timeout time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitRunning waits until the Pod is Running and returns it.
func waitRunning(ctx context.Context, t *testing.T, c *Cluster, name string) pod {
	t.Helper()
	var p pod
	eventually(t, 2*time.Minute, "pod "+name+" Running", func() error {
		if err := c.Get(ctx, "/api/v1/namespaces/default/pods/"+name, &p); err != nil {
			return err
		}
		if p.Status.Phase != "Running" {
			return fmt.Errorf("phase %q, conditions %+v", p.Status.Phase, p.Status.Conditions)
		}
		return nil
	})
	return p
}

// deleteAndWait deletes the object at path and waits until it is gone.
func deleteAndWait(ctx context.Context, t *testing.T, c *Cluster, path string) {
	t.Helper()
	if err := c.Do(ctx, http.MethodDelete, path, map[string]any{"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 1}, nil); err != nil {
		t.Fatalf("delete %s: %v", path, err)
	}
	waitGone(ctx, t, c, path)
}

// waitGone waits until the object at path is gone.
func waitGone(ctx context.Context, t *testing.T, c *Cluster, path string) {
	t.Helper()
	eventually(t, 2*time.Minute, path+" gone", func() error {
		err := c.Get(ctx, path, nil)
		if IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return errors.New("still there")
	})
}

func testScheduled(ctx context.Context, t *testing.T, c *Cluster) {
	// No nodeName and no automountServiceAccountToken: the scheduler
	// places it, the ServiceAccount admission plugin gives it default's
	// token, the kubelet (as the node) fetches the token and the root CA.
	t0 := time.Now()
	if err := c.Do(ctx, http.MethodPost, "/api/v1/namespaces/default/pods", newPod("scheduled", PauseImage), nil); err != nil {
		t.Fatal(err)
	}
	p := waitRunning(ctx, t, c, "scheduled")
	t.Logf("unscheduled pod create to Running: %s", time.Since(t0).Round(time.Millisecond))
	if p.Spec.NodeName != c.NodeName {
		t.Errorf("scheduled onto %q, want %q", p.Spec.NodeName, c.NodeName)
	}
	if p.Spec.ServiceAccountName != "default" {
		t.Errorf("service account %q, want default", p.Spec.ServiceAccountName)
	}
	token := false
	for _, v := range p.Spec.Volumes {
		token = token || (strings.HasPrefix(v.Name, "kube-api-access-") && v.Projected != nil)
	}
	if !token {
		t.Errorf("no projected service-account token volume: %+v", p.Spec.Volumes)
	}
	deleteAndWait(ctx, t, c, "/api/v1/namespaces/default/pods/scheduled")
}

func testStorage(ctx context.Context, t *testing.T, c *Cluster) {
	var sc struct {
		Metadata      struct{ Annotations map[string]string }
		Provisioner   string
		ReclaimPolicy string
	}
	if err := c.Get(ctx, "/apis/storage.k8s.io/v1/storageclasses/"+StorageClass, &sc); err != nil {
		t.Fatal(err)
	}
	if sc.Metadata.Annotations["storageclass.kubernetes.io/is-default-class"] != "true" || sc.Provisioner != "kubernetes.io/host-path" || sc.ReclaimPolicy != "Delete" {
		t.Errorf("storage class %s: %+v", StorageClass, sc)
	}

	// A claim that names no class gets the default one and binds.
	t0 := time.Now()
	claim := map[string]any{
		"apiVersion": "v1", "kind": "PersistentVolumeClaim",
		"metadata": map[string]any{"name": "data", "namespace": "default"},
		"spec": map[string]any{
			"accessModes": []any{"ReadWriteOnce"},
			"resources":   map[string]any{"requests": map[string]any{"storage": "16Mi"}},
		},
	}
	if err := c.Do(ctx, http.MethodPost, "/api/v1/namespaces/default/persistentvolumeclaims", claim, nil); err != nil {
		t.Fatal(err)
	}
	var pvc struct {
		Spec   struct{ VolumeName, StorageClassName string }
		Status struct{ Phase string }
	}
	eventually(t, time.Minute, "claim Bound", func() error {
		if err := c.Get(ctx, "/api/v1/namespaces/default/persistentvolumeclaims/data", &pvc); err != nil {
			return err
		}
		if pvc.Status.Phase != "Bound" {
			return fmt.Errorf("phase %q", pvc.Status.Phase)
		}
		return nil
	})
	t.Logf("claim create to Bound: %s", time.Since(t0).Round(time.Millisecond))
	if pvc.Spec.StorageClassName != StorageClass {
		t.Errorf("claim's class %q, want %q", pvc.Spec.StorageClassName, StorageClass)
	}
	var pv struct {
		Spec struct {
			HostPath                      struct{ Path string }
			PersistentVolumeReclaimPolicy string
		}
	}
	if err := c.Get(ctx, "/api/v1/persistentvolumes/"+pvc.Spec.VolumeName, &pv); err != nil {
		t.Fatal(err)
	}
	dir := pv.Spec.HostPath.Path
	if !strings.HasPrefix(dir, HostPathPVDir+"/") || pv.Spec.PersistentVolumeReclaimPolicy != "Delete" {
		t.Fatalf("volume %s: %+v", pvc.Spec.VolumeName, pv.Spec)
	}

	// A Pod mounts it and writes; the file is in the volume's directory.
	writer := newPod("writer", probeImage)
	spec := writer["spec"].(map[string]any)
	spec["automountServiceAccountToken"] = false
	spec["volumes"] = []any{map[string]any{"name": "data", "persistentVolumeClaim": map[string]any{"claimName": "data"}}}
	spec["containers"].([]any)[0].(map[string]any)["volumeMounts"] = []any{map[string]any{"name": "data", "mountPath": "/data"}}
	if err := c.Do(ctx, http.MethodPost, "/api/v1/namespaces/default/pods", writer, nil); err != nil {
		t.Fatal(err)
	}
	waitRunning(ctx, t, c, "writer")
	res, err := c.Exec(ctx, "default", "writer", "main", "/bin/probe", "write", "/data/hello", "from the pod")
	if err != nil || res.Status != "Success" {
		t.Fatalf("exec write: %+v %v", res, err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "hello")); err != nil || string(b) != "from the pod" {
		t.Errorf("the volume's directory holds %q (%v), want what the pod wrote", b, err)
	}

	// Deleting the claim (once no Pod uses it) deletes the volume and its
	// directory.
	deleteAndWait(ctx, t, c, "/api/v1/namespaces/default/pods/writer")
	t1 := time.Now()
	deleteAndWait(ctx, t, c, "/api/v1/namespaces/default/persistentvolumeclaims/data")
	waitGone(ctx, t, c, "/api/v1/persistentvolumes/"+pvc.Spec.VolumeName)
	eventually(t, time.Minute, dir+" removed", func() error {
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("stat: %v", err)
		}
		return nil
	})
	t.Logf("claim delete to directory gone: %s", time.Since(t1).Round(time.Millisecond))
}

func testGarbageCollection(ctx context.Context, t *testing.T, c *Cluster) {
	var owner pod
	if err := c.Do(ctx, http.MethodPost, "/api/v1/namespaces/default/pods", newPod("owner", PauseImage), &owner); err != nil {
		t.Fatal(err)
	}
	cm := map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{
			"name": "owned", "namespace": "default",
			"ownerReferences": []any{map[string]any{"apiVersion": "v1", "kind": "Pod", "name": "owner", "uid": owner.Metadata.UID}},
		},
		"data": map[string]any{"k": "v"},
	}
	if err := c.Do(ctx, http.MethodPost, "/api/v1/namespaces/default/configmaps", cm, nil); err != nil {
		t.Fatal(err)
	}
	waitRunning(ctx, t, c, "owner")
	// The owner is there: the ConfigMap stays.
	time.Sleep(2 * time.Second)
	if err := c.Get(ctx, "/api/v1/namespaces/default/configmaps/owned", nil); err != nil {
		t.Fatalf("the owned ConfigMap went while its owner runs: %v", err)
	}
	deleteAndWait(ctx, t, c, "/api/v1/namespaces/default/pods/owner")
	t0 := time.Now()
	waitGone(ctx, t, c, "/api/v1/namespaces/default/configmaps/owned")
	t.Logf("owner gone to ConfigMap collected: %s", time.Since(t0).Round(time.Millisecond))
}

func testRBAC(ctx context.Context, t *testing.T, c *Cluster) {
	const ns = "oac-rbac"
	if err := c.Do(ctx, http.MethodPost, "/api/v1/namespaces", map[string]any{
		"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns},
	}, nil); err != nil {
		t.Fatal(err)
	}
	u, err := c.User("oac-test-user")
	if err != nil {
		t.Fatal(err)
	}
	configmaps := "/api/v1/namespaces/" + ns + "/configmaps"
	if err := u.Get(ctx, configmaps, nil); !IsForbidden(err) {
		t.Fatalf("an unbound user listing configmaps: %v, want 403", err)
	}

	// A Role that reads configmaps, bound to the user.
	role := map[string]any{
		"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
		"metadata": map[string]any{"name": "configmap-reader", "namespace": ns},
		"rules": []any{map[string]any{
			"apiGroups": []any{""}, "resources": []any{"configmaps"}, "verbs": []any{"get", "list"},
		}},
	}
	binding := map[string]any{
		"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
		"metadata": map[string]any{"name": "configmap-reader", "namespace": ns},
		"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "configmap-reader"},
		"subjects": []any{map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": u.Name}},
	}
	if err := c.Do(ctx, http.MethodPost, "/apis/rbac.authorization.k8s.io/v1/namespaces/"+ns+"/roles", role, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Do(ctx, http.MethodPost, "/apis/rbac.authorization.k8s.io/v1/namespaces/"+ns+"/rolebindings", binding, nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the bound user lists configmaps", func() error {
		return u.Get(ctx, configmaps, nil)
	})
	if kubectl, err := exec.LookPath("kubectl"); err == nil {
		out, err := exec.Command(kubectl, "--kubeconfig", u.Kubeconfig, "-n", ns, "get", "configmaps").CombinedOutput()
		if err != nil {
			t.Errorf("kubectl with the user's kubeconfig: %v\n%s", err, out)
		}
	}

	// Exactly that: not another verb, resource or namespace.
	for what, err := range map[string]error{
		"create a configmap": u.Do(ctx, http.MethodPost, configmaps, map[string]any{
			"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "x"}}, nil),
		"list pods":                  u.Get(ctx, "/api/v1/namespaces/"+ns+"/pods", nil),
		"list configmaps in default": u.Get(ctx, "/api/v1/namespaces/default/configmaps", nil),
	} {
		if !IsForbidden(err) {
			t.Errorf("the bound user may %s: %v, want 403", what, err)
		}
	}

	// The namespace controller empties a deleted namespace and removes it.
	t0 := time.Now()
	deleteAndWait(ctx, t, c, "/api/v1/namespaces/"+ns)
	t.Logf("namespace delete to gone: %s", time.Since(t0).Round(time.Millisecond))
}

// probeImage is the image of probeSource the test imports.
const probeImage = "oac.local/kcluster/probe:1"

// probeSource is a static test program: "echo ARGS" prints them (and a
// line to stderr), "exit N" exits with N, "write FILE TEXT" writes TEXT
// into FILE, "connect MS ADDR..." tries a TCP connection to each
// HOST:PORT within MS milliseconds and prints "ADDR ok" or "ADDR fail:
// ERROR" for each, "listen PORT" accepts (and closes) connections on
// PORT until SIGTERM, else it waits for SIGTERM.
const probeSource = `package main

import (
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "echo":
			fmt.Println(strings.Join(os.Args[2:], " "))
			fmt.Fprintln(os.Stderr, "to stderr")
			return
		case "exit":
			n, _ := strconv.Atoi(os.Args[2])
			os.Exit(n)
		case "write":
			if err := os.WriteFile(os.Args[2], []byte(os.Args[3]), 0o644); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			return
		case "connect":
			ms, _ := strconv.Atoi(os.Args[2])
			for _, addr := range os.Args[3:] {
				conn, err := net.DialTimeout("tcp", addr, time.Duration(ms)*time.Millisecond)
				if err != nil {
					fmt.Println(addr, "fail:", err)
					continue
				}
				conn.Close()
				fmt.Println(addr, "ok")
			}
			return
		case "listen":
			l, err := net.Listen("tcp", ":"+os.Args[2])
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			go func() {
				for {
					conn, err := l.Accept()
					if err != nil {
						return
					}
					conn.Close()
				}
			}()
		}
	}
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
	<-c
}
`
