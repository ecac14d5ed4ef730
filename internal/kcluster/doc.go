// Package kcluster assembles and runs a real single-node Kubernetes cluster
// for tests, from parts that install here without a download: Debian's
// etcd-server, containerd and containernetworking-plugins, and a
// kube-apiserver and a kubelet built from the k8s.io/kubernetes Go module by
// the separate module in tools/k8s (the main module never depends on
// k8s.io/kubernetes; this package uses the standard library and
// golang.org/x/sys only).
//
// Start builds the two binaries (or takes prebuilt ones, or reuses a cache
// directory so a second run is fast), writes a CA, serving and client
// certificates, a service-account key pair, a token file, a kubeconfig and
// the configurations of every daemon into one temporary directory, starts
// etcd, a private containerd (its own root, state, socket, runc root,
// config and CNI network), the apiserver and the kubelet as child
// processes, builds and imports a pause image of its own (a static Go
// program in an OCI archive it writes), and waits until the node is Ready,
// talking to the API over HTTPS with a bearer token (net/http and
// encoding/json, no client library). The apiserver allows everything
// (AlwaysAllow): the cluster is for tests on this machine only and listens
// on loopback, the kubelet on the node's own address. Cluster.Do and Get
// call the API; Cluster.Exec runs a command in a container through the
// pods/exec subresource over a websocket (v5.channel.k8s.io, written by
// hand on crypto/tls); Cluster.ImportImage imports an OCI archive (as
// WriteOCIArchive and StaticBinaryImage write) for Pods with
// imagePullPolicy: Never.
//
// Stop deletes the cluster's pods, ends every process it started by its
// pid, removes the containers and tasks left in containerd's k8s.io
// namespace, the CNI bridge and the network namespaces that appeared while
// it ran, the iptables chains the kubelet made, the mounts the kubelet left
// under its root directory, its cgroup root, the temporary directory and
// the fixed host paths the kubelet and containerd 1.6 use whatever their
// configuration says (/var/lib/kubelet/device-plugins, /run/containerd/s,
// /var/lib/cni, /var/log/containers) when Start did not find them, so the
// host is left as it was found. The network namespaces it removes are
// those named cni-* that appeared while it ran: two clusters (or another
// CRI runtime) must not run at once on one machine.
//
// It owns the life of the cluster it started only. It must not touch a
// system containerd, etcd or kubelet, /var/lib/containerd or
// /var/lib/kubelet, nor anything of the host that existed before Start;
// it must not download anything (images are imported with
// imagePullPolicy: Never in mind); and it is not a provider: a Kubernetes
// provider is to be built on it.
package kcluster
