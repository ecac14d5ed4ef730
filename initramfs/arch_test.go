package initramfs

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestKernelArchReadsTheBootHeader(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, b, 0o644))
		return p
	}
	x86 := make([]byte, 0x400)
	copy(x86[0x202:], "HdrS")
	arm := make([]byte, 0x400)
	copy(arm[0x38:], "ARM\x64")
	a, err := KernelArch(write("bz", x86))
	require.NoError(t, err)
	assert.Equal(t, ArchAMD64, a)
	a, err = KernelArch(write("Image", arm))
	require.NoError(t, err)
	assert.Equal(t, ArchARM64, a)
	_, err = KernelArch(write("gz", append([]byte{0x1f, 0x8b}, make([]byte, 0x400)...)))
	assert.ErrorContains(t, err, "an arm64 kernel must be uncompressed")
	_, err = KernelArch(write("short", []byte("k")))
	assert.ErrorContains(t, err, "too short")
}

func TestBinaryArchOfThisTestAndOfNonELFFiles(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)
	a, err := BinaryArch(exe)
	require.NoError(t, err)
	assert.Equal(t, runtime.GOARCH, a)
	script := filepath.Join(t.TempDir(), "script")
	require.NoError(t, os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755))
	a, err = BinaryArch(script)
	require.NoError(t, err)
	assert.Empty(t, a, "not ELF: nothing to say")
	bad := filepath.Join(t.TempDir(), "bad")
	require.NoError(t, os.WriteFile(bad, []byte("\x7fELF truncated"), 0o755))
	_, err = BinaryArch(bad)
	assert.Error(t, err)
}

func TestComposeOverlayPadsTheBaseAndAppendsTheFiles(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "base.img")
	require.NoError(t, os.WriteFile(base, []byte("12345"), 0o644))
	tool := filepath.Join(dir, "tool")
	require.NoError(t, os.WriteFile(tool, []byte("#!tool"), 0o600))
	out := filepath.Join(dir, "out.img")
	require.NoError(t, ComposeOverlay(base, out, []File{{Src: tool, Dst: "/usr/local/bin/tool"}}))
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	assert.Equal(t, "12345\x00\x00\x00", string(b[:8]), "the next archive starts at a multiple of 4")
	assert.Equal(t, []byte{0x1f, 0x8b}, b[8:10])
	assert.ErrorContains(t, ComposeOverlay(base, out, nil), "file exists", "never overwrites")
	assert.Error(t, ComposeOverlay(base, filepath.Join(dir, "x.img"), []File{{Src: tool, Dst: "relative"}}))
	_, err = os.Stat(filepath.Join(dir, "x.img"))
	assert.True(t, os.IsNotExist(err), "a failed composition leaves nothing")
}
