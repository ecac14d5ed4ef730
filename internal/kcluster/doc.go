// Package kcluster assembles and runs a real single-node Kubernetes cluster
// for tests, from parts that install here without a download: Debian's
// etcd-server, containerd and containernetworking-plugins, and a
// kube-apiserver, a kube-scheduler, a kube-controller-manager and a kubelet
// built from the k8s.io/kubernetes Go module by the separate module in
// tools/k8s (the main module never depends on k8s.io/kubernetes; this
// package uses the standard library and golang.org/x/sys only).
//
// Start builds the four binaries in one go build (or takes prebuilt ones,
// or reuses a cache directory so a second run is fast), writes a CA, a
// front-proxy CA, serving and client certificates, a service-account key
// pair, a token file, kubeconfigs and the configurations of every daemon
// into one temporary directory, starts etcd, a private containerd (its own
// root, state, socket, runc root, config and CNI network), the apiserver,
// the scheduler, the controller manager and the kubelet as child
// processes, builds and imports a pause image of its own (a static Go
// program in an OCI archive it writes), and waits until the node is Ready
// and schedulable and namespace default has its ServiceAccount, talking to
// the API over HTTPS with a bearer token (net/http and encoding/json, no
// client library).
//
// The cluster behaves as a real one where a provider can tell: the
// scheduler places Pods that name no node; the controller manager runs
// its default controllers, each as its own service account (garbage
// collector, namespace, service account and token, root CA publisher,
// volume binder, CSR signer, ...), with the single-node hostPath
// provisioner; StorageClass is the default class (a claim binds at once
// to a directory below HostPathPVDir, removed with the claim); the
// apiserver authorizes with Node and RBAC and admits with the
// ServiceAccount and NodeRestriction plugins among its defaults. Token is
// in system:masters; the kubelet is system:node:NAME; Cluster.User issues
// a client certificate and kubeconfig of an unprivileged user that RBAC
// grants nothing until a test binds it a Role (IsForbidden tells the 403).
// It listens on loopback (the kubelet on the node's own address): the
// cluster is for tests on this machine only. There is no kube-proxy, so
// Service addresses do not route.
//
// Cluster.Do and Get call the API; Cluster.Exec runs a command in a
// container through the pods/exec subresource over a websocket
// (v5.channel.k8s.io, written by hand on crypto/tls), and ExecTo streams
// its input and output instead of holding them; Cluster.ImportImage
// imports an OCI archive (as WriteOCIArchive and StaticBinaryImage write)
// for Pods with imagePullPolicy: Never.
//
// Cluster.StartAgentSandbox runs Kubernetes' agent-sandbox on a started
// cluster: its four CRDs and its controller's ClusterRoles from the
// sigs.k8s.io/agent-sandbox module, and agent-sandbox-controller with
// its extensions (SandboxTemplate, SandboxWarmPool, SandboxClaim) as a
// process of the cluster with a client certificate of its own; the
// separate module tools/agent-sandbox builds it, once, into a cache
// directory (EnsureAgentSandbox).
//
// Cluster.StartNetworkPolicy runs a NetworkPolicy enforcer beside the
// bridge CNI (which enforces none): kube-router's firewall alone, from
// the github.com/cloudnativelabs/kube-router/v2 module, built by the
// separate module tools/netpol into a cache directory
// (EnsureNetworkPolicy), as a process of the cluster with a client
// certificate of its own and a ClusterRole that reads what it enforces.
// It holds back the traffic of Pods that policies select with iptables
// chains and ipsets; PodPolicies reads from them which policies a Pod's
// traffic goes through.
//
// Stop ends agent-sandbox's controller, the controller manager and the
// scheduler (so nothing makes Pods again), deletes the cluster's pods, ends every other process it
// started by its pid, removes the containers and tasks left in
// containerd's k8s.io namespace, the CNI bridge and the network namespaces
// that appeared while it ran, the iptables chains the kubelet and the
// enforcer made (and the rules that jump to them), the enforcer's ipsets, the
// mounts the kubelet left under its root directory, its cgroup root, the
// temporary directory, the kubelet's links to container logs pointing
// into it, the hostPath volumes that appeared below HostPathPVDir while it
// ran (and that directory when Start did not find it), and the fixed host
// paths the kubelet and containerd 1.6 use whatever their configuration
// says (/var/lib/kubelet/device-plugins, /run/containerd/s, /var/lib/cni,
// /var/log/containers) when Start did not find them, so the host is left
// as it was found; Leftovers lists whatever of this remains. The network
// namespaces and volumes it removes are those that appeared while it ran:
// two clusters (or another CRI runtime, or another hostPath provisioner)
// must not run at once on one machine (Start refuses to when another
// interface has the Pods' gateway: a bridge on the same subnet, even one
// a killed run left, takes the answers to the Pods' packets).
//
// It owns the life of the cluster it started only. It must not touch a
// system containerd, etcd or kubelet, /var/lib/containerd or
// /var/lib/kubelet, nor anything of the host that existed before Start;
// it must not download anything (images are imported with
// imagePullPolicy: Never in mind); and it is not a provider: a Kubernetes
// provider is to be built on it.
package kcluster
