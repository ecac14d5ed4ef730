//go:build kubernetes

package kubernetes

import (
	"fmt"
	"maps"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/yaml"

	"github.com/oac/sandbox-agent/host/provider"
)

// WarmPod is the Pod the provider makes for a sandbox, as a pool keeps it
// warm before any session claims it (agent-sandbox's SandboxTemplate):
// podSpec's Pod for the provider's flags (image, pull policy, resources,
// seccomp and AppArmor profiles, RuntimeClass, the agent's command line
// and transport), hostUsers false when userNamespaces (no cluster is
// asked here, so the caller says what its nodes support), and only the
// labels and annotations that are not one sandbox's.
//
// Left out, because a sandbox has them only once a session claims it:
//   - its name: the Pod's name (oac-NAME) and the label oac.dev/sandbox
//     (agent-sandbox names the Pod after its Sandbox), and the hostname
//     a spec asks for;
//   - the annotation oac.dev/holder, the host whose shim runs it: a warm
//     Pod is the pool's, and without a holder and a name no shim's sweep
//     takes it for a leftover of its own;
//   - a kept sandbox's claim: a warm Pod is a throwaway sandbox's;
//   - the namespace: the template's.
//
// No secret or token is left out, because the bare Pod holds none
// either: the agent waits on its socket (unix+listen) knowing nothing of
// its sandbox, and the shim that claims the Pod reaches it as it reaches
// a bare one (pods/exec of oac-guest bridge) and sends the bootstrap,
// with the sandbox's name, policy and credentials, over that session.
func (p *Provider) WarmPod(userNamespaces bool) (corev1.PodTemplateSpec, error) {
	if err := p.checkFlags(); err != nil {
		return corev1.PodTemplateSpec{}, err
	}
	if p.Image == "" {
		return corev1.PodTemplateSpec{}, fmt.Errorf("%w: kubernetes: no guest image given for the warm Pod (--k8s-image IMAGE: oac-image build's OCI image, pushed to a registry the nodes pull from)", provider.ErrInvalidSpec)
	}
	c, err := p.flagConfig()
	if err != nil {
		return corev1.PodTemplateSpec{}, fmt.Errorf("%w: %v", provider.ErrInvalidSpec, err)
	}
	c.UserNamespaces = userNamespaces
	return warmPod(c), nil
}

// warmPod is podSpec's Pod for c less what is one sandbox's (WarmPod says
// what): c's name, hostname, holder and kept are not used.
func warmPod(c podConfig) corev1.PodTemplateSpec {
	c.Name, c.Namespace, c.Holder, c.Hostname, c.Kept = "", "", "", "", false
	pod := podSpec(c)
	var t corev1.PodTemplateSpec
	t.Labels = maps.Clone(pod.Labels)
	delete(t.Labels, LabelSandbox)
	t.Annotations = maps.Clone(pod.Annotations)
	delete(t.Annotations, AnnotationHolder)
	if len(t.Annotations) == 0 {
		t.Annotations = nil
	}
	t.Spec = pod.Spec
	return t
}

// agent-sandbox's extensions (sigs.k8s.io/agent-sandbox v1.0.1) as this
// package writes them. Its Go module is not imported: its requirements'
// versions differ from this module's. The fields below were checked
// against v1.0.1's CRDs sandboxtemplates.extensions.agents.x-k8s.io and
// sandboxwarmpools.extensions.agents.x-k8s.io (k8s/crds in the module),
// version v1beta1, the only one they serve and store.
const (
	AgentSandboxAPIVersion = "extensions.agents.x-k8s.io/v1beta1"
	KindSandboxTemplate    = "SandboxTemplate"
	KindSandboxWarmPool    = "SandboxWarmPool"
)

// AgentSandboxMeta is the metadata of an agent-sandbox object.
type AgentSandboxMeta struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace,omitempty"`
}

// SandboxTemplate is agent-sandbox's SandboxTemplate, with the fields the
// provider sets.
type SandboxTemplate struct {
	APIVersion string              `json:"apiVersion"`
	Kind       string              `json:"kind"`
	Metadata   AgentSandboxMeta    `json:"metadata"`
	Spec       SandboxTemplateSpec `json:"spec"`
}

// SandboxTemplateSpec is a SandboxTemplate's spec.
type SandboxTemplateSpec struct {
	PodTemplate SandboxPodTemplate `json:"podTemplate"`
	// Service false: no headless Service; the session reaches the Pod
	// through the API server, never its network.
	Service *bool `json:"service"`
	// NetworkPolicyManagement Managed and a NetworkPolicy without a rule:
	// the controller's shared NetworkPolicy selects the template's Pods
	// for Ingress and Egress and allows nothing. A nil NetworkPolicy would
	// get agent-sandbox's default instead, which allows public egress, so
	// the field has no omitempty.
	NetworkPolicyManagement string                `json:"networkPolicyManagement"`
	NetworkPolicy           *SandboxNetworkPolicy `json:"networkPolicy"`
	// EnvVarsInjectionPolicy Disallowed (agent-sandbox's default, said
	// here): a claim cannot put variables into the Pod; what a sandbox is
	// told travels in the bootstrap, and credentials never in env.
	EnvVarsInjectionPolicy string `json:"envVarsInjectionPolicy"`
}

// SandboxPodTemplate is a template's Pod: agent-sandbox uses only the
// labels and annotations of its metadata.
type SandboxPodTemplate struct {
	Metadata SandboxPodMetadata `json:"metadata"`
	Spec     corev1.PodSpec     `json:"spec"`
}

// SandboxPodMetadata is what a template's Pod's metadata may hold.
type SandboxPodMetadata struct {
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// SandboxNetworkPolicy is the template's policy: its rules are what it
// allows, none when both are empty.
type SandboxNetworkPolicy struct {
	Ingress []networkingv1.NetworkPolicyIngressRule `json:"ingress,omitempty"`
	Egress  []networkingv1.NetworkPolicyEgressRule  `json:"egress,omitempty"`
}

// SandboxWarmPool is agent-sandbox's SandboxWarmPool.
type SandboxWarmPool struct {
	APIVersion string              `json:"apiVersion"`
	Kind       string              `json:"kind"`
	Metadata   AgentSandboxMeta    `json:"metadata"`
	Spec       SandboxWarmPoolSpec `json:"spec"`
}

// SandboxWarmPoolSpec is a pool's spec: how many warm sandboxes of which
// template it keeps.
type SandboxWarmPoolSpec struct {
	Replicas           int32              `json:"replicas"`
	SandboxTemplateRef SandboxTemplateRef `json:"sandboxTemplateRef"`
}

// SandboxTemplateRef names a SandboxTemplate of the pool's namespace.
type SandboxTemplateRef struct {
	Name string `json:"name"`
}

// SandboxTemplate is a template named name of the provider's warm Pod
// (WarmPod), without a Service and with a NetworkPolicy that denies its
// Pods all ingress and egress.
func (p *Provider) SandboxTemplate(name string, userNamespaces bool) (*SandboxTemplate, error) {
	pod, err := p.WarmPod(userNamespaces)
	if err != nil {
		return nil, err
	}
	no := false
	return &SandboxTemplate{
		APIVersion: AgentSandboxAPIVersion, Kind: KindSandboxTemplate,
		Metadata: AgentSandboxMeta{Name: name},
		Spec: SandboxTemplateSpec{
			PodTemplate:             SandboxPodTemplate{Metadata: SandboxPodMetadata{Labels: pod.Labels, Annotations: pod.Annotations}, Spec: pod.Spec},
			Service:                 &no,
			NetworkPolicyManagement: "Managed",
			NetworkPolicy:           &SandboxNetworkPolicy{},
			EnvVarsInjectionPolicy:  "Disallowed",
		},
	}, nil
}

// WarmPoolManifest is agent-sandbox's SandboxTemplate named template for
// the provider's flags and a SandboxWarmPool named pool that keeps
// replicas of it warm, as YAML documents in the order to apply them (the
// template first: a pool whose template is missing makes nothing). Its
// Pods use user namespaces (hostUsers: false) only with
// --k8s-user-namespaces require: whether the nodes have them is the
// cluster's to say, and no cluster is asked here.
func (p *Provider) WarmPoolManifest(template, pool string, replicas int32) ([]byte, error) {
	if replicas < 0 {
		return nil, fmt.Errorf("%w: a warm pool of %d sandboxes", provider.ErrInvalidSpec, replicas)
	}
	tmpl, err := p.SandboxTemplate(template, p.UserNamespaces == "require")
	if err != nil {
		return nil, err
	}
	tb, err := yaml.Marshal(tmpl)
	if err != nil {
		return nil, err
	}
	pb, err := yaml.Marshal(WarmPool(pool, template, replicas))
	if err != nil {
		return nil, err
	}
	return append(append(tb, "---\n"...), pb...), nil
}

// WarmPool is a pool named name that keeps replicas warm sandboxes of the
// template.
func WarmPool(name, template string, replicas int32) *SandboxWarmPool {
	return &SandboxWarmPool{
		APIVersion: AgentSandboxAPIVersion, Kind: KindSandboxWarmPool,
		Metadata: AgentSandboxMeta{Name: name},
		Spec:     SandboxWarmPoolSpec{Replicas: replicas, SandboxTemplateRef: SandboxTemplateRef{Name: template}},
	}
}
