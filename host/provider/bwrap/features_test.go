package bwrap

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFeaturesAreReadFromTheBinarysHelp(t *testing.T) {
	dir := t.TempDir()
	old := filepath.Join(dir, "bwrap-0.4")
	require.NoError(t, os.WriteFile(old, []byte("#!/bin/sh\necho '    --unshare-user   Create new user namespace'\n"), 0o755))
	assert.False(t, bwrapFeatures(old).DisableUserns)
	recent := filepath.Join(dir, "bwrap-0.8")
	require.NoError(t, os.WriteFile(recent, []byte("#!/bin/sh\necho '    --disable-userns   Disable further use of user namespaces inside sandbox'\n"), 0o755))
	assert.True(t, bwrapFeatures(recent).DisableUserns)
	assert.False(t, bwrapFeatures(filepath.Join(dir, "missing")).DisableUserns)
	if path, err := exec.LookPath("bwrap"); err == nil {
		t.Logf("%s: %+v", path, bwrapFeatures(path))
	}
}
