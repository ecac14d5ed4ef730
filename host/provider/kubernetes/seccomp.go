package kubernetes

// DefaultSeccompProfile is the Localhost profile the Pods ask for unless
// told otherwise: examples/kubernetes/oac-seccomp.json installed as this
// name in each node's kubelet seccomp directory.
const DefaultSeccompProfile = "oac-seccomp.json"
