//go:build linux

package e2e

import (
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
)

// The control API's reset of a kept sandbox (oac-shim start) means what
// oac-shim reset means: the next attempt finds none of what the first
// wrote; the sandbox and its record stay.
func TestTheControlResetOfAKeptSandboxStartsItFromItsImage(t *testing.T) {
	needBwrap(t)
	root, err := os.MkdirTemp("", "oac-e2e-keep-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(root) })
	require.NoError(t, os.Chmod(root, 0o711))
	name := uniqueName("keep-reset")
	out, err := exec.Command(bins.shim, "create", "--provider", "bwrap", "--name", name, "--agent", bins.guest,
		"--keep-root", root, "--install", "oac-daemon-standin="+bins.daemon).CombinedOutput()
	require.NoError(t, err, "%s", out)
	t.Cleanup(func() { _ = exec.Command(bins.shim, "destroy", "--name", name, "--keep-root", root).Run() })

	argv, _ := json.Marshal([]string{daemonBin, "serve", "--hostname", "127.0.0.1", "--port", "4096", "--marker", name,
		"--persist", "/home/runtime/reset-me", "--persist", "/usr/local/share/reset-me"})
	boot := `{"version":1,"daemon":{"argv":` + string(argv) + `},` +
		`"credentials":{"username_env":"OAC_SERVER_USERNAME","password_env":"OAC_SERVER_PASSWORD"},"health":{"port":4096}}`
	in, stdin, err := os.Pipe()
	require.NoError(t, err)
	defer stdin.Close()
	s := startShim(t, sandboxSpec{name: name, command: "start", bootstrap: boot, stdin: in,
		args: []string{"--keep-root", root, "--control", "stdin"}})
	in.Close()
	line := func(attempt uint64, prefix string) string {
		e := s.waitFor(func(e api.Event) bool {
			return e.Event == api.KindLog && e.Attempt == attempt && strings.HasPrefix(e.Line, prefix)
		}, bootTimeout, prefix)
		return strings.TrimPrefix(e.Line, prefix)
	}
	s.waitState(api.StateReady, bootTimeout)
	for _, f := range []string{"/home/runtime/reset-me", "/usr/local/share/reset-me"} {
		assert.Equal(t, "absent", line(1, "daemon: persist "+f+"="))
		assert.Equal(t, "ok", line(1, "daemon: persisted "+f+"="))
	}
	_, err = io.WriteString(stdin, `{"id":"r","cmd":"reset"}`+"\n")
	require.NoError(t, err)
	kept := s.waitFor(func(e api.Event) bool { return e.Event == api.KindKept }, 30*time.Second, "the kept event of the reset")
	assert.Contains(t, kept.Message, "reset: the kept state was discarded")
	s.waitFor(func(e api.Event) bool { return e.Event == api.KindState && e.State == api.StateReady && e.Attempt == 2 }, bootTimeout, "ready again")
	for _, f := range []string{"/home/runtime/reset-me", "/usr/local/share/reset-me"} {
		assert.Equal(t, "absent", line(2, "daemon: persist "+f+"="), "a reset takes it away")
	}
	s.signal(syscall.SIGTERM)
	s.waitState(api.StateStopped, 30*time.Second)
	assert.Equal(t, 0, s.exit(30*time.Second))
	rec, err := os.ReadFile(filepath.Join(root, "sandboxes", name, "record.json"))
	require.NoError(t, err, "the sandbox is still there")
	assert.Contains(t, string(rec), `"state": "stopped"`)
}
