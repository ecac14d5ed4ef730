package kit

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/host/provider"
)

func TestCheckHostPathsResolvesEveryPathOnceAndNamesTheFlagItRefuses(t *testing.T) {
	dir := t.TempDir()
	file := func(name string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte("#!/bin/sh\n"), mode))
		require.NoError(t, os.Chmod(p, mode))
		return p
	}
	agent, tool, private := file("oac-guest", 0o755), file("tool", 0o755), file("private", 0o700)
	home := filepath.Join(dir, "home")
	require.NoError(t, os.Mkdir(home, 0o755))
	t.Chdir(dir)

	hp, err := CheckHostPaths(provider.Spec{AgentPath: "oac-guest", SandboxIOPath: tool, Install: map[string]string{"tool": "tool"},
		Volumes: map[string]string{"/home": "home"}})
	require.NoError(t, err)
	assert.Equal(t, agent, hp.Agent, "relative paths come back absolute: runtimes run elsewhere")
	assert.Equal(t, map[string]string{"/home": home}, hp.Volumes)
	assert.Equal(t, [][2]string{{"oac-sandbox-io", tool}, {"tool", tool}}, hp.Installs, "in InstallNames order")

	for want, spec := range map[string]provider.Spec{
		"agent binary: " + private + " must be a regular file readable and executable by others": {AgentPath: private},
		"agent binary: " + home + " must be a regular file":                                      {AgentPath: home},
		"volume /home: " + agent + " is not a directory":                                         {AgentPath: agent, Volumes: map[string]string{"/home": agent}},
		"install tool: " + private + " must be a regular file readable and executable by others (uid 1000 runs it)": {
			AgentPath: agent, Install: map[string]string{"tool": private}},
	} {
		_, err := CheckHostPaths(spec)
		assert.ErrorIs(t, err, provider.ErrInvalidSpec)
		assert.ErrorContains(t, err, want)
	}
}
