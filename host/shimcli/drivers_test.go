package shimcli

import (
	"flag"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/host/provider"
)

// TestEveryProviderDeclaresWhatItDoes holds each registered provider, as
// oac-shim builds it with default flags, to its Capabilities: it keeps
// sandboxes exactly when it can discard them, and it says what to do
// instead only for features it does not honour.
func TestEveryProviderDeclaresWhatItDoes(t *testing.T) {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	ctors := provider.Declare(fs)
	require.NoError(t, fs.Parse(nil))
	keeps := map[string]bool{}
	for name, ctor := range ctors {
		p := ctor()
		caps := p.Capabilities()
		_, discards := p.(provider.Keeper)
		assert.Equal(t, discards, caps.Keeps, "%s: keeps sandboxes exactly when it implements Keeper", name)
		for _, f := range caps.Honours {
			assert.Contains(t, provider.AllFeatures, f, name)
		}
		for f := range caps.Instead {
			assert.NotContains(t, caps.Honours, f, "%s: advice instead of %s, which it honours", name, f)
		}
		keeps[name] = caps.Keeps
	}
	if runtime.GOOS == "linux" {
		assert.Equal(t, map[string]bool{"bwrap": true, "docker": true, "kubernetes": kubernetesBuilt, "oci": true, "qemu": true, "vz": true, "wsl": true}, keeps,
			"every provider keeps sandboxes (kubernetes where oac-shim is built with it)")
	}
}
