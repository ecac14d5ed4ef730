//go:build linux

package transport

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAListeningGuestTakesOneConnectionAndLeavesNoSocketBehind(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "oac", "session.sock")
	ep, err := Parse("unix+listen://" + sock)
	require.NoError(t, err)
	got := make(chan net.Conn, 1)
	go func() {
		c, err := ep.Dial(context.Background())
		assert.NoError(t, err)
		got <- c
	}()
	var bridge net.Conn
	require.Eventually(t, func() bool {
		bridge, err = net.Dial("unix", sock)
		return err == nil
	}, 5*time.Second, 5*time.Millisecond, "the guest listens")
	defer bridge.Close()
	guest := <-got
	defer guest.Close()

	st, err := os.Stat(filepath.Dir(sock))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), st.Mode().Perm(), "only the guest's root enters the socket's directory")
	_, err = os.Lstat(sock)
	assert.ErrorIs(t, err, os.ErrNotExist, "the socket is gone once its one connection is taken")
	_, err = net.Dial("unix", sock)
	assert.Error(t, err, "nobody connects a second time")

	_, err = bridge.Write([]byte("hello"))
	require.NoError(t, err)
	buf := make([]byte, 5)
	_, err = io.ReadFull(guest, buf)
	require.NoError(t, err)
	assert.Equal(t, "hello", string(buf))
}

func TestAListeningGuestGivesUpWhenItsContextEnds(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "oac", "session.sock")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := Endpoint{Scheme: SchemeUnixListen, Path: sock}.Dial(ctx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no connection")
	_, err = os.Lstat(sock)
	assert.ErrorIs(t, err, os.ErrNotExist)
}

func TestAListeningGuestRefusesADirectoryOthersCanEnter(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.Chmod(dir, 0o755))
	_, err := Endpoint{Scheme: SchemeUnixListen, Path: filepath.Join(dir, "session.sock")}.Dial(context.Background())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "only its owner can enter")
}

func TestRelayCarriesBothWaysAndEndsWhenItsInputEnds(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	var out strings.Builder
	done := make(chan error, 1)
	go func() { done <- Relay(a, strings.NewReader("to the agent"), &out) }()
	buf := make([]byte, len("to the agent"))
	_, err := io.ReadFull(b, buf)
	require.NoError(t, err)
	assert.Equal(t, "to the agent", string(buf))
	require.NoError(t, <-done, "an input at its end ends the relay")
	_, err = b.Write([]byte("x"))
	assert.Error(t, err, "the relay closed the agent's side")
}

func TestRelayEndsWhenTheAgentCloses(t *testing.T) {
	a, b := net.Pipe()
	in, inW := io.Pipe()
	defer inW.Close()
	var out strings.Builder
	done := make(chan error, 1)
	go func() { done <- Relay(a, in, &out) }()
	_, err := b.Write([]byte("from the agent"))
	require.NoError(t, err)
	b.Close()
	require.NoError(t, <-done)
	assert.Equal(t, "from the agent", out.String())
}

func TestABridgeWaitsForAnAgentThatIsNotListeningYet(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "oac", "session.sock")
	got := make(chan net.Conn, 1)
	go func() {
		c, err := DialRetry(context.Background(), Endpoint{Scheme: SchemeUnix, Path: sock})
		assert.NoError(t, err)
		got <- c
	}()
	// The bridge is already dialing (and failing) when the agent listens.
	guest, err := Endpoint{Scheme: SchemeUnixListen, Path: sock}.Dial(context.Background())
	require.NoError(t, err)
	defer guest.Close()
	bridge := <-got
	require.NotNil(t, bridge)
	bridge.Close()
}

func TestABridgeGivesUpWhenItsWaitEnds(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := DialRetry(ctx, Endpoint{Scheme: SchemeUnix, Path: filepath.Join(t.TempDir(), "absent.sock")})
	assert.Error(t, err)
}
