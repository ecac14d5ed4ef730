package shimcli

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/host/kept"
	"github.com/oac/sandbox-agent/host/provider"
)

// blockingProvider's Create waits until the test lets it fail: the shim
// is running meanwhile.
type blockingProvider struct{ creating, release chan struct{} }

func (*blockingProvider) Name() string                        { return "blocking" }
func (*blockingProvider) Capabilities() provider.Capabilities { return provider.Capabilities{} }
func (*blockingProvider) Check(context.Context) error         { return nil }
func (p *blockingProvider) Create(context.Context, provider.Spec) (provider.Instance, error) {
	close(p.creating)
	<-p.release
	return nil, errors.New("no runtime here")
}

// A running shim is listed, with its own pid and its control socket's
// absolute path, from before its sandbox is created until it exits.
func TestARunningShimAnnouncesItselfUntilItExits(t *testing.T) {
	p := &blockingProvider{creating: make(chan struct{}), release: make(chan struct{})}
	provider.Register(provider.Driver[struct{}]{Name: "blocking-test", New: func(*struct{}) provider.Provider { return p }})
	t.Cleanup(func() { provider.Unregister("blocking-test") })
	keep := t.TempDir()
	ctl := filepath.Join(t.TempDir(), "a.ctl")
	done := make(chan int)
	go func() {
		code, _, _ := shimMain("run", "--provider", "blocking-test", "--name", "ann", "--agent", "/nonexistent/oac-guest",
			"--keep-root", keep, "--control-socket", ctl)
		done <- code
	}()
	<-p.creating
	live, cleaned, err := kept.OpenRegistry(keep).List()
	require.NoError(t, err)
	assert.Empty(t, cleaned)
	require.Len(t, live, 1)
	e := live[0].Entry()
	assert.Equal(t, "ann", e.Name)
	assert.Equal(t, api.RunThrowaway, e.Kind)
	assert.Equal(t, "blocking-test", e.Provider)
	assert.Equal(t, os.Getpid(), e.PID)
	assert.Equal(t, ctl, e.ControlSocket)
	start, err := procStart(os.Getpid())
	require.NoError(t, err)
	assert.Equal(t, start, live[0].Record.ProcStart, "what proves the process")

	close(p.release)
	assert.Equal(t, api.FailureOf(api.CodeRuntimeFailed).Exit, <-done)
	live, cleaned, err = kept.OpenRegistry(keep).List()
	require.NoError(t, err)
	assert.Empty(t, live, "its entry ends with it")
	assert.Empty(t, cleaned, "removed by the shim, not left to a listing")
}
