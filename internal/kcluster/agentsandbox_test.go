//go:build k8s && linux

package kcluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

const (
	sandboxesPath  = "/apis/agents.x-k8s.io/v1beta1/namespaces/default/sandboxes"
	extensionsPath = "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/default/"
)

// asObject is what the test reads of agent-sandbox's objects and of Pods.
type asObject struct {
	Metadata struct {
		Name, UID       string
		OwnerReferences []struct {
			Kind, Name, UID string
			Controller      bool
		}
	}
	Spec struct {
		AutomountServiceAccountToken *bool
		SecurityContext              struct {
			RunAsNonRoot   *bool
			SeccompProfile struct{ Type string }
		}
		Volumes []struct{ Name string }
		// A NetworkPolicy's.
		PolicyTypes     []string
		Ingress, Egress []any
	}
	Status struct {
		Phase         string
		ReadyReplicas int32
		Conditions    []struct{ Type, Status, Reason, Message string }
		Sandbox       struct{ Name string }
	}
}

func (o asObject) ready() bool {
	return slices.ContainsFunc(o.Status.Conditions, func(c struct{ Type, Status, Reason, Message string }) bool {
		return c.Type == "Ready" && c.Status == "True"
	})
}

// controller is the kind and name of the object's controller ("" when
// none).
func (o asObject) controller() string {
	for _, r := range o.Metadata.OwnerReferences {
		if r.Controller {
			return r.Kind + "/" + r.Name
		}
	}
	return ""
}

// ownedBy lists the objects at path whose controller is kind/name.
func ownedBy(ctx context.Context, c *Cluster, path, owner string) ([]asObject, error) {
	var list struct{ Items []asObject }
	if err := c.Get(ctx, path, &list); err != nil {
		return nil, err
	}
	var out []asObject
	for _, o := range list.Items {
		if o.controller() == owner {
			out = append(out, o)
		}
	}
	return out, nil
}

// warmSandbox is the pool's one sandbox once it and its Pod are Ready.
func warmSandbox(ctx context.Context, c *Cluster, pool string) (sandbox, pod asObject, err error) {
	var p asObject
	if err := c.Get(ctx, extensionsPath+"sandboxwarmpools/"+pool, &p); err != nil {
		return sandbox, pod, err
	}
	if p.Status.ReadyReplicas != 1 {
		return sandbox, pod, fmt.Errorf("pool has %d ready replicas", p.Status.ReadyReplicas)
	}
	sbs, err := ownedBy(ctx, c, sandboxesPath, "SandboxWarmPool/"+pool)
	if err != nil {
		return sandbox, pod, err
	}
	if len(sbs) != 1 || !sbs[0].ready() {
		return sandbox, pod, fmt.Errorf("pool's sandboxes: %+v", sbs)
	}
	pods, err := ownedBy(ctx, c, "/api/v1/namespaces/default/pods", "Sandbox/"+sbs[0].Metadata.Name)
	if err != nil {
		return sandbox, pod, err
	}
	if len(pods) != 1 || !pods[0].ready() {
		return sandbox, pod, fmt.Errorf("sandbox %s's pods: %+v", sbs[0].Metadata.Name, pods)
	}
	return sbs[0], pods[0], nil
}

// testAgentSandbox runs agent-sandbox's controller on the cluster and
// proves its extensions behave as a fleet relies on: a warm pool of one
// gets a Ready Pod of a tight template (non-root, no service-account
// token, seccomp RuntimeDefault, a deny-all NetworkPolicy); a claim is
// bound to that very Pod and the pool makes another; deleting the claim
// deletes its sandbox and Pod and leaves nothing of it. The pool stays,
// so that the cluster's Stop is proven with the controller and a warm Pod
// running. KCLUSTER_AGENT_SANDBOX_DIR names a prebuilt controller.
func testAgentSandbox(ctx context.Context, t *testing.T, c *Cluster) {
	t0 := time.Now()
	if err := c.StartAgentSandbox(ctx, AgentSandboxOptions{BinDir: os.Getenv("KCLUSTER_AGENT_SANDBOX_DIR"), Log: t.Logf}); err != nil {
		t.Fatal(err)
	}
	t.Logf("agent-sandbox started: %s (binary %s, CRDs %s, controller %s)", time.Since(t0).Round(time.Millisecond),
		c.Timings["agent-sandbox binary"].Round(time.Millisecond), c.Timings["agent-sandbox CRDs"].Round(time.Millisecond),
		c.Timings["agent-sandbox controller"].Round(time.Millisecond))

	// A template whose Pod is as tight as the kubernetes provider's where
	// the pause image allows it (it needs no root and no capability).
	// networkPolicy {} with Managed management: the controller's shared
	// NetworkPolicy selects the template's Pods for Ingress and Egress
	// and allows nothing (left out, agent-sandbox's default would allow
	// public egress).
	no, yes := false, true
	template := map[string]any{
		"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxTemplate",
		"metadata": map[string]any{"name": "tight", "namespace": "default"},
		"spec": map[string]any{
			"networkPolicyManagement": "Managed",
			"networkPolicy":           map[string]any{},
			"service":                 false,
			"podTemplate": map[string]any{"spec": map[string]any{
				"automountServiceAccountToken":  no,
				"enableServiceLinks":            no,
				"terminationGracePeriodSeconds": 1,
				"securityContext": map[string]any{
					"runAsNonRoot": yes, "runAsUser": 65534, "runAsGroup": 65534,
					"seccompProfile": map[string]any{"type": "RuntimeDefault"},
				},
				"containers": []any{map[string]any{
					"name": "sandbox", "image": PauseImage, "imagePullPolicy": "Never",
					"securityContext": map[string]any{
						"allowPrivilegeEscalation": no, "privileged": no, "readOnlyRootFilesystem": yes,
						"capabilities": map[string]any{"drop": []string{"ALL"}},
					},
				}},
			}},
		},
	}
	if err := c.Do(ctx, http.MethodPost, extensionsPath+"sandboxtemplates", template, nil); err != nil {
		t.Fatalf("SandboxTemplate: %v", err)
	}
	var tmpl asObject
	if err := c.Get(ctx, extensionsPath+"sandboxtemplates/tight", &tmpl); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the template's deny-all NetworkPolicy", func() error {
		nps, err := ownedBy(ctx, c, "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies", "SandboxTemplate/tight")
		if err != nil {
			return err
		}
		if len(nps) != 1 {
			return fmt.Errorf("the template's NetworkPolicies: %+v", nps)
		}
		np := nps[0]
		if !slices.Equal(np.Spec.PolicyTypes, []string{"Ingress", "Egress"}) || len(np.Spec.Ingress) > 0 || len(np.Spec.Egress) > 0 {
			return fmt.Errorf("NetworkPolicy %s allows something: %+v", np.Metadata.Name, np.Spec)
		}
		return nil
	})

	t1 := time.Now()
	if err := c.Do(ctx, http.MethodPost, extensionsPath+"sandboxwarmpools", map[string]any{
		"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool",
		"metadata": map[string]any{"name": "tight-pool", "namespace": "default"},
		"spec":     map[string]any{"replicas": 1, "sandboxTemplateRef": map[string]any{"name": "tight"}},
	}, nil); err != nil {
		t.Fatalf("SandboxWarmPool: %v", err)
	}
	var warm, warmPod asObject
	eventually(t, 2*time.Minute, "a Ready warm Pod", func() (err error) {
		warm, warmPod, err = warmSandbox(ctx, c, "tight-pool")
		return err
	})
	t.Logf("warm pool of 1 to a Ready Pod: %s (sandbox %s)", time.Since(t1).Round(time.Millisecond), warm.Metadata.Name)
	if warmPod.Status.Phase != "Running" {
		t.Errorf("warm Pod phase %q", warmPod.Status.Phase)
	}
	sc := warmPod.Spec.SecurityContext
	if sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.SeccompProfile.Type != "RuntimeDefault" {
		t.Errorf("the warm Pod is not the template's tight Pod: %+v", warmPod.Spec)
	}
	if a := warmPod.Spec.AutomountServiceAccountToken; a == nil || *a {
		t.Errorf("the warm Pod mounts a service-account token: %+v", warmPod.Spec)
	}
	for _, v := range warmPod.Spec.Volumes {
		if strings.HasPrefix(v.Name, "kube-api-access") {
			t.Errorf("the warm Pod has the token volume %s", v.Name)
		}
	}

	// The claim is bound to the warm sandbox: the same Pod (its UID), now
	// the claim's.
	t2 := time.Now()
	if err := c.Do(ctx, http.MethodPost, extensionsPath+"sandboxclaims", map[string]any{
		"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
		"metadata": map[string]any{"name": "claim-1", "namespace": "default"},
		"spec":     map[string]any{"warmPoolRef": map[string]any{"name": "tight-pool"}},
	}, nil); err != nil {
		t.Fatalf("SandboxClaim: %v", err)
	}
	var claim asObject
	deadline := time.Now().Add(time.Minute)
	for {
		err := c.Get(ctx, extensionsPath+"sandboxclaims/claim-1", &claim)
		if err == nil && claim.ready() && claim.Status.Sandbox.Name != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("claim not Ready within 1m: %v %+v\n%s", err, claim.Status, c.LogTail(AgentSandboxController, 3000))
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("claim to bound and Ready: %s (sandbox %s)", time.Since(t2).Round(time.Millisecond), claim.Status.Sandbox.Name)
	if claim.Status.Sandbox.Name != warm.Metadata.Name {
		t.Fatalf("the claim got sandbox %s, not the warm %s", claim.Status.Sandbox.Name, warm.Metadata.Name)
	}
	var sb asObject
	if err := c.Get(ctx, sandboxesPath+"/"+warm.Metadata.Name, &sb); err != nil {
		t.Fatal(err)
	}
	if got := sb.controller(); got != "SandboxClaim/claim-1" {
		t.Errorf("the bound sandbox's controller is %q, want the claim", got)
	}
	pods, err := ownedBy(ctx, c, "/api/v1/namespaces/default/pods", "Sandbox/"+warm.Metadata.Name)
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != 1 || pods[0].Metadata.UID != warmPod.Metadata.UID {
		t.Errorf("the claimed sandbox's Pods are %+v, want the warm Pod %s", pods, warmPod.Metadata.UID)
	}

	// The pool refills with another sandbox.
	var refill asObject
	eventually(t, 2*time.Minute, "the pool refilled", func() (err error) {
		refill, _, err = warmSandbox(ctx, c, "tight-pool")
		return err
	})
	t.Logf("claim to the pool refilled: %s (sandbox %s)", time.Since(t2).Round(time.Millisecond), refill.Metadata.Name)
	if refill.Metadata.Name == warm.Metadata.Name {
		t.Errorf("the pool still counts the claimed sandbox %s", warm.Metadata.Name)
	}

	// Deleting the claim deletes its sandbox and its Pod; the pool's
	// sandbox is all that is left.
	t3 := time.Now()
	deleteAndWait(ctx, t, c, extensionsPath+"sandboxclaims/claim-1")
	waitGone(ctx, t, c, sandboxesPath+"/"+warm.Metadata.Name)
	eventually(t, 2*time.Minute, "the claimed Pod gone", func() error {
		var list struct{ Items []asObject }
		if err := c.Get(ctx, "/api/v1/namespaces/default/pods", &list); err != nil {
			return err
		}
		for _, p := range list.Items {
			if p.Metadata.UID == warmPod.Metadata.UID {
				return errors.New("pod " + p.Metadata.Name + " still there")
			}
		}
		return nil
	})
	t.Logf("claim delete to its sandbox and Pod gone: %s", time.Since(t3).Round(time.Millisecond))
	var sbs struct{ Items []asObject }
	if err := c.Get(ctx, sandboxesPath, &sbs); err != nil {
		t.Fatal(err)
	}
	if len(sbs.Items) != 1 || sbs.Items[0].Metadata.Name != refill.Metadata.Name {
		t.Errorf("sandboxes left beside the pool's %s: %+v", refill.Metadata.Name, sbs.Items)
	}
	// The controller's ClusterRoles, as the module ships them, bound to
	// its user, let it do all of this.
	if log := c.LogTail(AgentSandboxController, 1<<20); strings.Contains(log, "forbidden") {
		t.Errorf("the controller was refused something:\n%s", log)
	}
	for _, kind := range []string{"persistentvolumeclaims", "services"} {
		var list struct{ Items []asObject }
		if err := c.Get(ctx, "/api/v1/namespaces/default/"+kind, &list); err != nil {
			t.Fatal(err)
		}
		for _, o := range list.Items {
			if o.Metadata.Name != "kubernetes" {
				t.Errorf("%s left: %s (%s)", kind, o.Metadata.Name, o.controller())
			}
		}
	}
}
