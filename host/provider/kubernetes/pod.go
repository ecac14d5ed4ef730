//go:build kubernetes

package kubernetes

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/oac/sandbox-agent/host/provider/kit"
)

// Labels and annotations of the objects the provider makes.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "oac-shim"
	// LabelSandbox names the sandbox an object was made for.
	LabelSandbox = "oac.dev/sandbox"
	// LabelKept is "true" on a kept sandbox's Pod and claim.
	LabelKept = "oac.dev/kept"
	// AnnotationHolder names the host whose shims own the object: only
	// they remove it as a leftover.
	AnnotationHolder = "oac.dev/holder"
)

// Paths in the guest image and the Pod.
const (
	// AgentPath is oac-guest in every image oac-image builds.
	AgentPath = "/sbin/oac-guest"
	// SessionSocket is where the agent waits for the bridge.
	SessionSocket = "/run/oac/session.sock"
	// ContainerName is the agent's container; SeedContainer the kept
	// volume's init container.
	ContainerName = "agent"
	SeedContainer = "seed-kept"
	keptVolume    = "kept"
	keptMount     = "/oac/kept"
)

// ObjectName is the name of a sandbox's Pod and NetworkPolicy; ClaimName
// its kept volume's.
func ObjectName(sandbox string) string { return "oac-" + sandbox }
func ClaimName(sandbox string) string  { return "oac-" + sandbox + "-kept" }

// podConfig is everything a sandbox's Pod depends on.
type podConfig struct {
	Name, Namespace, Holder string
	Image                   string
	PullPolicy              corev1.PullPolicy
	Hostname                string
	RuntimeClass            string
	// UserNamespaces: hostUsers false.
	UserNamespaces bool
	// Seccomp is a Localhost profile's path on the nodes, or "" for the
	// runtime's default.
	Seccomp string
	// AppArmor is a Localhost AppArmor profile loaded on the nodes, or ""
	// for the runtime's default (the Pod names none).
	AppArmor           string
	Requests, Limits   corev1.ResourceList
	Kept, Debug        bool
	GracePeriodSeconds int64
}

// labels are a sandbox's objects' labels.
func labels(name string, kept bool) map[string]string {
	return map[string]string{LabelManagedBy: ManagedBy, LabelSandbox: name, LabelKept: fmt.Sprint(kept)}
}

// objectMeta names an object of sandbox's and carries what finds it
// again: its labels and its holder.
func objectMeta(object, namespace, sandbox, holder string, kept bool) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name: object, Namespace: namespace,
		Labels:      labels(sandbox, kept),
		Annotations: map[string]string{AnnotationHolder: holder},
	}
}

// selector selects every object of this provider, or of one sandbox.
func selector(name string) string {
	s := LabelManagedBy + "=" + ManagedBy
	if name != "" {
		s += "," + LabelSandbox + "=" + name
	}
	return s
}

// AgentCaps are the agent container's capabilities, sorted: the hosted
// contract's (kit.AgentCaps) and SETFCAP for the workload launcher's
// nested user namespace, as the docker provider adds.
var AgentCaps = func() []corev1.Capability {
	var caps []corev1.Capability
	for _, c := range append(slices.Clone(kit.AgentCaps), "SETFCAP") {
		caps = append(caps, corev1.Capability(c))
	}
	slices.Sort(caps)
	return caps
}()

// podSpec is the sandbox's Pod.
func podSpec(c podConfig) *corev1.Pod {
	no, yes := false, true
	root := int64(0)
	// --offline: the session comes through the API server, so the agent
	// deletes the Pod's interfaces (it holds NET_ADMIN, not the
	// SYS_ADMIN a namespace of the workload's own would need).
	args := []string{"--transport", "unix+listen://" + SessionSocket, "--offline"}
	if c.Debug {
		args = append(args, "--debug")
	}
	if c.Kept {
		args = append(args, "--kept")
	}
	seccomp := &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
	if c.Seccomp != "" {
		seccomp = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeLocalhost, LocalhostProfile: &c.Seccomp}
	}
	security := &corev1.SecurityContext{
		RunAsUser: &root, RunAsGroup: &root, RunAsNonRoot: &no,
		AllowPrivilegeEscalation: &no, Privileged: &no, ReadOnlyRootFilesystem: &yes,
		Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: AgentCaps},
	}
	mem := func(mib int) *resource.Quantity { q := resource.MustParse(fmt.Sprintf("%dMi", mib)); return &q }
	volumes := []corev1.Volume{
		{Name: "run", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: mem(kit.RunSizeMiB)}}},
		{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: mem(kit.TmpSizeMiB)}}},
	}
	mounts := []corev1.VolumeMount{{Name: "run", MountPath: "/run"}, {Name: "tmp", MountPath: "/tmp"}}
	var inits []corev1.Container
	if c.Kept {
		volumes = append(volumes, corev1.Volume{Name: keptVolume, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: ClaimName(c.Name)}}})
		mounts = append(mounts,
			corev1.VolumeMount{Name: keptVolume, MountPath: "/home", SubPath: "home"},
			corev1.VolumeMount{Name: keptVolume, MountPath: "/environment", SubPath: "environment"},
			corev1.VolumeMount{Name: keptVolume, MountPath: "/usr/local", SubPath: "usr-local"})
		inits = []corev1.Container{{
			Name: SeedContainer, Image: c.Image, ImagePullPolicy: c.PullPolicy,
			Command: []string{AgentPath, "seed-kept", keptMount}, SecurityContext: security,
			VolumeMounts: []corev1.VolumeMount{{Name: keptVolume, MountPath: keptMount}},
			Resources:    corev1.ResourceRequirements{Requests: c.Requests, Limits: c.Limits},
		}}
	} else {
		for _, d := range []string{"home", "environment"} {
			volumes = append(volumes, corev1.Volume{Name: d, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
			mounts = append(mounts, corev1.VolumeMount{Name: d, MountPath: "/" + d})
		}
	}
	p := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: objectMeta(ObjectName(c.Name), c.Namespace, c.Name, c.Holder, c.Kept),
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  &no,
			EnableServiceLinks:            &no,
			HostNetwork:                   false,
			HostPID:                       false,
			HostIPC:                       false,
			ShareProcessNamespace:         &no,
			TerminationGracePeriodSeconds: &c.GracePeriodSeconds,
			DNSPolicy:                     corev1.DNSNone,
			DNSConfig:                     &corev1.PodDNSConfig{Nameservers: []string{"127.0.0.1"}, Options: []corev1.PodDNSConfigOption{{Name: "edns0"}}},
			SecurityContext:               &corev1.PodSecurityContext{SeccompProfile: seccomp, AppArmorProfile: appArmor(c.AppArmor)},
			Volumes:                       volumes,
			InitContainers:                inits,
			Containers: []corev1.Container{{
				Name: ContainerName, Image: c.Image, ImagePullPolicy: c.PullPolicy,
				Command: []string{AgentPath}, Args: args,
				SecurityContext: security, VolumeMounts: mounts,
				Resources:                corev1.ResourceRequirements{Requests: c.Requests, Limits: c.Limits},
				TerminationMessagePolicy: corev1.TerminationMessageReadFile,
			}},
		},
	}
	if c.UserNamespaces {
		p.Spec.HostUsers = &no
	}
	if c.RuntimeClass != "" {
		p.Spec.RuntimeClassName = &c.RuntimeClass
	}
	if c.Hostname != "" && len(validation.IsDNS1123Label(c.Hostname)) == 0 {
		p.Spec.Hostname = c.Hostname
	}
	return p
}

// appArmor is the Pod's AppArmor profile: a Localhost one when named,
// else none (the runtime's default applies; the field is left out, so a
// node without AppArmor still admits the Pod).
func appArmor(name string) *corev1.AppArmorProfile {
	if name == "" {
		return nil
	}
	return &corev1.AppArmorProfile{Type: corev1.AppArmorProfileTypeLocalhost, LocalhostProfile: &name}
}

// networkPolicy denies the sandbox's Pod every ingress and egress: the
// session reaches it through the API server and the kubelet, never its
// network. A cluster whose network enforces policies keeps even the
// agent off the network; on one that does not, the workload still has
// only lo (the guest's own network namespace).
func networkPolicy(c podConfig) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: objectMeta(ObjectName(c.Name), c.Namespace, c.Name, c.Holder, c.Kept),
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{LabelManagedBy: ManagedBy, LabelSandbox: c.Name}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
		},
	}
}

// claim is a kept sandbox's volume.
func claim(name, namespace, holder, storageClass string, size resource.Quantity) *corev1.PersistentVolumeClaim {
	pvc := &corev1.PersistentVolumeClaim{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolumeClaim"},
		ObjectMeta: objectMeta(ClaimName(name), namespace, name, holder, true),
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
		},
	}
	if storageClass != "" {
		pvc.Spec.StorageClassName = &storageClass
	}
	return pvc
}

// parseResources reads "cpu=100m,memory=128Mi".
func parseResources(flag, s string) (corev1.ResourceList, error) {
	out := corev1.ResourceList{}
	if s == "" {
		return out, nil
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok || (k != "cpu" && k != "memory" && k != "ephemeral-storage") {
			return nil, fmt.Errorf("--%s %q: want cpu=QUANTITY,memory=QUANTITY[,ephemeral-storage=QUANTITY]", flag, s)
		}
		q, err := resource.ParseQuantity(v)
		if err != nil || q.Sign() <= 0 {
			return nil, fmt.Errorf("--%s %q: %s=%q is not a positive quantity (e.g. cpu=500m, memory=512Mi)", flag, s, k, v)
		}
		out[corev1.ResourceName(k)] = q
	}
	return out, nil
}
