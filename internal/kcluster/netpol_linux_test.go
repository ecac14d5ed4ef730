//go:build linux

package kcluster

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestToolsNetpolBuildsTheVersionItNamesWithTheRaisedDependencies: the
// cache directory is named by NetworkPolicyVersion, so tools/netpol must
// require exactly that kube-router, and keep the dependencies raised for
// their security advisories (docs/kubernetes.md) at least where they are.
func TestToolsNetpolBuildsTheVersionItNamesWithTheRaisedDependencies(t *testing.T) {
	b, err := os.ReadFile("../../tools/netpol/go.mod")
	require.NoError(t, err)
	req := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "require "))
		if len(f) >= 2 && strings.Contains(f[0], ".") && strings.HasPrefix(f[1], "v") {
			req[f[0]] = f[1]
		}
	}
	assert.Equal(t, NetworkPolicyVersion, req["github.com/cloudnativelabs/kube-router/v2"])
	for mod, atLeast := range map[string]string{
		"golang.org/x/net":         "v0.63.0",
		"github.com/docker/docker": "v25.0.13+incompatible",
		"github.com/osrg/gobgp/v3": "v3.37.0",
	} {
		assert.GreaterOrEqual(t, semverKey(req[mod]), semverKey(atLeast), "%s %s in tools/netpol, want at least %s", mod, req[mod], atLeast)
	}
}

// semverKey orders vMAJOR.MINOR.PATCH versions as strings do.
func semverKey(v string) string {
	v, _, _ = strings.Cut(strings.TrimPrefix(v, "v"), "+")
	var out []string
	for _, n := range strings.Split(v, ".") {
		out = append(out, strings.Repeat("0", max(0, 6-len(n)))+n)
	}
	return strings.Join(out, ".")
}
