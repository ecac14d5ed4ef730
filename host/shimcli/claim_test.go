package shimcli

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/host/apiserver"
	"github.com/oac/sandbox-agent/host/kept"
	"github.com/oac/sandbox-agent/internal/cli"
)

// claimWith runs oac-shim claim NAME args... against root's sandbox
// NAME, with the bootstrap on stdin.
func claimWith(root, name string, args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	env := cli.Env{Stdin: strings.NewReader(`{"version":1,"hostname":"tenant"}`), Stdout: &out, Stderr: &errb}
	code = claimCmd(append([]string{name, "--keep-root", root, "--bootstrap", "-"}, args...), env)
	return code, out.String(), errb.String()
}

func TestClaimSendsItsVolumesWithHostDirectoriesMadeAbsolute(t *testing.T) {
	root := shortRoot(t)
	got := make(chan api.Command, 1)
	newFakeOutliving(t, kept.OpenRegistry(root), "w", apiserver.HandlerFunc(func(_ context.Context, c api.Command) (any, error) {
		got <- c
		return api.ClaimResult{Attempt: 2, Forwards: []api.ForwardResult{}, Egress: []string{}}, nil
	}))
	wd := t.TempDir()
	t.Chdir(wd)

	home := filepath.Join(t.TempDir(), "home")
	code, stdout, stderr := claimWith(root, "w", "--volume", "/home="+home, "--volume", "/environment=env")
	require.Equal(t, 0, code, stderr)
	assert.JSONEq(t, `{"attempt":2,"forwards":[],"egress":[]}`, stdout)
	c := <-got
	assert.Equal(t, api.CmdClaim, c.Cmd)
	assert.JSONEq(t, `{"version":1,"hostname":"tenant"}`, string(c.Bootstrap))
	assert.Equal(t, []api.VolumeSpec{
		{Guest: "/environment", Host: filepath.Join(wd, "env")},
		{Guest: "/home", Host: home},
	}, c.Volumes, "in guest directory order, relative host directories against the caller's working directory")

	// Without --volume the claim carries no volumes key at all: what a
	// shim of schema version 8 took.
	line, err := claimLine("-", strings.NewReader(`{"version":1}`), nil, nil, nil, installFlag{})
	require.NoError(t, err)
	assert.Equal(t, `{"id":"claim","cmd":"claim","bootstrap":{"version":1}}`, string(line))
}

func TestClaimRefusesABadVolumeBeforeSendingAnything(t *testing.T) {
	root := shortRoot(t)
	sent := make(chan api.Command, 8)
	newFakeOutliving(t, kept.OpenRegistry(root), "w", apiserver.HandlerFunc(func(_ context.Context, c api.Command) (any, error) {
		sent <- c
		return api.ClaimResult{}, nil
	}))
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"--volume", "/tmp=/srv/x"}, "a volume can replace only /home or /environment"},
		{[]string{"--volume", "/home"}, "want NAME=PATH"},
		{[]string{"--volume", "/home="}, "want NAME=PATH"},
		{[]string{"--volume", "=/srv/x"}, "want NAME=PATH"},
		{[]string{"--volume", "/home=/a", "--volume", "/home=/b"}, "/home given twice"},
	} {
		code, stdout, stderr := claimWith(root, "w", tc.args...)
		assert.Equal(t, api.ExitUsage, code, "%v", tc.args)
		assert.Empty(t, stdout, "%v", tc.args)
		assert.Contains(t, stderr, tc.says, "%v", tc.args)
	}
	assert.Empty(t, sent, "no claim reached the sandbox")
}

func TestClaimSaysWhyTheShimRefusedItsVolumes(t *testing.T) {
	root := shortRoot(t)
	newFakeOutliving(t, kept.OpenRegistry(root), "w", apiserver.HandlerFunc(func(_ context.Context, c api.Command) (any, error) {
		return nil, api.Refuse(api.AnswerUnsupported, errors.New("volumes need a provider that shares the host's kernel"))
	}))
	code, stdout, stderr := claimWith(root, "w", "--volume", "/home=/srv/x")
	assert.Equal(t, 1, code)
	assert.Empty(t, stdout)
	assert.Contains(t, stderr, "w refused the claim (unsupported): volumes need a provider that shares the host's kernel")
}
