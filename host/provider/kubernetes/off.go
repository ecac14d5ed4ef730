//go:build !kubernetes

package kubernetes

import "github.com/oac/sandbox-agent/host/provider"

// Without the kubernetes build tag the driver is known but unavailable:
// client-go would double every shim's memory (see doc.go).
func init() {
	provider.Register(provider.Driver[struct{}]{
		Name: "kubernetes",
		Note: "(in oac-shim-kubernetes, a build of oac-shim with -tags kubernetes)",
		New: func(*struct{}) provider.Provider {
			return provider.Unavailable("kubernetes", "this oac-shim is built without the kubernetes provider: run oac-shim-kubernetes (make build makes it), or build oac-shim with -tags kubernetes")
		},
	})
}
