package imagecli

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBuildAndListAnImage(t *testing.T) {
	dir := t.TempDir()
	agent := filepath.Join(dir, "oac-guest")
	require.NoError(t, os.WriteFile(agent, []byte("\x7fELF"), 0o755))
	extra := filepath.Join(dir, "daemon")
	require.NoError(t, os.WriteFile(extra, []byte("d"), 0o644))
	out := filepath.Join(dir, "initramfs.img")
	var stdout, stderr bytes.Buffer
	code := Main([]string{"initramfs", "--agent", agent, "--file", extra + ":/usr/bin/daemon:0750", "-o", out}, &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	assert.Contains(t, stderr.String(), "oac-image: wrote "+out)
	first, err := os.ReadFile(out)
	require.NoError(t, err)

	require.Equal(t, 0, Main([]string{"initramfs", "--agent", agent, "--file", extra + ":/usr/bin/daemon:0750", "-o", out}, &stdout, &stderr))
	again, err := os.ReadFile(out)
	require.NoError(t, err)
	assert.Equal(t, first, again, "reproducible through the CLI too")

	stdout.Reset()
	require.Equal(t, 0, Main([]string{"list", out}, &stdout, &stderr))
	assert.Contains(t, stdout.String(), "-rwxr-x---     0:0             1 /usr/bin/daemon\n")
	assert.Contains(t, stdout.String(), "/dev/console 5:1\n")
	assert.Contains(t, stdout.String(), "drwxr-xr-x     0:0             0 /\n")
}

func TestUsageErrorsExitTwo(t *testing.T) {
	var stdout, stderr bytes.Buffer
	for _, args := range [][]string{
		nil, {"bogus"}, {"initramfs"}, {"initramfs", "--agent", "a"}, {"initramfs", "-o", "x"},
		{"initramfs", "--agent", "a", "-o", "x", "--file", "nocolon"},
		{"initramfs", "--agent", "a", "-o", "x", "--file", "a:/b:999"},
		{"list"},
	} {
		assert.Equal(t, 2, Main(args, &stdout, &stderr), "%q", args)
	}
	assert.Equal(t, 1, Main([]string{"initramfs", "--agent", "/nonexistent", "-o", filepath.Join(t.TempDir(), "x")}, &stdout, &stderr))
	assert.Contains(t, stderr.String(), "read agent")
}

func TestModuleFlagTakesRepeatsAndCommaLists(t *testing.T) {
	var l listFlag
	require.NoError(t, l.Set("virtio_pci, virtio_console"))
	require.NoError(t, l.Set("vsock"))
	assert.Equal(t, listFlag{"virtio_pci", "virtio_console", "vsock"}, l)
}
