//go:build kubernetes

package kubernetes

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/oac/sandbox-agent/host/apparmor"
	"github.com/oac/sandbox-agent/host/provider"
)

var updateSandboxTemplate = flag.Bool("update-sandbox-template", false, "rewrite examples/kubernetes/sandbox-template.yaml from the provider's warm Pod")

// exampleTemplate is where the example lives, from this package.
var exampleTemplate = filepath.Join("..", "..", "..", "examples", "kubernetes", "sandbox-template.yaml")

// defaultProvider is the provider as oac-shim makes it from no flags.
func defaultProvider() *Provider {
	return provider.Declare(flag.NewFlagSet("t", flag.ContinueOnError))["kubernetes"]().(*Provider)
}

func TestTheWarmPodIsTheBarePodOfTheSameFlags(t *testing.T) {
	// testConfig is a sandbox of the default flags and this image.
	p := defaultProvider()
	p.Image = "reg/oac:1"
	warm, err := p.WarmPod(false)
	require.NoError(t, err)
	bare := podSpec(testConfig())
	assert.Equal(t, bare.Spec, warm.Spec, "one Pod, whichever way it is made")
	assert.Equal(t, warmPod(testConfig()), warm)

	p.AppArmor, p.Seccomp, p.RuntimeClass, p.Debug = apparmor.Name, "RuntimeDefault", "gvisor", true
	c := testConfig()
	c.AppArmor, c.Seccomp, c.RuntimeClass, c.Debug, c.UserNamespaces = apparmor.Name, "", "gvisor", true, true
	warm, err = p.WarmPod(true)
	require.NoError(t, err)
	assert.Equal(t, podSpec(c).Spec, warm.Spec)
}

func TestAWarmPodIsNoSandboxsYetSoNoShimTakesItForALeftover(t *testing.T) {
	c := testConfig()
	warm := warmPod(c)
	bare := podSpec(c)
	assert.Equal(t, map[string]string{LabelManagedBy: ManagedBy, LabelKept: "false"}, warm.Labels, "the provider's labels, not the sandbox's name")
	assert.Empty(t, warm.Annotations, "no holder: a warm Pod is the pool's")
	assert.Empty(t, warm.Name)
	assert.Empty(t, warm.Namespace)
	// What a shim's sweep and leftover checks need to take a Pod for
	// theirs, a sandbox's name and its host, only the bare Pod has.
	assert.True(t, owned(bare.ObjectMeta, "box"))
	assert.False(t, owned(warm.ObjectMeta, "box"))
	assert.True(t, provider.ValidName(bare.Labels[LabelSandbox]))
	assert.False(t, provider.ValidName(warm.Labels[LabelSandbox]), "the sweep passes over a Pod without a valid sandbox name")
	assert.Equal(t, "host-a", bare.Annotations[AnnotationHolder])
	assert.NotContains(t, warm.Annotations, AnnotationHolder)
	// Making the warm Pod leaves the configuration's own maps alone.
	assert.Equal(t, "box", podSpec(c).Labels[LabelSandbox])
}

func TestAWarmPodNeedsAnImageAndValidFlags(t *testing.T) {
	p := defaultProvider()
	_, err := p.WarmPod(false)
	assert.ErrorIs(t, err, provider.ErrInvalidSpec)
	assert.Contains(t, err.Error(), "--k8s-image")
	for _, bad := range []func(*Provider){
		func(p *Provider) { p.AppArmor = "unconfined" },
		func(p *Provider) { p.Limits = "cpu=lots" },
		func(p *Provider) { p.PullPolicy = "Sometimes" },
	} {
		p := defaultProvider()
		p.Image = "reg/oac:1"
		bad(p)
		_, err := p.WarmPod(false)
		assert.ErrorIs(t, err, provider.ErrInvalidSpec)
	}
}

func TestTheTemplatesNetworkPolicyDeniesAllFromItsFirstPod(t *testing.T) {
	p := defaultProvider()
	p.Image = "reg/oac:1"
	tmpl, err := p.SandboxTemplate("oac", false)
	require.NoError(t, err)
	assert.Equal(t, "Managed", tmpl.Spec.NetworkPolicyManagement, "the controller makes the policy with the template, before any pool's Pod")
	require.NotNil(t, tmpl.Spec.NetworkPolicy, "left out, agent-sandbox's default allows public egress")
	assert.Empty(t, tmpl.Spec.NetworkPolicy.Ingress, "no rule: nothing in")
	assert.Empty(t, tmpl.Spec.NetworkPolicy.Egress, "no rule: nothing out")
	require.NotNil(t, tmpl.Spec.Service)
	assert.False(t, *tmpl.Spec.Service, "no Service in front of the Pod")
	assert.Equal(t, "Disallowed", tmpl.Spec.EnvVarsInjectionPolicy)

	// As the API server reads it: networkPolicy present and empty.
	b, err := yaml.Marshal(tmpl)
	require.NoError(t, err)
	var obj struct {
		Spec map[string]any `json:"spec"`
	}
	require.NoError(t, yaml.Unmarshal(b, &obj))
	require.Contains(t, obj.Spec, "networkPolicy")
	assert.Equal(t, map[string]any{}, obj.Spec["networkPolicy"])
	assert.Equal(t, "Managed", obj.Spec["networkPolicyManagement"])
}

// exampleYAML is examples/kubernetes/sandbox-template.yaml as the code
// makes it: a template of the default flags with the AppArmor profile
// and user namespaces, and a warm pool of two of it.
func exampleYAML(t *testing.T) []byte {
	p := defaultProvider()
	p.Image, p.AppArmor, p.UserNamespaces = "registry.example.com/oac-guest:1", apparmor.Name, "require"
	manifest, err := p.WarmPoolManifest("oac", "oac-warm", 2)
	require.NoError(t, err)
	var out bytes.Buffer
	out.WriteString(`# Written by oac-shim-kubernetes warm-pool --k8s-image registry.example.com/oac-guest:1
#   --k8s-apparmor-profile oac-guest --k8s-user-namespaces require
# (go test -tags kubernetes ./host/provider/kubernetes -run TestTheExampleSandboxTemplate
# -update-sandbox-template rewrites it; do not edit). agent-sandbox (sigs.k8s.io/agent-sandbox
# v1.0.1, its controller run with --extensions) keeps two warm sandboxes of oac-shim's
# kubernetes Pod. Write your own with your flags, or put your image in; install
# examples/kubernetes/oac-seccomp.json and examples/apparmor/oac-guest on every node, and apply
# the template before the pool (docs/kubernetes.md#agent-sandbox). oac-shim run --k8s-api
# agent-sandbox --k8s-warm-pool oac-warm claims a Pod of it; the Pod knows nothing of its
# sandbox: the session that claims it sends the bootstrap.
`)
	out.Write(manifest)
	return out.Bytes()
}

// The example is the provider's warm Pod written out (go test -tags
// kubernetes ./host/provider/kubernetes -run TestTheExampleSandboxTemplate
// -update-sandbox-template rewrites it): never a copy by hand that can
// drift from the Pod the provider makes.
func TestTheExampleSandboxTemplateIsTheProvidersWarmPod(t *testing.T) {
	want := exampleYAML(t)
	if *updateSandboxTemplate {
		require.NoError(t, os.WriteFile(exampleTemplate, want, 0o644))
	}
	got, err := os.ReadFile(exampleTemplate)
	require.NoError(t, err, "go test -tags kubernetes ./host/provider/kubernetes -run TestTheExampleSandboxTemplate -update-sandbox-template writes it")
	assert.Equal(t, string(want), string(got), "examples/kubernetes/sandbox-template.yaml is out of date: go test -tags kubernetes ./host/provider/kubernetes -run TestTheExampleSandboxTemplate -update-sandbox-template")
}

func TestTheExamplesPoolKeepsTwoOfItsTemplate(t *testing.T) {
	b, err := os.ReadFile(exampleTemplate)
	require.NoError(t, err)
	docs := bytes.Split(b, []byte("\n---\n"))
	require.Len(t, docs, 2)
	var tmpl SandboxTemplate
	require.NoError(t, yaml.UnmarshalStrict(docs[0], &tmpl))
	var pool SandboxWarmPool
	require.NoError(t, yaml.UnmarshalStrict(docs[1], &pool))
	assert.Equal(t, AgentSandboxAPIVersion, tmpl.APIVersion)
	assert.Equal(t, KindSandboxTemplate, tmpl.Kind)
	assert.Equal(t, AgentSandboxAPIVersion, pool.APIVersion)
	assert.Equal(t, KindSandboxWarmPool, pool.Kind)
	assert.Equal(t, int32(2), pool.Spec.Replicas)
	assert.Equal(t, tmpl.Metadata.Name, pool.Spec.SandboxTemplateRef.Name)
	require.NotNil(t, tmpl.Spec.PodTemplate.Spec.SecurityContext.AppArmorProfile)
	assert.Equal(t, apparmor.Name, *tmpl.Spec.PodTemplate.Spec.SecurityContext.AppArmorProfile.LocalhostProfile)
	assert.Equal(t, DefaultSeccompProfile, *tmpl.Spec.PodTemplate.Spec.SecurityContext.SeccompProfile.LocalhostProfile)
	require.NotNil(t, tmpl.Spec.PodTemplate.Spec.HostUsers)
	assert.False(t, *tmpl.Spec.PodTemplate.Spec.HostUsers)
}
