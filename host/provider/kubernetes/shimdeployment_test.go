//go:build kubernetes

package kubernetes

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// exampleDeployment is examples/kubernetes/shim-deployment.yaml, each
// document decoded strictly into its kind's type (a misspelt field
// fails).
type exampleDeployment struct {
	account    corev1.ServiceAccount
	binding    rbacv1.RoleBinding
	claim      corev1.PersistentVolumeClaim
	deployment appsv1.Deployment
}

func readExampleDeployment(t *testing.T) exampleDeployment {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "examples", "kubernetes", "shim-deployment.yaml"))
	require.NoError(t, err)
	var ex exampleDeployment
	kinds := map[string]any{"ServiceAccount": &ex.account, "RoleBinding": &ex.binding, "PersistentVolumeClaim": &ex.claim, "Deployment": &ex.deployment}
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var head struct {
			Kind string `json:"kind"`
		}
		require.NoError(t, yaml.Unmarshal([]byte(doc), &head))
		into, ok := kinds[head.Kind]
		require.True(t, ok, "an object of kind %q", head.Kind)
		require.NoError(t, yaml.UnmarshalStrict([]byte(doc), into), "the %s", head.Kind)
		delete(kinds, head.Kind)
	}
	require.Empty(t, kinds, "the kinds the example must hold")
	return ex
}

// providerFlags are the flags the Provider declares.
func providerFlags() map[string]bool {
	out := map[string]bool{}
	typ := reflect.TypeOf(Provider{})
	for i := range typ.NumField() {
		if name, _, _ := strings.Cut(typ.Field(i).Tag.Get("flag"), ","); name != "" {
			out[name] = true
		}
	}
	return out
}

func TestTheExampleDeploymentRunsOneShimAsTheRolesServiceAccountUnderOneHolder(t *testing.T) {
	ex := readExampleDeployment(t)
	pod := ex.deployment.Spec.Template.Spec

	assert.Equal(t, "Role", ex.binding.RoleRef.Kind)
	assert.Equal(t, "oac-shim", ex.binding.RoleRef.Name, "the Role of examples/kubernetes/role.yaml")
	require.Len(t, ex.binding.Subjects, 1)
	assert.Equal(t, rbacv1.ServiceAccountKind, ex.binding.Subjects[0].Kind)
	assert.Equal(t, ex.account.Name, ex.binding.Subjects[0].Name)
	assert.Equal(t, ex.account.Name, pod.ServiceAccountName, "the shim runs as the bound account")
	assert.True(t, pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken, "the shim needs its token (the sandboxes' Pods get none)")

	require.NotNil(t, ex.deployment.Spec.Replicas)
	assert.Equal(t, int32(1), *ex.deployment.Spec.Replicas)
	assert.Equal(t, appsv1.RecreateDeploymentStrategyType, ex.deployment.Spec.Strategy.Type)

	require.Len(t, pod.Containers, 1)
	c := pod.Containers[0]
	args := map[string]string{}
	for _, a := range c.Args {
		k, v, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		args[k] = v
		if strings.HasPrefix(k, "k8s-") {
			assert.True(t, providerFlags()[k], "--%s is a flag of the provider", k)
		}
	}
	assert.Equal(t, "run", c.Args[0])
	assert.Equal(t, "kubernetes", args["provider"])
	assert.Equal(t, ex.deployment.Name, args["k8s-holder"], "every replica and restart is the Deployment's holder")
	assert.NotContains(t, args, "kubeconfig", "in the cluster: the service account")

	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
	}
	keep, ok := mounts[args["keep-root"]]
	require.True(t, ok, "the keep root is a mount")
	require.NotNil(t, volumes[keep.Name].PersistentVolumeClaim, "the keep root outlives the Pod")
	assert.Equal(t, ex.claim.Name, volumes[keep.Name].PersistentVolumeClaim.ClaimName)
	boot, ok := mounts[filepath.Dir(args["bootstrap"])]
	require.True(t, ok, "the bootstrap is a mount")
	assert.True(t, boot.ReadOnly)
	require.NotNil(t, volumes[boot.Name].Secret, "the bootstrap comes from a Secret, never from the sandbox's objects")

	sc := c.SecurityContext
	require.NotNil(t, sc)
	assert.False(t, *sc.AllowPrivilegeEscalation)
	assert.True(t, *sc.ReadOnlyRootFilesystem)
	assert.Equal(t, []corev1.Capability{"ALL"}, sc.Capabilities.Drop)
	assert.True(t, *pod.SecurityContext.RunAsNonRoot)
}
