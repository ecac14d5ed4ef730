package shimcli

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/host/sandbox"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

// passwordShim is a test shim whose attempts each hand over a generated
// password, then fail at Create (failingProvider): what a reset or a
// restart after a failure starts.
func passwordShim(t *testing.T, file string) *shim {
	t.Helper()
	s, _ := newTestShim(t)
	s.f.passwordFile = file
	s.base = sandbox.Config{Name: "unit", Provider: failingProvider{}, AgentPath: "/nonexistent", Log: slog.New(slog.DiscardHandler),
		Bootstrap: &bootstrap.Bootstrap{Version: 1, Daemon: &bootstrap.Process{Argv: []string{"/usr/local/bin/daemon"}},
			Credentials: &bootstrap.Credentials{UsernameEnv: "U", PasswordEnv: "P"}}}
	return s
}

// attempt starts (first) or resets (after) and waits for the attempt to
// end; it returns the attempt's error.
func attempt(t *testing.T, s *shim, cmd string) (uint64, error) {
	t.Helper()
	res, err := s.Handle(context.Background(), api.Command{Cmd: cmd})
	require.NoError(t, err)
	a := res.(api.StartResult).Attempt
	s.ctrl.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return a, s.results[a]
}

func readPassword(t *testing.T, path string) string {
	t.Helper()
	st, err := os.Lstat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode(), "a regular file, mode 0600")
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Len(t, string(b), 43, "a generated password")
	return string(b)
}

func TestThePasswordFileHoldsEachAttemptsPassword(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "password")
	s := passwordShim(t, file)
	a, err := attempt(t, s, api.CmdStart)
	assert.Equal(t, uint64(1), a)
	assert.ErrorContains(t, err, "no runtime here", "the attempt got past the password to Create")
	first := readPassword(t, file)

	a, err = attempt(t, s, api.CmdReset)
	assert.Equal(t, uint64(2), a)
	assert.ErrorContains(t, err, "no runtime here", "the second attempt is not refused for the file the first wrote")
	second := readPassword(t, file)
	assert.NotEqual(t, first, second, "each attempt generates its own password, and the file has the current one")

	// The caller may remove the file once read: the next attempt writes it again.
	require.NoError(t, os.Remove(file))
	_, err = attempt(t, s, api.CmdReset)
	assert.ErrorContains(t, err, "no runtime here")
	third := readPassword(t, file)
	assert.NotEqual(t, second, third)
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, ents, 1, "no temporary file left beside it")
}

func TestAPasswordFileThatExistedBeforeTheShimIsNeverOverwritten(t *testing.T) {
	file := filepath.Join(t.TempDir(), "password")
	require.NoError(t, os.WriteFile(file, []byte("the caller's"), 0o644))
	s := passwordShim(t, file)
	for _, cmd := range []string{api.CmdStart, api.CmdReset} {
		_, err := attempt(t, s, cmd)
		assert.ErrorContains(t, err, "password file: open "+file+": file exists (give a path that does not exist yet)", cmd)
		b, rerr := os.ReadFile(file)
		require.NoError(t, rerr)
		assert.Equal(t, "the caller's", string(b), "%s: not this shim's file", cmd)
	}
}

func TestThePasswordFDGetsALinePerAttemptAndSaysWhenItWasClosed(t *testing.T) {
	s := passwordShim(t, "")
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer w.Close()
	s.f.passwordFD = int(w.Fd())
	s.passwordOut = w
	lines := bufio.NewScanner(r)
	var pws []string
	for i, cmd := range []string{api.CmdStart, api.CmdReset} {
		a, err := attempt(t, s, cmd)
		assert.ErrorContains(t, err, "no runtime here")
		require.True(t, lines.Scan())
		var n uint64
		var pw string
		_, serr := fmt.Sscan(lines.Text(), &n, &pw)
		require.NoError(t, serr)
		assert.Equal(t, a, n, "line %d names its attempt", i)
		assert.Len(t, pw, 43)
		pws = append(pws, pw)
	}
	assert.NotEqual(t, pws[0], pws[1])

	// A reader that closed its end after the first lines: the next
	// attempt fails before it creates anything, and says why.
	require.NoError(t, r.Close())
	_, err = attempt(t, s, api.CmdReset)
	assert.ErrorContains(t, err, "attempt 3's password: write |1: broken pipe (the descriptor must stay open for a line per attempt)")
	assert.NotContains(t, err.Error(), "no runtime here", "nothing was created")
	st := s.ctrl.Status()
	assert.Equal(t, api.StateFailed, st.State)
	assert.Equal(t, api.CodeInvalidConfig, st.Code)
}
