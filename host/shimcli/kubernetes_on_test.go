//go:build kubernetes

package shimcli

// kubernetesBuilt: this test binary has the kubernetes provider.
const kubernetesBuilt = true
