package sockfile

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestListenMakesAnOwnerOnlySocketAndRemovesItOnClose(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "ctl.sock")
	ln, err := Listen(p)
	require.NoError(t, err)
	st, err := os.Lstat(p)
	require.NoError(t, err)
	assert.Equal(t, os.ModeSocket, st.Mode().Type())
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	assert.Equal(t, p, ln.Addr().String())
	ents, _ := os.ReadDir(dir)
	assert.Len(t, ents, 1, "no temporary directory left behind")

	go func() {
		c, err := ln.Accept()
		if err == nil {
			c.Close()
		}
	}()
	c, err := net.Dial("unix", p)
	require.NoError(t, err)
	c.Close()
	require.NoError(t, ln.Close())
	_, err = os.Lstat(p)
	assert.True(t, os.IsNotExist(err))
}

func TestListenReplacesAStaleSocketButNotALiveOneNorAFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "s")
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
	require.NoError(t, err)
	stale.SetUnlinkOnClose(false)
	stale.Close()
	ln, err := Listen(p)
	require.NoError(t, err, "a stale socket is replaced")

	_, err = Listen(p)
	assert.ErrorContains(t, err, "another process is listening")
	ln.Close()

	f := filepath.Join(dir, "file")
	require.NoError(t, os.WriteFile(f, []byte("x"), 0o600))
	_, err = Listen(f)
	assert.ErrorContains(t, err, "not a socket")
	b, _ := os.ReadFile(f)
	assert.Equal(t, "x", string(b), "left alone")
}

func TestListenRefusesRelativeAndOverlongPaths(t *testing.T) {
	_, err := Listen("ctl.sock")
	assert.ErrorContains(t, err, "absolute")
	_, err = Listen("/tmp/" + strings.Repeat("x", 120))
	assert.ErrorContains(t, err, "longer than")
}
