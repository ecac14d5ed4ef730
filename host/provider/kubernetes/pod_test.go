//go:build kubernetes

package kubernetes

import (
	"errors"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/oac/sandbox-agent/host/provider"
)

func testConfig() podConfig {
	req, _ := parseResources("k8s-requests", "cpu=100m,memory=128Mi")
	lim, _ := parseResources("k8s-limits", "cpu=2,memory=2Gi")
	return podConfig{Name: "box", Namespace: "ns", Holder: "host-a", Image: "reg/oac:1", PullPolicy: corev1.PullIfNotPresent,
		Seccomp: DefaultSeccompProfile, Requests: req, Limits: lim, GracePeriodSeconds: 5}
}

// madePod is one way the provider makes a sandbox's Pod from a
// configuration.
type madePod func(podConfig) corev1.PodTemplateSpec

// bareAndWarm are the two: the bare Pod of one sandbox, and a warm
// sandbox's from its SandboxTemplate. Every promise the Pod keeps is
// proven over both by forBoth.
var bareAndWarm = []struct {
	name string
	pod  madePod
}{
	{"bare Pod", func(c podConfig) corev1.PodTemplateSpec {
		p := podSpec(c)
		return corev1.PodTemplateSpec{ObjectMeta: p.ObjectMeta, Spec: p.Spec}
	}},
	{"warm Pod", warmPod},
}

func forBoth(t *testing.T, test func(t *testing.T, pod madePod)) {
	for _, m := range bareAndWarm {
		t.Run(m.name, func(t *testing.T) { test(t, m.pod) })
	}
}

func TestThePodGetsNoTokenNoHostNamespaceAndNoServiceLinks(t *testing.T) {
	forBoth(t, func(t *testing.T, pod madePod) {
		s := pod(testConfig()).Spec
		require.NotNil(t, s.AutomountServiceAccountToken)
		assert.False(t, *s.AutomountServiceAccountToken, "no service account token in the sandbox")
		assert.False(t, s.HostNetwork)
		assert.False(t, s.HostPID)
		assert.False(t, s.HostIPC)
		require.NotNil(t, s.ShareProcessNamespace)
		assert.False(t, *s.ShareProcessNamespace)
		require.NotNil(t, s.EnableServiceLinks)
		assert.False(t, *s.EnableServiceLinks, "no environment naming the cluster's services")
		assert.Equal(t, corev1.RestartPolicyNever, s.RestartPolicy, "a sandbox that ends is not restarted behind the shim")
		assert.Equal(t, corev1.DNSNone, s.DNSPolicy)
		assert.Equal(t, []string{"127.0.0.1"}, s.DNSConfig.Nameservers, "names go to the guest's resolver")
		for _, v := range s.Volumes {
			assert.Nil(t, v.HostPath, "no host path: %s", v.Name)
		}
		assert.Nil(t, s.HostUsers, "hostUsers only where every node supports user namespaces")
		assert.Nil(t, s.RuntimeClassName)
		require.NotNil(t, s.TerminationGracePeriodSeconds)
		assert.Equal(t, int64(5), *s.TerminationGracePeriodSeconds)
	})
}

func TestTheAgentRunsAsRootWithTheContractsCapabilitiesOnly(t *testing.T) {
	forBoth(t, func(t *testing.T, pod madePod) {
		p := pod(testConfig())
		require.Len(t, p.Spec.Containers, 1)
		c := p.Spec.Containers[0]
		assert.Equal(t, ContainerName, c.Name)
		assert.Equal(t, "reg/oac:1", c.Image)
		assert.Equal(t, corev1.PullIfNotPresent, c.ImagePullPolicy)
		assert.Equal(t, []string{AgentPath}, c.Command)
		assert.Equal(t, []string{"--transport", "unix+listen://" + SessionSocket, "--offline"}, c.Args, "the agent waits for the bridge and drops the Pod's network")
		assert.Empty(t, c.Env, "nothing of the sandbox in the environment: the bootstrap comes over the session")
		sc := c.SecurityContext
		assert.Equal(t, int64(0), *sc.RunAsUser)
		assert.Equal(t, int64(0), *sc.RunAsGroup)
		require.NotNil(t, sc.RunAsNonRoot)
		assert.False(t, *sc.RunAsNonRoot, "guest root, with the contract's capabilities only")
		assert.False(t, *sc.AllowPrivilegeEscalation)
		assert.False(t, *sc.Privileged)
		assert.True(t, *sc.ReadOnlyRootFilesystem)
		assert.Equal(t, []corev1.Capability{"ALL"}, sc.Capabilities.Drop)
		assert.Equal(t, []corev1.Capability{"CHOWN", "DAC_OVERRIDE", "KILL", "NET_ADMIN", "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETUID"}, sc.Capabilities.Add)
		prof := p.Spec.SecurityContext.SeccompProfile
		assert.Equal(t, corev1.SeccompProfileTypeLocalhost, prof.Type)
		assert.Equal(t, DefaultSeccompProfile, *prof.LocalhostProfile)
		assert.Equal(t, resource.MustParse("2Gi"), c.Resources.Limits[corev1.ResourceMemory])
		assert.Equal(t, resource.MustParse("2"), c.Resources.Limits[corev1.ResourceCPU])
		assert.Equal(t, resource.MustParse("128Mi"), c.Resources.Requests[corev1.ResourceMemory])
		assert.Equal(t, resource.MustParse("100m"), c.Resources.Requests[corev1.ResourceCPU])
	})
}

func TestTheAgentSaysMoreOnlyWhenAskedForDebug(t *testing.T) {
	forBoth(t, func(t *testing.T, pod madePod) {
		c := testConfig()
		c.Debug = true
		assert.Equal(t, []string{"--transport", "unix+listen://" + SessionSocket, "--offline", "--debug"}, pod(c).Spec.Containers[0].Args)
	})
}

func TestTheRuntimesDefaultProfileAUserNamespaceAndARuntimeClassWhenAskedFor(t *testing.T) {
	c := testConfig()
	c.Seccomp, c.UserNamespaces, c.RuntimeClass, c.Hostname = "", true, "gvisor", "conformance"
	forBoth(t, func(t *testing.T, pod madePod) {
		p := pod(c)
		assert.Equal(t, corev1.SeccompProfileTypeRuntimeDefault, p.Spec.SecurityContext.SeccompProfile.Type)
		assert.Nil(t, p.Spec.SecurityContext.SeccompProfile.LocalhostProfile)
		require.NotNil(t, p.Spec.HostUsers)
		assert.False(t, *p.Spec.HostUsers)
		assert.Equal(t, "gvisor", *p.Spec.RuntimeClassName)
	})
	// The hostname is one sandbox's: a warm Pod's is its Pod's name.
	assert.Equal(t, "conformance", podSpec(c).Spec.Hostname)
	assert.Empty(t, warmPod(c).Spec.Hostname)
	c.Hostname = "Not_A_Label"
	assert.Empty(t, podSpec(c).Spec.Hostname, "a hostname the API would refuse is left to the Pod's name")
}

func TestAThrowawayPodWritesOnlyToItsOwnEmptyDirs(t *testing.T) {
	forBoth(t, func(t *testing.T, pod madePod) {
		p := pod(testConfig())
		mounts := map[string]string{}
		for _, m := range p.Spec.Containers[0].VolumeMounts {
			mounts[m.MountPath] = m.Name
		}
		assert.Equal(t, map[string]string{"/run": "run", "/tmp": "tmp", "/home": "home", "/environment": "environment"}, mounts)
		for _, v := range p.Spec.Volumes {
			require.NotNil(t, v.EmptyDir, v.Name)
		}
		assert.Empty(t, p.Spec.InitContainers)
	})
}

func TestAKeptPodMountsItsClaimSeededByAnInitContainer(t *testing.T) {
	c := testConfig()
	c.Kept = true
	p := podSpec(c)
	assert.Equal(t, "true", p.Labels[LabelKept])
	assert.Contains(t, p.Spec.Containers[0].Args, "--kept")
	sub := map[string]string{}
	for _, m := range p.Spec.Containers[0].VolumeMounts {
		if m.Name == keptVolume {
			sub[m.MountPath] = m.SubPath
		}
	}
	assert.Equal(t, map[string]string{"/home": "home", "/environment": "environment", "/usr/local": "usr-local"}, sub)
	require.Len(t, p.Spec.InitContainers, 1)
	init := p.Spec.InitContainers[0]
	assert.Equal(t, []string{AgentPath, "seed-kept", keptMount}, init.Command)
	assert.Equal(t, p.Spec.Containers[0].SecurityContext, init.SecurityContext, "the seed runs as tight as the agent")
	var claimName string
	for _, v := range p.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			claimName = v.PersistentVolumeClaim.ClaimName
		}
	}
	assert.Equal(t, ClaimName("box"), claimName)
}

func TestThePolicyDeniesTheSandboxesPodAllIngressAndEgress(t *testing.T) {
	np := networkPolicy(testConfig())
	assert.Equal(t, map[string]string{LabelManagedBy: ManagedBy, LabelSandbox: "box"}, np.Spec.PodSelector.MatchLabels)
	assert.Equal(t, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}, np.Spec.PolicyTypes)
	assert.Empty(t, np.Spec.Ingress, "no rule: nothing in")
	assert.Empty(t, np.Spec.Egress, "no rule: nothing out")
	pod := podSpec(testConfig())
	for k, v := range np.Spec.PodSelector.MatchLabels {
		assert.Equal(t, v, pod.Labels[k], "the policy selects the sandbox's Pod")
	}
}

func TestEveryObjectCarriesTheLabelsAndTheHolderALeftoverIsFoundBy(t *testing.T) {
	c := testConfig()
	for _, meta := range []struct {
		labels, annotations map[string]string
	}{
		{podSpec(c).Labels, podSpec(c).Annotations},
		{networkPolicy(c).Labels, networkPolicy(c).Annotations},
		{claim("box", "ns", "host-a", "", resource.MustParse("1Gi")).Labels, claim("box", "ns", "host-a", "", resource.MustParse("1Gi")).Annotations},
	} {
		assert.Equal(t, ManagedBy, meta.labels[LabelManagedBy])
		assert.Equal(t, "box", meta.labels[LabelSandbox])
		assert.Equal(t, "host-a", meta.annotations[AnnotationHolder])
	}
	assert.Equal(t, "app.kubernetes.io/managed-by=oac-shim,oac.dev/sandbox=box", selector("box"))
}

func TestResourceListsAreParsedStrictly(t *testing.T) {
	got, err := parseResources("k8s-limits", "cpu=500m, memory=1Gi")
	require.NoError(t, err)
	assert.Equal(t, resource.MustParse("500m"), got[corev1.ResourceCPU])
	for _, bad := range []string{"cpu", "gpu=1", "cpu=-1", "memory=lots", "cpu=0"} {
		_, err := parseResources("k8s-limits", bad)
		assert.Error(t, err, bad)
	}
}

func TestFlagsAreCheckedBeforeAnyClusterIsAsked(t *testing.T) {
	for _, p := range []Provider{
		{PullPolicy: "Sometimes"}, {UserNamespaces: "maybe"}, {Requests: "cpu=x"}, {Limits: "mem=1"}, {KeptSize: "big"},
		{AppArmor: "unconfined"}, {AppArmor: "Unconfined"}, {AppArmor: "RuntimeDefault"}, {AppArmor: "localhost/oac-guest"}, {AppArmor: "oac guest"},
	} {
		err := p.checkFlags()
		assert.ErrorIs(t, err, provider.ErrInvalidSpec, "%+v", p)
	}
	assert.NoError(t, (&Provider{PullPolicy: "Never", UserNamespaces: "require", Requests: "cpu=1", Limits: "memory=1Gi", KeptSize: "5Gi", AppArmor: "oac-guest"}).checkFlags())
}

func TestAPodThatCannotComeUpSaysWhy(t *testing.T) {
	waiting := func(reason string) *corev1.Pod {
		return &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{
			Name: ContainerName, Image: "reg/oac:1", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: "m"}},
		}}}}
	}
	assert.NoError(t, podProblem(waiting("ContainerCreating")), "still coming up")
	err := podProblem(waiting("ErrImageNeverPull"))
	require.ErrorIs(t, err, provider.ErrUnavailable)
	assert.Contains(t, err.Error(), "cannot get image reg/oac:1")
	err = podProblem(waiting("CreateContainerError"))
	assert.Contains(t, err.Error(), "seccomp profile")
	err = podProblem(&corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted"}})
	assert.Contains(t, err.Error(), "ended before its agent ran (Evicted")
}

func TestTheListenerHandsOutTheBridgeOnceOrWhyThereIsNone(t *testing.T) {
	l := newOnceListener()
	a, b := net.Pipe()
	defer b.Close()
	l.deliver(a)
	c, err := l.Accept()
	require.NoError(t, err)
	assert.Same(t, a, c)

	l = newOnceListener()
	l.fail(errors.New("image missing"))
	_, err = l.Accept()
	assert.EqualError(t, err, "image missing")
}
