//go:build kubernetes

package kubernetes

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/host/failure"
	"github.com/oac/sandbox-agent/host/provider"
)

func TestAPodNamesNoAppArmorProfileUnlessAsked(t *testing.T) {
	// The provider as oac-shim makes it from no flags.
	p := provider.Declare(flag.NewFlagSet("t", flag.ContinueOnError))["kubernetes"]().(*Provider)
	assert.Empty(t, p.AppArmor, "no AppArmor profile by default")
	forBoth(t, func(t *testing.T, made madePod) {
		pod := made(testConfig())
		assert.Nil(t, pod.Spec.SecurityContext.AppArmorProfile, "the runtime's default: a node without AppArmor still admits the Pod")
		for _, c := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
			assert.Nil(t, c.SecurityContext.AppArmorProfile, c.Name)
		}
	})
}

func TestThePodRunsUnderTheLocalhostProfileItIsGiven(t *testing.T) {
	c := testConfig()
	c.AppArmor = "oac-guest"
	forBoth(t, func(t *testing.T, made madePod) {
		pod := made(c)
		prof := pod.Spec.SecurityContext.AppArmorProfile
		require.NotNil(t, prof, "Pod-wide: every container runs under it")
		assert.Equal(t, corev1.AppArmorProfileTypeLocalhost, prof.Type)
		require.NotNil(t, prof.LocalhostProfile)
		assert.Equal(t, "oac-guest", *prof.LocalhostProfile)
		for _, ctr := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
			assert.Nil(t, ctr.SecurityContext.AppArmorProfile, "no container overrides the Pod's: %s", ctr.Name)
		}
		assert.Equal(t, corev1.SeccompProfileTypeLocalhost, pod.Spec.SecurityContext.SeccompProfile.Type, "the seccomp profile stays")
	})
	// A kept sandbox (bare Pods only) seeds its volume under it too.
	c.Kept = true
	pod := podSpec(c)
	require.NotNil(t, pod.Spec.SecurityContext.AppArmorProfile)
	assert.Equal(t, "oac-guest", *pod.Spec.SecurityContext.AppArmorProfile.LocalhostProfile)
	require.Len(t, pod.Spec.InitContainers, 1)
	assert.Nil(t, pod.Spec.InitContainers[0].SecurityContext.AppArmorProfile, "the seed does not override the Pod's")
}

// The test cluster (internal/kcluster, make k8s-cluster-test) runs on
// this build machine, whose kernel has no AppArmor: the kubelet refuses
// a Pod that names a profile ("Cannot enforce AppArmor: AppArmor is not
// enabled on the host"), so none of its tests may pass the flag.
func TestTheTestClusterNeverGetsAnAppArmorProfile(t *testing.T) {
	for _, f := range []string{"e2e/kubernetes_test.go", "e2e/kubernetes_rbac_test.go", "bench/kubernetes_linux.go"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "..", f))
		require.NoError(t, err)
		assert.NotContains(t, string(b), "k8s-apparmor-profile", f)
	}
}

func TestAPodANodeCannotRunUnderItsProfileSaysWhy(t *testing.T) {
	// containerd on a node with AppArmor and without the profile.
	pod := &corev1.Pod{Spec: corev1.PodSpec{NodeName: "node-a"}, Status: corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{
		Name: ContainerName, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CreateContainerError",
			Message: "failed to get container spec opts: failed to generate apparmor spec opts: apparmor profile not found oac-guest"}},
	}}}}
	err := podProblem(pod)
	require.Error(t, err)
	assert.Equal(t, api.CodeAppArmorMissing, failure.Code(err))
	assert.Contains(t, err.Error(), "the node node-a cannot run the sandbox's container under its AppArmor profile")
	assert.Contains(t, err.Error(), "apparmor profile not found oac-guest", "the runtime's own words")
	assert.Contains(t, err.Error(), "load examples/apparmor/oac-guest on every node (docs/kubernetes.md#apparmor)")

	// A kubelet before 1.30 checked the profile at admission.
	pod = &corev1.Pod{Spec: corev1.PodSpec{NodeName: "node-b"}, Status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "AppArmor",
		Message: `Cannot enforce AppArmor: profile "oac-guest" is not loaded`}}
	err = podProblem(pod)
	assert.Equal(t, api.CodeAppArmorMissing, failure.Code(err))
	assert.Contains(t, err.Error(), "load examples/apparmor/oac-guest on every node")

	// A node without AppArmor refuses any profile: nothing to install
	// there; the flag is wrong for that node.
	pod = &corev1.Pod{Spec: corev1.PodSpec{NodeName: "node-c"}, Status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "AppArmor",
		Message: "Cannot enforce AppArmor: AppArmor is not enabled on the host"}}
	err = podProblem(pod)
	assert.Equal(t, api.CodeProviderUnavailable, failure.Code(err))
	assert.Contains(t, err.Error(), "the node node-c refused the sandbox's Pod (Cannot enforce AppArmor: AppArmor is not enabled on the host)")
	assert.Contains(t, err.Error(), "leave the flag out for nodes without AppArmor")
}
