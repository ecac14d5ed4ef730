// Package kubernetes is the provider for clusters: each sandbox is one Pod,
// made through client-go (a kubeconfig, --kubeconfig, or the Pod's own
// service account when oac-shim runs in the cluster), from the guest image
// oac-image builds (--k8s-image; the image holds oac-guest as /sbin/oac-guest,
// oac-sandbox-io and anything else the sandbox runs: a node cannot see this
// host's files).
//
// The agent is the Pod's PID 1 and waits on an owner-only unix socket
// (transport unix+listen). The session reaches it over the API server:
// pods/exec of `oac-guest bridge`, which relays the exec stream to that
// socket (client-go's WebSocket executor, SPDY when the server refuses the
// upgrade). Attach is not used: the kubelet writes an attached process's
// stdout to the container log, bootstrap included. No data plane beside
// the session: egress connections are session streams.
//
// The Pod is as tight as the cluster allows (see podSpec, and
// docs/kubernetes.md for what each field buys): no service account token,
// no host namespace or path, no service links, a read-only root, guest
// root with the hosted contract's capabilities only, no privilege
// escalation, the seccomp profile the agent needs (a Localhost profile the
// nodes hold, examples/kubernetes/oac-seccomp.json), user namespaces when
// every node says it supports them (--k8s-user-namespaces), a RuntimeClass
// when asked for (gVisor, Kata), requests and limits. A NetworkPolicy that
// denies the Pod all ingress and egress is made before the Pod and owned
// by it once the Pod exists. A kept sandbox's /home, /environment and
// /usr/local live on a PersistentVolumeClaim of its own, seeded from the
// image by an init container (oac-guest seed-kept).
//
// Everything it makes carries labels (app.kubernetes.io/managed-by,
// oac.dev/sandbox, oac.dev/kept) and an annotation naming the holder whose
// shims made it (--k8s-holder: the host name, or a shim Deployment's
// name). The lock on a sandbox's name is a Lease in the cluster (lease.go),
// held by one shim process and renewed while it runs, so a shim Pod that
// restarts with a new host name and an empty file system finds its
// sandboxes: a leftover of a killed shim is found by its labels, never
// from memory, and removed by the next command of that holder once the
// killed shim's Lease went unrenewed (a Create sweeps every sandbox of
// this holder whose Lease is gone or long unrenewed).
//
// It is built into oac-shim only with the build tag kubernetes (make build
// makes that build as oac-shim-kubernetes): client-go's packages hold
// about 8 MiB at start, which would double the memory of every shim of
// every provider. Without the tag the driver is registered as unavailable
// and says which binary has it.
//
// WarmPod is the same Pod for a warm sandbox, less what is one sandbox's,
// and SandboxTemplate wraps it for agent-sandbox's warm pools
// (examples/kubernetes/sandbox-template.yaml is written from it); the
// provider itself still makes bare Pods.
//
// It owns the Pod, policy, claim and Lease of each sandbox, the warm
// Pod's template and the exec bridge.
// It must not speak the protocol (package sandbox does), build images,
// reach a node directly, or touch an object without its labels.
package kubernetes
