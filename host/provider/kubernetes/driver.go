//go:build kubernetes

package kubernetes

import (
	"time"

	"github.com/oac/sandbox-agent/host/provider"
)

// Provider runs each sandbox as a Pod of a Kubernetes cluster.
type Provider struct {
	// Kubeconfig is the kubeconfig file; default $KUBECONFIG, then
	// ~/.kube/config, then the Pod's own service account.
	Kubeconfig string `flag:"kubeconfig,path" meta:"FILE" usage:"the cluster's kubeconfig (default: $KUBECONFIG, ~/.kube/config, or the service account of the Pod oac-shim runs in)"`
	// Namespace of the sandboxes' objects; default the kubeconfig
	// context's, else "default".
	Namespace string `flag:"k8s-namespace" meta:"NAME" usage:"the namespace of the sandboxes' Pods (default: the kubeconfig context's, else default)"`
	// Image is the guest image (oac-image build's OCI image, pushed to a
	// registry the nodes pull from).
	Image string `flag:"k8s-image" meta:"!IMAGE" usage:"the guest image, holding /sbin/oac-guest and oac-sandbox-io"`
	// PullPolicy is the containers' imagePullPolicy (default
	// IfNotPresent).
	PullPolicy string `flag:"k8s-pull-policy" meta:"POLICY" usage:"the image pull policy: IfNotPresent (default), Always or Never"`
	// RuntimeClass names a RuntimeClass (gVisor, Kata).
	RuntimeClass string `flag:"k8s-runtime-class" meta:"NAME" usage:"the Pods' RuntimeClass, e.g. gvisor or kata (default: the nodes' runtime)"`
	// UserNamespaces: auto (hostUsers false when every node says its
	// runtime supports it), require, or off.
	UserNamespaces string `flag:"k8s-user-namespaces" meta:"MODE" usage:"auto (default: when every node's runtime supports them), require, or off"`
	// Seccomp is the Pods' seccomp profile: a Localhost profile's path
	// under the kubelet's seccomp directory, or RuntimeDefault.
	Seccomp string `flag:"k8s-seccomp-profile" meta:"PROFILE" usage:"a Localhost seccomp profile on the nodes (default oac-seccomp.json: install examples/kubernetes/oac-seccomp.json in each kubelet's seccomp directory), or RuntimeDefault"`
	// AppArmor is a Localhost AppArmor profile the Pods run under (the
	// nodes' engine default refuses the launcher's mounts; oac-guest,
	// examples/apparmor/oac-guest). Never set by default: the kubelet
	// refuses any Pod that names one on a node without AppArmor.
	AppArmor string `flag:"k8s-apparmor-profile" meta:"NAME" usage:"run the Pods under this Localhost AppArmor profile, e.g. oac-guest, for nodes that enforce AppArmor (install examples/apparmor/oac-guest on every node first; default: none)"`
	// Requests and Limits of the agent's container.
	Requests string `flag:"k8s-requests" meta:"LIST" usage:"the Pods' resource requests (default cpu=100m,memory=128Mi)"`
	Limits   string `flag:"k8s-limits" meta:"LIST" usage:"the Pods' resource limits (default cpu=2,memory=2Gi)"`
	// StorageClass and KeptSize of a kept sandbox's claim.
	StorageClass string `flag:"k8s-storage-class" meta:"NAME" usage:"kept sandboxes' PersistentVolumeClaims' StorageClass (default: the cluster's default)"`
	KeptSize     string `flag:"k8s-kept-size" meta:"SIZE" usage:"the size of a kept sandbox's claim for /home, /environment and /usr/local (default 10Gi)"`
	// API is how a sandbox's Pod is made: APIPods (one bare Pod each) or
	// APIAgentSandbox (a SandboxClaim on WarmPool).
	API      string `flag:"k8s-api" meta:"API" usage:"how sandboxes' Pods are made: pods (default: one bare Pod each) or agent-sandbox (a SandboxClaim on --k8s-warm-pool: a warm Pod of the pool when it has one ready; kept sandboxes stay bare Pods)"`
	WarmPool string `flag:"k8s-warm-pool" meta:"NAME" usage:"with --k8s-api agent-sandbox: the SandboxWarmPool sandboxes are claimed from (its template must be oac's, with a deny-all NetworkPolicy: examples/kubernetes/sandbox-template.yaml)"`
	// Holder names whose shims own the objects (their annotation): one
	// host's, or a Deployment's, whose replicas restart with new host
	// names; default the host name.
	Holder string `flag:"k8s-holder" meta:"NAME" usage:"the holder written into the sandboxes' objects: a shim removes or takes over only its holder's (default: the host name; a shim Deployment's name when oac-shim runs in a Pod)"`
	// LeaseDuration is how long a sandbox's Lease stays a live shim's
	// without a renewal (default DefaultLeaseDuration).
	LeaseDuration time.Duration `flag:"k8s-lease-duration" meta:"DURATION" usage:"how long a sandbox's Lease outlives its shim's last renewal before a shim of the same holder takes the sandbox over (default 15s)"`
	Debug         bool
}

// Name implements provider.Provider.
func (p *Provider) Name() string { return "kubernetes" }

func init() {
	provider.Register(provider.Driver[Provider]{
		Name: "kubernetes",
		Defaults: &Provider{
			API: APIPods, PullPolicy: "IfNotPresent", UserNamespaces: "auto", Seccomp: DefaultSeccompProfile,
			Requests: "cpu=100m,memory=128Mi", Limits: "cpu=2,memory=2Gi", KeptSize: "10Gi",
		},
		New: func(p *Provider) provider.Provider { return p },
	})
}

// Capabilities implements provider.Provider: a node has none of this
// host's files, so the root, oac-sandbox-io, installs and volumes come
// from the image or the cluster; kept sandboxes are claims.
func (p *Provider) Capabilities() provider.Capabilities {
	return provider.Capabilities{
		Instead: map[provider.Feature]string{
			provider.FeatureRootfs:    "it runs an image: pass --k8s-image (oac-image build's OCI image, pushed to a registry the nodes pull from)",
			provider.FeatureSandboxIO: "a node cannot see this host's files: put oac-sandbox-io into the image (oac-image build --sandbox-io)",
			provider.FeatureInstall:   "a node cannot see this host's files: put the binary into the image (oac-image build --file)",
			provider.FeatureVolume:    "a node cannot see this host's directories: a kept sandbox (oac-shim create) keeps /home and /environment on a PersistentVolumeClaim",
		},
		Keeps: true,
	}
}
