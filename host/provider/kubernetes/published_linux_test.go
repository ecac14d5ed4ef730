//go:build kubernetes

package kubernetes

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/oac/sandbox-agent/host/provider/kit"
)

func TestThePublishedSeccompProfileIsTheOneContainersGet(t *testing.T) {
	want, err := kit.ContainerSeccompProfile()
	require.NoError(t, err)
	got, err := os.ReadFile(filepath.Join("..", "..", "..", "examples", "kubernetes", "oac-seccomp.json"))
	require.NoError(t, err)
	assert.JSONEq(t, string(want), string(got), "regenerate examples/kubernetes/oac-seccomp.json from kit.ContainerSeccompProfile")
}

func TestThePublishedRoleGrantsExactlyTheVerbsTheProviderUses(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "examples", "kubernetes", "role.yaml"))
	require.NoError(t, err)
	var granted []permission
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var obj struct {
			Kind  string `json:"kind"`
			Rules []struct {
				APIGroups []string `json:"apiGroups"`
				Resources []string `json:"resources"`
				Verbs     []string `json:"verbs"`
			} `json:"rules"`
		}
		require.NoError(t, yaml.Unmarshal([]byte(doc), &obj))
		if obj.Kind != "Role" {
			continue
		}
		for _, r := range obj.Rules {
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					for _, v := range r.Verbs {
						granted = append(granted, permission{group: g, resource: res, verb: v})
					}
				}
			}
		}
	}
	var used []permission
	for _, p := range permissions {
		p.need = ""
		used = append(used, p)
	}
	assert.ElementsMatch(t, used, granted, "examples/kubernetes/role.yaml and the provider's permissions")
}
