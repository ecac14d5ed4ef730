//go:build kubernetes

package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"

	"github.com/oac/sandbox-agent/host/provider"
)

// The ways to make a sandbox's Pod (--k8s-api).
const (
	// APIPods: one bare Pod per sandbox, made by the provider.
	APIPods = "pods"
	// APIAgentSandbox: a SandboxClaim on a SandboxWarmPool of
	// agent-sandbox (sigs.k8s.io/agent-sandbox), whose controller binds
	// it to a warm Pod of the pool's template, or makes one when the pool
	// has none ready.
	APIAgentSandbox = "agent-sandbox"
)

// agent-sandbox's resources (v1.0.1, the only version it serves).
var (
	claimsGVR    = schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxclaims"}
	poolsGVR     = schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxwarmpools"}
	templatesGVR = schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxtemplates"}
	sandboxesGVR = schema.GroupVersionResource{Group: "agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxes"}
)

const (
	KindSandboxClaim = "SandboxClaim"
	// sandboxPodNameAnnotation names a Sandbox's Pod where it is not
	// the Sandbox's own name (a Pod adopted from an older warm pool).
	sandboxPodNameAnnotation = "agents.x-k8s.io/pod-name"
	// bindTimeout bounds the wait for the controller to bind a claim.
	bindTimeout = 60 * time.Second
)

// viaClaim reports whether a sandbox of spec is a SandboxClaim: with
// --k8s-api agent-sandbox, for every sandbox but a kept one, whose Pod
// mounts its own PersistentVolumeClaim, which a warm Pod made before any
// claim cannot (docs/kubernetes.md#agent-sandbox).
func (p *Provider) viaClaim(spec provider.Spec) bool {
	return p.API == APIAgentSandbox && spec.Keep == nil
}

// checkAgentSandbox finds agent-sandbox's extensions served, the warm
// pool, and its template one of oac's whose NetworkPolicy denies all
// traffic: a template without one gets agent-sandbox's default, which
// allows public egress. Errors wrap ErrUnavailable and say what to do.
func checkAgentSandbox(ctx context.Context, c *cluster, pool string) error {
	res, err := c.cs.Discovery().ServerResourcesForGroupVersion(claimsGVR.GroupVersion().String())
	found := false
	if err == nil {
		for _, r := range res.APIResources {
			found = found || r.Name == claimsGVR.Resource
		}
	}
	if !found {
		return fmt.Errorf("%w: kubernetes: the cluster at %s does not serve agent-sandbox's SandboxClaims (%s): install agent-sandbox with its extensions, or leave out --k8s-api agent-sandbox for one bare Pod per sandbox", provider.ErrUnavailable, c.server, claimsGVR.GroupVersion())
	}
	p, err := c.dyn.Resource(poolsGVR).Namespace(c.namespace).Get(ctx, pool, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("%w: kubernetes: no SandboxWarmPool %s in namespace %s: apply one (examples/kubernetes/sandbox-template.yaml, or oac-shim's SandboxTemplate for your flags) or name another with --k8s-warm-pool", provider.ErrUnavailable, pool, c.namespace)
		}
		return fmt.Errorf("%w: kubernetes: read SandboxWarmPool %s in namespace %s: %v (grant the Role in docs/kubernetes.md)", provider.ErrUnavailable, pool, c.namespace, err)
	}
	tname, _, _ := unstructured.NestedString(p.Object, "spec", "sandboxTemplateRef", "name")
	t, err := c.dyn.Resource(templatesGVR).Namespace(c.namespace).Get(ctx, tname, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("%w: kubernetes: SandboxWarmPool %s's template %q in namespace %s: %v", provider.ErrUnavailable, pool, tname, c.namespace, err)
	}
	return checkTemplate(t.Object, tname)
}

// checkTemplate refuses a template that is not an oac guest's or whose
// Pods may reach anything.
func checkTemplate(t map[string]any, name string) error {
	managedBy, _, _ := unstructured.NestedString(t, "spec", "podTemplate", "metadata", "labels", LabelManagedBy)
	if managedBy != ManagedBy {
		return fmt.Errorf("%w: kubernetes: SandboxTemplate %s is not an oac guest's (its Pods lack the label %s=%s): make it from oac-shim's SandboxTemplate (examples/kubernetes/sandbox-template.yaml)", provider.ErrUnavailable, name, LabelManagedBy, ManagedBy)
	}
	mgmt, _, _ := unstructured.NestedString(t, "spec", "networkPolicyManagement")
	np, has, _ := unstructured.NestedMap(t, "spec", "networkPolicy")
	if mgmt == "Unmanaged" || !has || len(np) != 0 {
		return fmt.Errorf("%w: kubernetes: SandboxTemplate %s lets its Pods reach the network (networkPolicyManagement %q, networkPolicy %v; agent-sandbox's default allows public egress): give it networkPolicyManagement: Managed and networkPolicy: {}, as examples/kubernetes/sandbox-template.yaml does", provider.ErrUnavailable, name, mgmt, np)
	}
	return nil
}

// sandboxClaim is the claim of a sandbox: its labels and holder as every
// object of the provider carries them, on the pool. Deleting it deletes
// its Sandbox and the Sandbox's Pod (ShutdownPolicy Delete).
func sandboxClaim(name, namespace, holder, pool string) *unstructured.Unstructured {
	meta := objectMeta(ObjectName(name), namespace, name, holder, false)
	labels := map[string]any{}
	for k, v := range meta.Labels {
		labels[k] = v
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": claimsGVR.GroupVersion().String(), "kind": KindSandboxClaim,
		"metadata": map[string]any{
			"name": meta.Name, "namespace": namespace, "labels": labels,
			"annotations": map[string]any{AnnotationHolder: holder},
		},
		"spec": map[string]any{
			"warmPoolRef": map[string]any{"name": pool},
			"lifecycle":   map[string]any{"shutdownPolicy": "Delete"},
		},
	}}
}

// startClaim makes the sandbox's claim and waits until the controller
// binds it to a Sandbox; the Pod is that Sandbox's. It returns the Pod's
// name.
func (in *Instance) startClaim(ctx context.Context) (string, error) {
	claims := in.c.dyn.Resource(claimsGVR).Namespace(in.c.namespace)
	made, err := claims.Create(ctx, sandboxClaim(in.spec.Name, in.c.namespace, in.cfg.Holder, in.p.WarmPool), metav1.CreateOptions{})
	if err != nil {
		return "", in.apiErr("make the sandbox's SandboxClaim", err)
	}
	in.mu.Lock()
	in.claimUID = made.GetUID()
	in.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, bindTimeout)
	defer cancel()
	sb, err := in.waitBound(ctx, made)
	if err != nil {
		return "", err
	}
	sandbox, err := in.c.dyn.Resource(sandboxesGVR).Namespace(in.c.namespace).Get(ctx, sb, metav1.GetOptions{})
	if err != nil {
		return "", in.apiErr("read the claim's Sandbox "+sb, err)
	}
	if !claimOwns(sandbox, made.GetUID()) {
		return "", fmt.Errorf("%w: kubernetes: SandboxClaim %s/%s names Sandbox %s, which it does not own: is another controller changing sandboxes?", provider.ErrUnavailable, in.c.namespace, made.GetName(), sb)
	}
	in.mu.Lock()
	in.sandbox = sb
	in.mu.Unlock()
	return podOf(sandbox), nil
}

// waitBound waits until the claim names its Sandbox, failing at once on
// a claim the controller refused.
func (in *Instance) waitBound(ctx context.Context, claim *unstructured.Unstructured) (string, error) {
	claims := in.c.dyn.Resource(claimsGVR).Namespace(in.c.namespace)
	name := claim.GetName()
	for {
		if sb, err := bound(claim); sb != "" || err != nil {
			return sb, err
		}
		w, err := claims.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String(), ResourceVersion: claim.GetResourceVersion()})
		if err != nil {
			return "", in.waitErr(ctx, err)
		}
		for ev := range w.ResultChan() {
			if ev.Type == watch.Deleted {
				w.Stop()
				return "", fmt.Errorf("%w: kubernetes: the sandbox's SandboxClaim %s/%s was deleted before it was bound", provider.ErrUnavailable, in.c.namespace, name)
			}
			if u, ok := ev.Object.(*unstructured.Unstructured); ok && ev.Type != watch.Error {
				if sb, err := bound(u); sb != "" || err != nil {
					w.Stop()
					return sb, err
				}
			}
		}
		w.Stop()
		if ctx.Err() != nil {
			return "", in.waitErr(ctx, ctx.Err())
		}
		// The watch ended (a timeout of the server's): read it afresh.
		if claim, err = claims.Get(ctx, name, metav1.GetOptions{}); err != nil {
			return "", in.waitErr(ctx, err)
		}
	}
}

func (in *Instance) waitErr(ctx context.Context, err error) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%w: kubernetes: agent-sandbox's controller did not bind SandboxClaim %s/%s within %s: is it running, with its extensions (--extensions)?", provider.ErrUnavailable, in.c.namespace, ObjectName(in.spec.Name), bindTimeout)
	}
	return in.apiErr("wait for the SandboxClaim to be bound", err)
}

// bound is the Sandbox a claim's status names, or why the controller
// will not bind it.
func bound(claim *unstructured.Unstructured) (string, error) {
	sb, _, _ := unstructured.NestedString(claim.Object, "status", "sandbox", "name")
	if sb != "" {
		return sb, nil
	}
	conds, _, _ := unstructured.NestedSlice(claim.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Ready" && m["status"] == "False" && (m["reason"] == "TemplateNotFound" || m["reason"] == "InvalidMetadata" || m["reason"] == "WarmPoolNotFound") {
			return "", fmt.Errorf("%w: kubernetes: agent-sandbox refused SandboxClaim %s: %v: %v", provider.ErrUnavailable, claim.GetName(), m["reason"], m["message"])
		}
	}
	return "", nil
}

// deleteSandboxClaim deletes the sandbox's claim uid. Its Sandbox, and
// the Sandbox's Pod, are the garbage collector's to delete once it is
// gone (they are the claim's, and the Sandbox's, by owner reference).
// Not in the foreground: the collector's retries of an owner that waits
// for its dependents back off to seconds (a stop took 24 s so).
func (in *Instance) deleteSandboxClaim(ctx context.Context, uid types.UID) error {
	bg := metav1.DeletePropagationBackground
	err := in.c.dyn.Resource(claimsGVR).Namespace(in.c.namespace).Delete(ctx, ObjectName(in.spec.Name), metav1.DeleteOptions{PropagationPolicy: &bg, Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return in.apiErr("delete the sandbox's SandboxClaim", err)
	}
	return nil
}

// removeSandboxClaimAndWait deletes the claim uid and waits until it, the
// Sandbox it was bound to (sandbox, "" when none) and that Sandbox's Pod
// are gone.
func (in *Instance) removeSandboxClaimAndWait(ctx context.Context, uid types.UID, sandbox string) error {
	claims := in.c.dyn.Resource(claimsGVR).Namespace(in.c.namespace)
	if sandbox == "" {
		// Bound since the shim last looked (a stop during the wait)?
		if c, err := claims.Get(ctx, ObjectName(in.spec.Name), metav1.GetOptions{}); err == nil && c.GetUID() == uid {
			sandbox, _, _ = unstructured.NestedString(c.Object, "status", "sandbox", "name")
		}
	}
	sandboxes := in.c.dyn.Resource(sandboxesGVR).Namespace(in.c.namespace)
	pods := in.c.cs.CoreV1().Pods(in.c.namespace)
	var sbUID types.UID
	pod := ""
	if sandbox != "" {
		sb, err := sandboxes.Get(ctx, sandbox, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			sandbox = ""
		case err != nil:
			return in.apiErr("read the claim's Sandbox "+sandbox, err)
		case !claimOwns(sb, uid):
			sandbox = "" // not this claim's: never touched
		default:
			sbUID, pod = sb.GetUID(), podOf(sb)
		}
	}
	if err := in.deleteSandboxClaim(ctx, uid); err != nil {
		return err
	}
	// The garbage collector would delete the Sandbox, then its Pod, but
	// it noticed the claim gone 20 s late on the test cluster: the shim
	// deletes both itself, the claim first so that its controller makes
	// no other Sandbox, and each with its UID as precondition.
	if sandbox != "" {
		err := sandboxes.Delete(ctx, sandbox, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &sbUID}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return in.apiErr("delete the claim's Sandbox "+sandbox, err)
		}
		if p, err := pods.Get(ctx, pod, metav1.GetOptions{}); err == nil && controlledByUID(p.OwnerReferences, sbUID) {
			grace := in.cfg.GracePeriodSeconds
			err := pods.Delete(ctx, pod, metav1.DeleteOptions{GracePeriodSeconds: &grace, Preconditions: &metav1.Preconditions{UID: &p.UID}})
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return in.apiErr("delete the claimed Pod "+pod, err)
			}
		}
	}
	return waitGone(ctx, func(ctx context.Context) (bool, error) {
		c, err := claims.Get(ctx, ObjectName(in.spec.Name), metav1.GetOptions{})
		if err == nil && c.GetUID() == uid || err != nil && !apierrors.IsNotFound(err) {
			return false, err
		}
		if sandbox == "" {
			return true, nil
		}
		sb, err := sandboxes.Get(ctx, sandbox, metav1.GetOptions{})
		if err == nil && sb.GetUID() == sbUID || err != nil && !apierrors.IsNotFound(err) {
			return false, err
		}
		p, err := pods.Get(ctx, pod, metav1.GetOptions{})
		if err == nil && controlledByUID(p.OwnerReferences, sbUID) || err != nil && !apierrors.IsNotFound(err) {
			return false, err
		}
		return true, nil
	}, "the sandbox's SandboxClaim "+ObjectName(in.spec.Name)+" with its Sandbox and Pod")
}

// claimOwns reports whether the claim uid controls the object.
func claimOwns(obj *unstructured.Unstructured, uid types.UID) bool {
	return controlledByUID(obj.GetOwnerReferences(), uid)
}

// controlledByUID reports whether refs name the controller uid.
func controlledByUID(refs []metav1.OwnerReference, uid types.UID) bool {
	for _, r := range refs {
		if r.Controller != nil && *r.Controller && r.UID == uid {
			return true
		}
	}
	return false
}

// podOf is the name of a Sandbox's Pod.
func podOf(sandbox *unstructured.Unstructured) string {
	if n := sandbox.GetAnnotations()[sandboxPodNameAnnotation]; n != "" {
		return n
	}
	return sandbox.GetName()
}

// removeLeftoverClaim removes the claim a killed shim of this host left
// of the sandbox, and refuses one oac did not make or another host's
// shim holds.
func (in *Instance) removeLeftoverClaim(ctx context.Context) error {
	have, err := in.c.dyn.Resource(claimsGVR).Namespace(in.c.namespace).Get(ctx, ObjectName(in.spec.Name), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return in.apiErr("look for a leftover SandboxClaim", err)
	case !owned(metav1.ObjectMeta{Labels: have.GetLabels()}, in.spec.Name):
		return fmt.Errorf("%w: kubernetes: a SandboxClaim %s/%s exists that oac did not make for this sandbox: remove or rename it", provider.ErrExists, in.c.namespace, have.GetName())
	case have.GetAnnotations()[AnnotationHolder] != in.cfg.Holder:
		return fmt.Errorf("%w: kubernetes: sandbox %s runs in namespace %s from host %s: stop it there, or use another name", provider.ErrExists, in.spec.Name, in.c.namespace, have.GetAnnotations()[AnnotationHolder])
	}
	sb, _, _ := unstructured.NestedString(have.Object, "status", "sandbox", "name")
	return in.removeSandboxClaimAndWait(ctx, have.GetUID(), sb)
}

// sweepClaims removes the claims of this holder's sandboxes that no shim
// runs (their Lease is gone, released or long unrenewed), as sweep does
// for bare Pods.
func (p *Provider) sweepClaims(ctx context.Context, c *cluster, self string) {
	list, err := c.dyn.Resource(claimsGVR).Namespace(c.namespace).List(ctx, metav1.ListOptions{LabelSelector: selector("")})
	if err != nil {
		return
	}
	holder := p.holder()
	bg := metav1.DeletePropagationBackground
	for _, cl := range list.Items {
		name := cl.GetLabels()[LabelSandbox]
		if name == self || cl.GetAnnotations()[AnnotationHolder] != holder || !provider.ValidName(name) {
			continue
		}
		d, err := p.idle(ctx, c, name)
		if err != nil {
			continue // a shim runs it, or we cannot tell
		}
		uid := cl.GetUID()
		_ = c.dyn.Resource(claimsGVR).Namespace(c.namespace).Delete(ctx, cl.GetName(), metav1.DeleteOptions{PropagationPolicy: &bg, Preconditions: &metav1.Preconditions{UID: &uid}})
		d.Release()
	}
}

// newDynamic is the client of agent-sandbox's resources.
func newDynamic(c *cluster) (dynamic.Interface, error) {
	return dynamic.NewForConfig(c.cfg)
}
