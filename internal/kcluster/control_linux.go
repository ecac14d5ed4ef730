package kcluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/oac/sandbox-agent/internal/hostclean"
)

// StorageClass is the cluster's default StorageClass (Start creates it):
// the controller manager's hostPath provisioner (kubernetes.io/host-path)
// makes a directory below HostPathPVDir for each claim at once
// (volumeBindingMode Immediate) and removes it with the claim
// (reclaimPolicy Delete). A claim that names no class gets it.
const StorageClass = "oac-test-hostpath"

// HostPathPVDir is where the hostPath provisioner makes its volumes
// (HostPathPVDir/UUID; the path is fixed in the controller manager).
const HostPathPVDir = "/tmp/hostpath_pv"

// startControlPlane starts kube-scheduler and kube-controller-manager,
// each with its own client certificate (the users RBAC's bootstrap policy
// binds for them), serving health on loopback with the loopback
// certificate.
func (c *Cluster) startControlPlane(bins string, p *pki, schedPort, cmPort int) error {
	dir := c.Dir
	schedKC, err := c.componentKubeconfig("kube-scheduler", "system:kube-scheduler")
	if err != nil {
		return err
	}
	cmKC, err := c.componentKubeconfig("kube-controller-manager", "system:kube-controller-manager")
	if err != nil {
		return err
	}
	serving := func(port int, kubeconfig string) []string {
		return []string{
			"--bind-address", "127.0.0.1", "--secure-port", strconv.Itoa(port),
			"--tls-cert-file", p.loopServing, "--tls-private-key-file", p.loopSvKey,
			"--authentication-kubeconfig", kubeconfig, "--authorization-kubeconfig", kubeconfig,
			"--leader-elect=false",
		}
	}
	scfg, err := json.MarshalIndent(map[string]any{
		"apiVersion":       "kubescheduler.config.k8s.io/v1",
		"kind":             "KubeSchedulerConfiguration",
		"clientConnection": map[string]any{"kubeconfig": schedKC},
		"leaderElection":   map[string]any{"leaderElect": false},
	}, "", "  ")
	if err != nil {
		return err
	}
	scfgFile := filepath.Join(dir, "kube-scheduler.yaml")
	if err := os.WriteFile(scfgFile, scfg, 0o600); err != nil {
		return err
	}
	if err := c.spawn("kube-scheduler", filepath.Join(bins, "kube-scheduler"),
		append([]string{"--config", scfgFile}, serving(schedPort, schedKC)...)...); err != nil {
		return err
	}
	return c.spawn("kube-controller-manager", filepath.Join(bins, "kube-controller-manager"),
		append([]string{
			"--kubeconfig", cmKC,
			"--controllers", "*",
			// Each controller as its own service account, as kubeadm's
			// clusters run it (a test sees the controllers' own RBAC);
			// making their accounts and tokens at start is many requests,
			// hence the higher client rate.
			"--use-service-account-credentials=true",
			"--kube-api-qps", "100", "--kube-api-burst", "200",
			"--service-account-private-key-file", p.saKey,
			"--root-ca-file", p.caFile,
			"--cluster-signing-cert-file", p.caFile, "--cluster-signing-key-file", p.caKeyFile,
			"--enable-hostpath-provisioner",
			// The volume binder retries what it postponed (a volume its
			// pod cache still sees in use) every 2s rather than 15s.
			"--pvclaimbinder-sync-period", "2s",
			"--flex-volume-plugin-dir", filepath.Join(dir, "volume-plugins"),
			"--cluster-name", "oac-kcluster",
		}, serving(cmPort, cmKC)...)...)
}

// componentKubeconfig writes DIR/NAME.kubeconfig with a client
// certificate of the user cn.
func (c *Cluster) componentKubeconfig(name, cn string, orgs ...string) (string, error) {
	cert, key, err := c.pki.clientCert(cn, orgs...)
	if err != nil {
		return "", err
	}
	path := filepath.Join(c.Dir, name+".kubeconfig")
	return path, c.writeKubeconfig(path, name, map[string]any{
		"client-certificate-data": cert, "client-key-data": key,
	})
}

// waitHealthy polls https://127.0.0.1:PORT/healthz of a daemon serving
// the loopback certificate.
func (c *Cluster) waitHealthy(ctx context.Context, name string, port int) error {
	pool := x509.NewCertPool()
	pool.AddCert(c.pki.ca)
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	defer hc.CloseIdleConnections()
	url := "https://127.0.0.1:" + strconv.Itoa(port) + "/healthz"
	return c.waitFor(ctx, name, 90*time.Second, func() error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("healthz status %d", resp.StatusCode)
		}
		return nil
	})
}

// createStorageClass creates StorageClass, marked the default.
func (c *Cluster) createStorageClass(ctx context.Context) error {
	return c.Do(ctx, http.MethodPost, "/apis/storage.k8s.io/v1/storageclasses", map[string]any{
		"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
		"metadata": map[string]any{
			"name":        StorageClass,
			"annotations": map[string]any{"storageclass.kubernetes.io/is-default-class": "true"},
		},
		"provisioner":       "kubernetes.io/host-path",
		"reclaimPolicy":     "Delete",
		"volumeBindingMode": "Immediate",
	}, nil)
}

// defaultServiceAccount reports whether the service-account controller
// has made namespace default's "default" (the ServiceAccount admission
// plugin refuses Pods until it has).
func (c *Cluster) defaultServiceAccount() error {
	var sa struct{}
	return c.Get(context.Background(), "/api/v1/namespaces/default/serviceaccounts/default", &sa)
}

// nodeSchedulable reports whether the node is free of the taints that keep
// the scheduler away (the node lifecycle controller removes not-ready once
// the node is Ready).
func (c *Cluster) nodeSchedulable() error {
	var node struct {
		Spec struct {
			Unschedulable bool
			Taints        []struct{ Key, Effect string }
		}
	}
	if err := c.Get(context.Background(), "/api/v1/nodes/"+c.NodeName, &node); err != nil {
		return err
	}
	if node.Spec.Unschedulable {
		return errors.New("node is cordoned")
	}
	for _, t := range node.Spec.Taints {
		if t.Effect == "NoSchedule" || t.Effect == "NoExecute" {
			return fmt.Errorf("node has taint %s:%s", t.Key, t.Effect)
		}
	}
	return nil
}

// hostPathPVs lists the entries of HostPathPVDir.
func hostPathPVs() []string {
	ents, _ := os.ReadDir(HostPathPVDir)
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// removeHostPathPVs removes the volumes the hostPath provisioner made
// while the cluster ran (those it did not delete with their claims), and
// HostPathPVDir when Start did not find it.
func (c *Cluster) removeHostPathPVs() error {
	if c.hostPathPre == nil {
		return nil // Start recorded nothing: it made nothing there either
	}
	var errs []error
	for _, name := range hostPathPVs() {
		if slices.Contains(c.hostPathPre, name) {
			continue
		}
		p := filepath.Join(HostPathPVDir, name)
		hostclean.UnmountUnder(p)
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, err)
		}
	}
	if !c.hostPathDirPre {
		if err := os.Remove(HostPathPVDir); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
