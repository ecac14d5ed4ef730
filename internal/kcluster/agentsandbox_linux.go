package kcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// AgentSandboxVersion is the version of Kubernetes' agent-sandbox
// (sigs.k8s.io/agent-sandbox) tools/agent-sandbox builds.
const AgentSandboxVersion = "v1.0.1"

// AgentSandboxController is agent-sandbox's controller binary, and the
// user (a client certificate's CN) it runs as in the cluster.
const AgentSandboxController = "agent-sandbox-controller"

// AgentSandboxCRDs are the CustomResourceDefinitions StartAgentSandbox
// installs: the core Sandbox and the extensions' SandboxTemplate,
// SandboxWarmPool and SandboxClaim (API version v1beta1).
var AgentSandboxCRDs = []string{
	"sandboxes.agents.x-k8s.io",
	"sandboxtemplates.extensions.agents.x-k8s.io",
	"sandboxwarmpools.extensions.agents.x-k8s.io",
	"sandboxclaims.extensions.agents.x-k8s.io",
}

// agentSandboxFiles are what a build leaves in its directory besides the
// binary, copied from the module's k8s directory: the CRDs and the two
// ClusterRoles the controller (core and extensions) needs.
var agentSandboxFiles = []string{
	"crds/agents.x-k8s.io_sandboxes.yaml",
	"crds/extensions.agents.x-k8s.io_sandboxtemplates.yaml",
	"crds/extensions.agents.x-k8s.io_sandboxwarmpools.yaml",
	"crds/extensions.agents.x-k8s.io_sandboxclaims.yaml",
	"rbac.generated.yaml",
	"extensions-rbac.generated.yaml",
}

// AgentSandboxOptions says where agent-sandbox's controller comes from.
// The zero value builds it into the user cache directory once.
type AgentSandboxOptions struct {
	// BinDir holds a prebuilt agent-sandbox-controller and the module's
	// files it needs (crds/*.yaml, rbac.generated.yaml,
	// extensions-rbac.generated.yaml); nothing is built.
	BinDir string
	// CacheDir is where it is built once and then reused (default: the
	// user cache directory's sandbox-agent/agent-sandbox/VERSION).
	CacheDir string
	// ToolsDir is tools/agent-sandbox (default: found from the working
	// directory upwards).
	ToolsDir string
	// Log, when set, receives progress lines.
	Log func(format string, a ...any)
}

// EnsureAgentSandbox builds agent-sandbox's controller into the cache
// directory o names unless it is there (with the CRDs and ClusterRoles
// of its module), and returns that directory: `make k8s-bins` runs it
// before the e2e tests, so a cold build is not paid inside their time
// limit.
func EnsureAgentSandbox(ctx context.Context, o AgentSandboxOptions) (string, error) {
	logf := o.Log
	if logf == nil {
		logf = func(string, ...any) {}
	}
	have := func(dir string) bool {
		if st, err := os.Stat(filepath.Join(dir, AgentSandboxController)); err != nil || st.Mode()&0o111 == 0 {
			return false
		}
		for _, f := range agentSandboxFiles {
			if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
				return false
			}
		}
		return true
	}
	return cached(ctx, cachedBuild{
		binDir: o.BinDir, cacheDir: o.CacheDir, toolsDir: o.ToolsDir, logf: logf,
		what: AgentSandboxController + ", " + strings.Join(agentSandboxFiles, ", "), cacheName: "agent-sandbox",
		version: AgentSandboxVersion, tools: "agent-sandbox", cost: "about a minute on a cold cache",
		have: have, build: BuildAgentSandbox,
	})
}

// BuildAgentSandbox builds agent-sandbox-controller from toolsDir
// (tools/agent-sandbox, whose go.mod pins the module) into outDir
// statically, and copies the module's CRDs and ClusterRoles beside it;
// the binary is moved in last, so a directory holding it is complete.
func BuildAgentSandbox(ctx context.Context, toolsDir, outDir string) error {
	tmp, err := os.MkdirTemp(outDir, ".build-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	env := append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off")
	// The version it reports (--version, its logs), as agent-sandbox's
	// own build sets it.
	ldflags := "-s -w -X sigs.k8s.io/agent-sandbox/internal/version.gitVersion=" + AgentSandboxVersion
	cmd := exec.CommandContext(ctx, goTool(), "build", "-trimpath", "-ldflags", ldflags, "-o", tmp+"/",
		"sigs.k8s.io/agent-sandbox/cmd/"+AgentSandboxController)
	cmd.Dir, cmd.Env = toolsDir, env
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("kcluster: build tools/agent-sandbox: %w: %s", err, out)
	}
	cmd = exec.CommandContext(ctx, goTool(), "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/agent-sandbox")
	cmd.Dir, cmd.Env = toolsDir, env
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("kcluster: find the agent-sandbox module: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	for _, f := range agentSandboxFiles {
		b, err := os.ReadFile(filepath.Join(mod, "k8s", f))
		if err != nil {
			return fmt.Errorf("kcluster: the agent-sandbox module at %s: %w", mod, err)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(outDir, f)), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(outDir, f), b, 0o644); err != nil {
			return err
		}
	}
	return os.Rename(filepath.Join(tmp, AgentSandboxController), filepath.Join(outDir, AgentSandboxController))
}

// StartAgentSandbox runs agent-sandbox on the cluster: it installs the
// four CRDs and waits until the apiserver serves them, creates the
// controller's two ClusterRoles (core and extensions, as the module
// ships them) bound to the user agent-sandbox-controller, and starts the
// controller with its extensions as a process of the cluster, with a
// client certificate of that user as the scheduler and the controller
// manager have theirs. Stop ends it before it deletes the cluster's Pods,
// so that no warm pool makes them again.
func (c *Cluster) StartAgentSandbox(ctx context.Context, o AgentSandboxOptions) error {
	if c.proc(AgentSandboxController) != nil {
		return errors.New("kcluster: agent-sandbox already runs on this cluster")
	}
	if o.Log == nil {
		o.Log = c.logf
	}
	t0 := time.Now()
	dir, err := EnsureAgentSandbox(ctx, o)
	if err != nil {
		return err
	}
	c.Timings["agent-sandbox binary"] = time.Since(t0)
	t := time.Now()
	for _, f := range agentSandboxFiles[:4] {
		if err := c.createYAML(ctx, filepath.Join(dir, f), "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"); err != nil {
			return fmt.Errorf("kcluster: agent-sandbox CRD %s: %w", f, err)
		}
	}
	for _, name := range AgentSandboxCRDs {
		if err := c.waitFor(ctx, "agent-sandbox CRD "+name, time.Minute, func() error { return c.crdEstablished(ctx, name) }); err != nil {
			return err
		}
	}
	for i, f := range agentSandboxFiles[4:] {
		if err := c.createYAML(ctx, filepath.Join(dir, f), "/apis/rbac.authorization.k8s.io/v1/clusterroles"); err != nil {
			return fmt.Errorf("kcluster: agent-sandbox ClusterRole %s: %w", f, err)
		}
		role := []string{"agent-sandbox-controller", "agent-sandbox-controller-extensions"}[i]
		err := c.Do(ctx, http.MethodPost, "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", map[string]any{
			"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
			"metadata": map[string]any{"name": role},
			"subjects": []any{map[string]any{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": AgentSandboxController}},
			"roleRef":  map[string]any{"kind": "ClusterRole", "apiGroup": "rbac.authorization.k8s.io", "name": role},
		}, nil)
		if err != nil && !isConflict(err) {
			return fmt.Errorf("kcluster: agent-sandbox ClusterRoleBinding %s: %w", role, err)
		}
	}
	c.Timings["agent-sandbox CRDs"] = time.Since(t)
	t = time.Now()
	kc, err := c.componentKubeconfig(AgentSandboxController, AgentSandboxController)
	if err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	if err := c.spawn(AgentSandboxController, filepath.Join(dir, AgentSandboxController),
		"--kubeconfig", kc,
		"--extensions",
		"--leader-elect=false",
		"--metrics-bind-address", "0",
		"--health-probe-bind-address", "127.0.0.1:"+strconv.Itoa(port),
	); err != nil {
		return err
	}
	url := "http://127.0.0.1:" + strconv.Itoa(port) + "/readyz"
	hc := &http.Client{Timeout: 5 * time.Second}
	defer hc.CloseIdleConnections()
	if err := c.waitFor(ctx, AgentSandboxController, time.Minute, func() error {
		resp, err := hc.Get(url)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("readyz status %d", resp.StatusCode)
		}
		return nil
	}); err != nil {
		return err
	}
	c.Timings["agent-sandbox controller"] = time.Since(t)
	return nil
}

// createYAML posts the YAML object in file to path (the apiserver
// decodes YAML itself); an object that exists already is left as it is.
func (c *Cluster) createYAML(ctx context.Context, file, path string) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL+path, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	req.Header.Set("Content-Type", "application/yaml")
	req.Header.Set("Accept", "application/json")
	resp, err := c.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode/100 != 2 && resp.StatusCode != http.StatusConflict {
		return &APIError{Status: resp.StatusCode, Body: strings.TrimSpace(string(body))}
	}
	return nil
}

// crdEstablished reports whether the apiserver serves the CRD name.
func (c *Cluster) crdEstablished(ctx context.Context, name string) error {
	var crd struct {
		Status struct {
			Conditions []struct{ Type, Status, Message string }
		}
	}
	if err := c.Get(ctx, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"+name, &crd); err != nil {
		return err
	}
	for _, cond := range crd.Status.Conditions {
		if cond.Type == "Established" && cond.Status == "True" {
			return nil
		}
	}
	return errors.New("not Established yet")
}

func isConflict(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Status == http.StatusConflict
}
