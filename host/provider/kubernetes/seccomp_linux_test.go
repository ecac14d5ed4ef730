//go:build kubernetes

package kubernetes

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/host/provider/kit"
)

func TestThePublishedSeccompProfileIsTheOneContainersGet(t *testing.T) {
	want, err := kit.ContainerSeccompProfile()
	require.NoError(t, err)
	got, err := os.ReadFile(filepath.Join("..", "..", "..", "examples", "kubernetes", "oac-seccomp.json"))
	require.NoError(t, err)
	assert.JSONEq(t, string(want), string(got), "regenerate examples/kubernetes/oac-seccomp.json from kit.ContainerSeccompProfile")
}
