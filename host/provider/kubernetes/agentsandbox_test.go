//go:build kubernetes

package kubernetes

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/oac/sandbox-agent/host/provider"
)

// asMap is v as JSON decodes it: what the API server holds of it.
func asMap(t *testing.T, v any) map[string]any {
	b, err := json.Marshal(v)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	return m
}

func TestTheProvidersOwnTemplatePassesTheClaimsCheck(t *testing.T) {
	p := defaultProvider()
	p.Image = "reg/oac:1"
	tmpl, err := p.SandboxTemplate("oac", false)
	require.NoError(t, err)
	assert.NoError(t, checkTemplate(asMap(t, tmpl), "oac"))
}

func TestATemplateWhosePodsMayReachTheNetworkIsRefused(t *testing.T) {
	p := defaultProvider()
	p.Image = "reg/oac:1"
	tmpl, err := p.SandboxTemplate("oac", false)
	require.NoError(t, err)
	for name, change := range map[string]func(m map[string]any){
		"no networkPolicy (agent-sandbox's default allows public egress)": func(m map[string]any) {
			unstructured.RemoveNestedField(m, "spec", "networkPolicy")
		},
		"unmanaged": func(m map[string]any) {
			require.NoError(t, unstructured.SetNestedField(m, "Unmanaged", "spec", "networkPolicyManagement"))
		},
		"an egress rule": func(m map[string]any) {
			require.NoError(t, unstructured.SetNestedSlice(m, []any{map[string]any{}}, "spec", "networkPolicy", "egress"))
		},
	} {
		m := asMap(t, tmpl)
		change(m)
		err := checkTemplate(m, "oac")
		assert.ErrorIs(t, err, provider.ErrUnavailable, name)
		assert.ErrorContains(t, err, "networkPolicy: {}", name)
	}
}

func TestATemplateThatIsNotAnOacGuestsIsRefused(t *testing.T) {
	p := defaultProvider()
	p.Image = "reg/oac:1"
	tmpl, err := p.SandboxTemplate("other", false)
	require.NoError(t, err)
	m := asMap(t, tmpl)
	unstructured.RemoveNestedField(m, "spec", "podTemplate", "metadata", "labels", LabelManagedBy)
	assert.ErrorContains(t, checkTemplate(m, "other"), "SandboxTemplate other is not an oac guest's")
}

func TestAClaimCarriesWhatFindsItAgainAndDiesWithItsSandbox(t *testing.T) {
	c := sandboxClaim("box", "ns", "host-a", "pool")
	assert.Equal(t, "oac-box", c.GetName())
	assert.Equal(t, "ns", c.GetNamespace())
	assert.Equal(t, labels("box", false), c.GetLabels())
	assert.Equal(t, map[string]string{AnnotationHolder: "host-a"}, c.GetAnnotations())
	pool, _, _ := unstructured.NestedString(c.Object, "spec", "warmPoolRef", "name")
	assert.Equal(t, "pool", pool)
	policy, _, _ := unstructured.NestedString(c.Object, "spec", "lifecycle", "shutdownPolicy")
	assert.Equal(t, "Delete", policy)
	env, has, _ := unstructured.NestedFieldNoCopy(c.Object, "spec", "env")
	assert.False(t, has, "nothing of the sandbox's goes into the Pod's environment: %v", env)
}

func TestABoundClaimNamesItsSandboxAndARefusedOneSaysWhy(t *testing.T) {
	claim := func(status map[string]any) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{"name": "oac-box"}, "status": status}}
	}
	sb, err := bound(claim(nil))
	assert.NoError(t, err)
	assert.Empty(t, sb, "not bound yet")
	sb, err = bound(claim(map[string]any{"sandbox": map[string]any{"name": "pool-abcde"}}))
	assert.NoError(t, err)
	assert.Equal(t, "pool-abcde", sb)
	_, err = bound(claim(map[string]any{"conditions": []any{map[string]any{"type": "Ready", "status": "False", "reason": "TemplateNotFound", "message": "no template"}}}))
	assert.ErrorIs(t, err, provider.ErrUnavailable)
	assert.ErrorContains(t, err, "TemplateNotFound")
	sb, err = bound(claim(map[string]any{"conditions": []any{map[string]any{"type": "Ready", "status": "False", "reason": "SandboxNotReady"}}}))
	assert.NoError(t, err, "a sandbox on its way is waited for")
	assert.Empty(t, sb)
}

func TestTheWayToMakePodsIsCheckedBeforeAnyCluster(t *testing.T) {
	for _, tc := range []struct {
		api, pool, err string
	}{
		{"pods", "", ""},
		{"agent-sandbox", "warm", ""},
		{"agent-sandbox", "", "name it with --k8s-warm-pool NAME"},
		{"pods", "warm", "--k8s-warm-pool is for --k8s-api agent-sandbox"},
		{"statefulsets", "", `--k8s-api "statefulsets": want pods or agent-sandbox`},
	} {
		p := defaultProvider()
		p.API, p.WarmPool = tc.api, tc.pool
		err := p.checkFlags()
		if tc.err == "" {
			assert.NoError(t, err, tc.api)
			continue
		}
		assert.ErrorIs(t, err, provider.ErrInvalidSpec, tc.api)
		assert.ErrorContains(t, err, tc.err)
	}
}

func TestOnlyThrowawaySandboxesAreClaimed(t *testing.T) {
	p := defaultProvider()
	p.API, p.WarmPool = APIAgentSandbox, "warm"
	assert.True(t, p.viaClaim(provider.Spec{Name: "box"}))
	assert.False(t, p.viaClaim(provider.Spec{Name: "box", Keep: &provider.Keep{}}), "a kept sandbox's Pod mounts its own volume claim")
	p.API = APIPods
	assert.False(t, p.viaClaim(provider.Spec{Name: "box"}))
}
