package shimcli

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/host/persist"
	"github.com/oac/sandbox-agent/schema"
)

// Every command, and oac-shim itself, prints its usage on stdout and
// exits 0 for -h and --help, before or after its other arguments.
func TestEveryCommandsHelpIsOnStdoutWithStatusZero(t *testing.T) {
	paths := program().Paths()
	require.Contains(t, paths, "stop")
	for path := range paths {
		for _, args := range [][]string{
			append(strings.Fields(path), "-h"),
			append(strings.Fields(path), "--help"),
			append(strings.Fields(path), "sb1", "--help"),
		} {
			if path == "" && len(args) > 1 {
				continue
			}
			code, out, errOut := shimMain(args...)
			assert.Equal(t, 0, code, "%q: %s", args, errOut)
			assert.Empty(t, errOut, "%q", args)
			assert.True(t, strings.HasPrefix(out, "usage: oac-shim"), "%q: %s", args, out)
		}
	}
	_, out, _ := shimMain("run", "--help")
	assert.Contains(t, out, "usage: oac-shim run [flags] NAME\n")
	assert.Contains(t, out, "  --provider string\n")
	assert.Contains(t, out, "  --single-uid\n", "the providers' flags too")
}

func TestStopTakesItsFlagsAfterTheNames(t *testing.T) {
	root := t.TempDir()
	code, out, errOut := shimMain("stop", "sb1", "sb2", "--grace", "5s", "--keep-root", root, "--json")
	require.Equal(t, 0, code, errOut)
	var rep api.StopReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	assert.Equal(t, int64(5000), rep.GraceMS)
	require.Len(t, rep.Sandboxes, 2)
	assert.Equal(t, api.StopNotRunning, rep.Sandboxes[0].Outcome)
	assert.Equal(t, "sb2", rep.Sandboxes[1].Name)

	code, _, errOut = shimMain("stop", "--name", "sb1", "--keep-root", root)
	assert.Equal(t, 0, code, errOut)
	code, _, errOut = shimMain("stop", "sb1", "--name", "sb2", "--keep-root", root)
	assert.Equal(t, 2, code)
	assert.Equal(t, "oac-shim stop: NAME sb1 and --name sb2 differ: give the name once\n", errOut)
	code, _, errOut = shimMain("stop", "sb1", "--all", "--keep-root", root)
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "give NAME... or --all, not both")
}

// The kept commands take NAME as an argument, as --name, or both when
// they agree; their flags go before or after it.
func TestKeptCommandsTakeTheNameAsAnArgument(t *testing.T) {
	p, root := keeping(t)
	code, out, errOut := shimMain("create", "k1", "--provider", "keeping-test", "--agent", "/nonexistent/oac-guest", "--keep-root", root)
	require.Zero(t, code, errOut)
	assert.Contains(t, out, "created k1")
	code, out, errOut = shimMain("create", "--provider", "keeping-test", "k2", "--name", "k2", "--agent", "/x", "--keep-root", root, "--json")
	require.Zero(t, code, errOut)
	var rec persist.Record
	require.NoError(t, json.Unmarshal([]byte(out), &rec), out)
	assert.Equal(t, "k2", rec.Name)
	assert.NoError(t, schema.Validate(schema.Record, []byte(out)), "create --json prints the record")

	code, out, errOut = shimMain("reset", "k1", "--agent", "/x", "--keep-root", root, "--json")
	require.Zero(t, code, errOut)
	assert.NoError(t, schema.Validate(schema.Record, []byte(out)), "reset --json prints the record")

	code, _, errOut = shimMain("destroy", "k1", "--name", "k2", "--keep-root", root)
	assert.Equal(t, 2, code)
	assert.Equal(t, "oac-shim destroy: NAME k1 and --name k2 differ: give the name once\n", errOut)
	code, _, errOut = shimMain("destroy", "--keep-root", root)
	assert.Equal(t, 2, code)
	assert.Equal(t, "oac-shim destroy: the sandbox's NAME is required\n", errOut)
	code, _, errOut = shimMain("destroy", "K1", "--keep-root", root)
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, `"K1" is not a sandbox name`)

	for _, name := range []string{"k1", "k2"} {
		code, out, errOut = shimMain("destroy", name, "--keep-root", root)
		require.Zero(t, code, errOut)
		assert.Contains(t, out, "destroyed "+name)
	}
	assert.Equal(t, []string{"k1", "k1", "k2"}, p.discards, "reset discarded k1 once, destroy each")
	code, _, errOut = shimMain("list", "extra", "--keep-root", root)
	assert.Equal(t, 2, code)
	assert.Equal(t, "oac-shim list: takes no arguments, not [\"extra\"]\n", errOut)
}

func TestRunAndStartTakeTheNameAsAnArgument(t *testing.T) {
	for _, args := range [][]string{{"sb1"}, {"--name", "sb1"}, {"sb1", "--name", "sb1"}, {"--clock-interval", "0", "sb1", "--timeout", "1s"}} {
		var stderr strings.Builder
		f, code := parseRunFlags("run", args, &stderr)
		require.NotNil(t, f, "%q: %d %s", args, code, stderr.String())
		assert.Equal(t, "sb1", f.name, "%q", args)
	}
	for cmd, args := range map[string][]string{"run": {"sb1", "sb2"}, "start": {"sb1", "--name", "sb2"}} {
		var stderr strings.Builder
		f, code := parseRunFlags(cmd, args, &stderr)
		assert.Nil(t, f, "%q", args)
		assert.Equal(t, 2, code, "%q", args)
		assert.NotEmpty(t, stderr.String())
	}
}

func TestVersionJSONFollowsItsSchema(t *testing.T) {
	for _, args := range [][]string{{"version", "--json"}, {"--version", "--json"}} {
		code, out, errOut := shimMain(args...)
		require.Equal(t, 0, code, errOut)
		assert.NoError(t, schema.Validate(schema.Version, []byte(out)), "%s", out)
		var v api.VersionReport
		require.NoError(t, json.Unmarshal([]byte(out), &v))
		assert.Equal(t, "oac-shim", v.Program)
	}
	code, out, _ := shimMain("--version")
	assert.Equal(t, 0, code)
	assert.Regexp(t, `^oac-shim \S+ \(protocol \d+\.\.\d+(, commit [0-9a-f]+)?(, modified)?\)\n$`, out)
}

// Each script names every command and every flag of oac-shim's table.
func TestCompletionScriptsNameEveryCommandAndFlag(t *testing.T) {
	for _, sh := range []string{"bash", "zsh", "fish"} {
		code, script, errOut := shimMain("completion", sh)
		require.Equal(t, 0, code, errOut)
		for path, words := range program().Paths() {
			assert.Contains(t, script, path, "%s: %q", sh, path)
			for _, w := range words {
				if sh == "fish" {
					w = strings.TrimLeft(w, "-")
				}
				assert.Contains(t, script, w, "%s: %q of %q", sh, w, path)
			}
		}
	}
}

// oac-shim's bash script in a real bash: registered for oac-shim, and its
// function completes a command's flags after its NAME.
func TestTheBashCompletionWorksInBash(t *testing.T) {
	_, script, _ := shimMain("completion", "bash")
	file := filepath.Join(t.TempDir(), "oac-shim.bash")
	require.NoError(t, os.WriteFile(file, []byte(script), 0o644))
	bash := func(s string) []string {
		out, err := exec.Command("bash", "-c", "source "+file+"; "+s).CombinedOutput()
		require.NoError(t, err, "%s", out)
		lines := strings.Fields(string(out))
		sort.Strings(lines)
		return lines
	}
	assert.Equal(t, []string{"-F", "-o", "_oac_shim", "complete", "default", "oac-shim"}, bash("complete -p oac-shim"))
	reply := `; _oac_shim; printf '%s\n' "${COMPREPLY[@]}"`
	assert.Equal(t, []string{"--grace"}, bash(`COMP_WORDS=(oac-shim stop sb1 --gr); COMP_CWORD=3`+reply))
	assert.Equal(t, []string{"start", "stop"}, bash(`COMP_WORDS=(oac-shim st); COMP_CWORD=1`+reply))
	assert.Equal(t, []string{"--control", "--control-socket"}, bash(`COMP_WORDS=(oac-shim run --provider bwrap sb1 --contr); COMP_CWORD=5`+reply))
	assert.Equal(t, []string{"bash", "fish", "zsh"}, bash(`COMP_WORDS=(oac-shim completion ''); COMP_CWORD=2`+reply))
}
