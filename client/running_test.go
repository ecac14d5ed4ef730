package client

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
)

// fakeShort plays oac-shim's list --running and stop: it writes its argv
// to $FAKE_ARGS and prints a report; a sandbox named "stuck" is killed
// (exit status 1), as the real shim reports one that outlived the grace.
func fakeShort(args []string) int {
	_ = os.WriteFile(os.Getenv("FAKE_ARGS"), []byte(strings.Join(args, " ")), 0o600)
	enc := json.NewEncoder(os.Stdout)
	switch args[0] {
	case "create", "reset", "destroy":
		if slices.Contains(args, "busy") {
			fmt.Fprintln(os.Stderr, "oac-shim: kept sandbox busy: in use by another oac-shim")
			return 4
		}
		fmt.Printf("%sd %s\n", args[0], args[2])
		return 0
	case "list":
		if !slices.Contains(args, "--running") {
			_ = enc.Encode(api.ListReport{SchemaVersion: api.SchemaVersion, Sandboxes: []api.ListEntry{{Name: "work", Provider: "bwrap", State: api.KeptStopped, SizeBytes: 4096}}})
			return 0
		}
		_ = enc.Encode(api.RunningReport{SchemaVersion: api.SchemaVersion, Cleaned: []api.CleanedEntry{},
			Sandboxes: []api.RunningEntry{{Name: "a", Kind: api.RunThrowaway, Provider: "bwrap", PID: 10, ControlSocket: "/run/a.ctl", Version: "dev"}}})
		return 0
	case "stop":
		rep := api.StopReport{SchemaVersion: api.SchemaVersion, GraceMS: 30000, Cleaned: []api.CleanedEntry{}, AllStopped: true}
		for i := 1; i < len(args); i++ {
			n := args[i]
			switch {
			case n == "--grace" || n == "--keep-root":
				i++ // its value
			case n == "stuck":
				rep.Sandboxes = append(rep.Sandboxes, api.StopEntry{Name: n, Outcome: api.StopKilled, Via: api.StopViaSignal})
				rep.AllStopped = false
			case !strings.HasPrefix(n, "-"):
				rep.Sandboxes = append(rep.Sandboxes, api.StopEntry{Name: n, Outcome: api.StopStopped, Via: api.StopViaControl})
			}
		}
		_ = enc.Encode(rep)
		if !rep.AllStopped {
			return 1
		}
		return 0
	}
	return 2
}

func short(t *testing.T) (Sandboxes, func() string) {
	argsFile := filepath.Join(t.TempDir(), "args")
	o := Sandboxes{Shim: os.Args[0], KeepRoot: "/keep", Env: append(os.Environ(), "FAKE_SHIM=short", "FAKE_ARGS="+argsFile)}
	return o, func() string { b, _ := os.ReadFile(argsFile); return string(b) }
}

func TestListReturnsTheRunningSandboxesOfTheKeepRoot(t *testing.T) {
	o, argv := short(t)
	rep, err := List(context.Background(), o)
	require.NoError(t, err)
	assert.Equal(t, "list --keep-root /keep --running --json", argv())
	require.Len(t, rep.Sandboxes, 1)
	assert.Equal(t, "/run/a.ctl", rep.Sandboxes[0].ControlSocket)
}

func TestStopAllAndStopNamedReportEachAndErrWhenOneWasNotStoppedInOrder(t *testing.T) {
	o, argv := short(t)
	rep, err := StopAll(context.Background(), o, 0)
	require.NoError(t, err)
	assert.Equal(t, "stop --keep-root /keep --json --all", argv())
	assert.True(t, rep.AllStopped)

	rep, err = StopNamed(context.Background(), o, 5*time.Second, "a", "stuck")
	assert.ErrorIs(t, err, ErrNotAllStopped)
	assert.EqualError(t, err, "client: not every sandbox stopped in order: stuck killed")
	assert.Equal(t, "stop --keep-root /keep --json --grace 5s a stuck", argv())
	require.Len(t, rep.Sandboxes, 2)
	assert.True(t, slices.ContainsFunc(rep.Sandboxes, func(e api.StopEntry) bool { return e.Name == "a" && e.Outcome == api.StopStopped }))

	_, err = StopNamed(context.Background(), o, 0)
	assert.Error(t, err, "no names")
	_, err = List(context.Background(), Sandboxes{Shim: "/nonexistent/oac-shim"})
	assert.Error(t, err)
}

func TestKeptSandboxesAreCreatedResetDestroyedAndListedByTheShortCommands(t *testing.T) {
	o, argv := short(t)
	require.NoError(t, CreateKept(context.Background(), o, KeptSpec{Name: "work", Provider: "bwrap", Rootfs: "/img", Agent: "/bin/g",
		SandboxIO: "/bin/sio", Install: []string{"d=/bin/d"}, Args: []string{"--bwrap-foo=1"}}))
	assert.Equal(t, "create --keep-root /keep --name work --provider bwrap --rootfs /img --agent /bin/g --sandbox-io /bin/sio --install d=/bin/d --bwrap-foo=1", argv())
	require.NoError(t, ResetKept(context.Background(), o, "work", ""))
	assert.Equal(t, "reset --keep-root /keep --name work", argv())
	require.NoError(t, ResetKept(context.Background(), o, "work", "/bin/g"))
	assert.Equal(t, "reset --keep-root /keep --name work --agent /bin/g", argv())
	require.NoError(t, DestroyKept(context.Background(), o, "work"))
	assert.Equal(t, "destroy --keep-root /keep --name work", argv())
	rep, err := ListKept(context.Background(), o)
	require.NoError(t, err)
	assert.Equal(t, "list --keep-root /keep --json", argv())
	require.Len(t, rep.Sandboxes, 1)
	assert.Equal(t, api.KeptStopped, rep.Sandboxes[0].State)

	err = DestroyKept(context.Background(), o, "busy")
	assert.EqualError(t, err, "client: oac-shim destroy: exit status 4 (oac-shim: kept sandbox busy: in use by another oac-shim)", "the shim's own words")
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, 4, ee.ExitCode())
}
