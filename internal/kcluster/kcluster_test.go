//go:build k8s && linux

package kcluster

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestCluster starts a real single-node cluster, runs a Pod of the pause
// image on it until Running, deletes it, stops the cluster and checks that
// nothing is left. KCLUSTER_BIN_DIR names prebuilt binaries; else they are
// built once into KCLUSTER_CACHE_DIR, by default the user cache directory.
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
	if err := StaticBinaryImage(ctx, src, "probe", "oac.local/kcluster/probe:1", archive); err != nil {
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
				"name": "probe", "image": "oac.local/kcluster/probe:1", "imagePullPolicy": "Never",
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

// probeSource is a static test program: "echo ARGS" prints them (and a
// line to stderr), "exit N" exits with N, else it waits for SIGTERM.
const probeSource = `package main

import (
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
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
		}
	}
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
	<-c
}
`
