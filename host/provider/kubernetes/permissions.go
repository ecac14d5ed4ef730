//go:build kubernetes

package kubernetes

import (
	"context"
	"fmt"
	"strings"
	"sync"

	authv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/oac/sandbox-agent/host/provider"
)

// permission is one verb on one resource the provider uses, as
// examples/kubernetes/role.yaml grants it (a test holds the two equal).
type permission struct {
	group, resource, verb string
	// need: "" always, "pods" for bare Pods (every sandbox without --k8s-api
	// agent-sandbox, and kept ones with it), "claims" for SandboxClaims,
	// "kept" for kept sandboxes, "log" only for the agent's log (a run goes
	// on without it).
	need string
}

// permissions are every verb the provider uses, in the Role's order.
var permissions = []permission{
	{"", "pods", "create", "pods"}, {"", "pods", "get", ""}, {"", "pods", "list", ""}, {"", "pods", "watch", ""}, {"", "pods", "delete", ""},
	// WebSocket exec is a GET the server also checks as a create; SPDY a
	// POST.
	{"", "pods/exec", "create", ""}, {"", "pods/exec", "get", ""},
	{"", "pods/log", "get", "log"},
	{"networking.k8s.io", "networkpolicies", "create", "pods"}, {"networking.k8s.io", "networkpolicies", "get", "pods"},
	{"networking.k8s.io", "networkpolicies", "patch", "pods"}, {"networking.k8s.io", "networkpolicies", "delete", "pods"},
	// The name's lock (lease.go), bare Pod or claim.
	{"coordination.k8s.io", "leases", "create", ""}, {"coordination.k8s.io", "leases", "get", ""},
	{"coordination.k8s.io", "leases", "update", ""}, {"coordination.k8s.io", "leases", "delete", ""},
	{"", "persistentvolumeclaims", "create", "kept"}, {"", "persistentvolumeclaims", "get", "kept"}, {"", "persistentvolumeclaims", "delete", "kept"},
	{"extensions.agents.x-k8s.io", "sandboxclaims", "create", "claims"}, {"extensions.agents.x-k8s.io", "sandboxclaims", "get", "claims"},
	{"extensions.agents.x-k8s.io", "sandboxclaims", "list", "claims"}, {"extensions.agents.x-k8s.io", "sandboxclaims", "watch", "claims"},
	{"extensions.agents.x-k8s.io", "sandboxclaims", "delete", "claims"},
	{"extensions.agents.x-k8s.io", "sandboxwarmpools", "get", "claims"}, {"extensions.agents.x-k8s.io", "sandboxtemplates", "get", "claims"},
	{"agents.x-k8s.io", "sandboxes", "get", "claims"}, {"agents.x-k8s.io", "sandboxes", "delete", "claims"},
}

func (p permission) String() string {
	r := p.resource
	if p.group != "" {
		r += "." + p.group
	}
	return p.verb + " " + r
}

// missing asks the API server (SelfSubjectAccessReview, which every
// authenticated user may) which of the permissions the caller lacks in
// the namespace.
func missing(ctx context.Context, c *cluster, want func(permission) bool) ([]permission, error) {
	var (
		mu   sync.Mutex
		out  []permission
		errs []error
		wg   sync.WaitGroup
	)
	for _, p := range permissions {
		if !want(p) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, sub, _ := strings.Cut(p.resource, "/")
			r, err := c.cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authv1.SelfSubjectAccessReview{
				Spec: authv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authv1.ResourceAttributes{
					Namespace: c.namespace, Verb: p.verb, Group: p.group, Resource: res, Subresource: sub,
				}},
			}, metav1.CreateOptions{})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				errs = append(errs, err)
			case !r.Status.Allowed:
				out = append(out, p)
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return nil, errs[0]
	}
	// In the table's order, whatever order the answers came in.
	var sorted []permission
	for _, p := range permissions {
		for _, m := range out {
			if m == p {
				sorted = append(sorted, p)
			}
		}
	}
	return sorted, nil
}

// checkPermissions refuses, before anything is made, a caller that lacks
// a permission the run needs (kept: a kept sandbox's too; claims: a
// SandboxClaim's instead of a bare Pod's), naming each. A server that
// cannot answer the review is not refused here: the calls themselves
// will say.
func checkPermissions(ctx context.Context, c *cluster, kept, claims bool) error {
	lack, err := missing(ctx, c, func(p permission) bool {
		switch p.need {
		case "":
			return true
		case "pods":
			return !claims
		case "claims":
			return claims
		case "kept":
			return kept
		}
		return false
	})
	if err != nil || len(lack) == 0 {
		return nil
	}
	var names []string
	for _, p := range lack {
		names = append(names, p.String())
	}
	return fmt.Errorf("%w: kubernetes: this user may not %s in namespace %s: grant the Role in docs/kubernetes.md (examples/kubernetes/role.yaml)",
		provider.ErrUnavailable, strings.Join(names, ", "), c.namespace)
}
