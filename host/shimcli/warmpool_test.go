package shimcli

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"sigs.k8s.io/yaml"

	"github.com/oac/sandbox-agent/internal/cli"
)

func warmPool(args ...string) (stdout, stderr string, code int) {
	var out, errb bytes.Buffer
	code = warmPoolCmd(args, cli.Env{Stdout: &out, Stderr: &errb})
	return out.String(), errb.String(), code
}

func TestWarmPoolPrintsTheTemplateAndThePoolForTheProvidersFlags(t *testing.T) {
	if !kubernetesBuilt {
		out, stderr, code := warmPool("--pool", "p")
		assert.Equal(t, 1, code)
		assert.Contains(t, stderr, "run oac-shim-kubernetes")
		assert.Empty(t, out)
		return
	}
	out, stderr, code := warmPool("--k8s-image", "reg/oac:2", "--k8s-pull-policy", "Never", "--pool", "p", "--template", "t", "--replicas", "3")
	assert.Equal(t, 0, code, stderr)
	docs := bytes.Split([]byte(out), []byte("\n---\n"))
	if !assert.Len(t, docs, 2) {
		return
	}
	var tmpl, pool struct {
		Kind     string
		Metadata struct{ Name string }
		Spec     map[string]any
	}
	assert.NoError(t, yaml.Unmarshal(docs[0], &tmpl))
	assert.NoError(t, yaml.Unmarshal(docs[1], &pool))
	assert.Equal(t, "SandboxTemplate", tmpl.Kind)
	assert.Equal(t, "t", tmpl.Metadata.Name)
	assert.Contains(t, out, "image: reg/oac:2")
	assert.Contains(t, out, "imagePullPolicy: Never")
	assert.Equal(t, "SandboxWarmPool", pool.Kind)
	assert.Equal(t, "p", pool.Metadata.Name)
	assert.Equal(t, map[string]any{"replicas": float64(3), "sandboxTemplateRef": map[string]any{"name": "t"}}, pool.Spec)
}

func TestWarmPoolRefusesWhatIsNoPoolOfAnything(t *testing.T) {
	_, stderr, code := warmPool("--provider", "bwrap")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "the bwrap provider has no warm pool a cluster keeps: oac-shim run --warm")
	_, stderr, code = warmPool("--replicas", "-1")
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "--replicas -1")
	_, stderr, code = warmPool("--pool", "Bad_Name")
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "--template and --pool are names")
	_, stderr, code = warmPool("--provider", "nope")
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, `unknown provider "nope"`)
}
