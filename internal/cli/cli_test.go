package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/internal/buildinfo"
	"github.com/oac/sandbox-agent/protocol"
)

// got is what a test program's command was run with.
type got struct {
	names []string
	grace time.Duration
	all   bool
}

// testProgram is a program with a command of each shape: one NAME with
// --name (start), NAME... (stop), none (list) and a subcommand (manifest
// verify FILE).
func testProgram(g *got) *Program {
	name := func(cmd string) *Command {
		return &Command{Name: cmd, Args: "NAME", Summary: cmd + " one sandbox", Run: func(args []string, env Env) int {
			fs := FlagSet("prog " + cmd)
			fs.String("name", "", "the sandbox's name")
			fs.DurationVar(&g.grace, "grace", time.Second, "how long")
			args, code, ok := Parse(fs, args, env)
			if !ok {
				return code
			}
			n, err := Name(fs, args)
			if err != nil {
				return Usagef(fs, env.Stderr, "%v", err)
			}
			g.names = []string{n}
			return 0
		}}
	}
	return &Program{Name: "prog", Help: "More words.\n", Commands: []*Command{
		name("start"),
		{Name: "stop", Args: "(NAME... | --all)", Summary: "stop them", Help: "Stops them in order.\n", Run: func(args []string, env Env) int {
			fs := FlagSet("prog stop")
			fs.BoolVar(&g.all, "all", false, "every one")
			fs.DurationVar(&g.grace, "grace", time.Second, "how long")
			fs.String("name", "", "the sandbox's name")
			args, code, ok := Parse(fs, args, env)
			if !ok {
				return code
			}
			names, err := Names(fs, args)
			if err != nil {
				return Usagef(fs, env.Stderr, "%v", err)
			}
			g.names = names
			return 0
		}},
		{Name: "manifest", Summary: "manifests", Sub: []*Command{{Name: "verify", Args: "FILE", Summary: "check one", Run: func(args []string, env Env) int {
			fs := FlagSet("prog manifest verify")
			fs.String("store", "", "a store")
			fs.String("o", "", "output")
			args, code, ok := Parse(fs, args, env)
			if !ok {
				return code
			}
			g.names = args
			return 0
		}}}},
	}}
}

func run(p *Program, args ...string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = p.Main(args, Env{Stdin: strings.NewReader(""), Stdout: &o, Stderr: &e})
	return code, o.String(), e.String()
}

func TestFlagsGoBeforeOrAfterTheArguments(t *testing.T) {
	for _, args := range [][]string{
		{"stop", "a", "b", "--grace", "5s"},
		{"stop", "--grace", "5s", "a", "b"},
		{"stop", "a", "--grace=5s", "b"},
		{"stop", "a", "-grace", "5s", "b"},
	} {
		var g got
		code, _, stderr := run(testProgram(&g), args...)
		require.Equal(t, 0, code, "%q: %s", args, stderr)
		assert.Equal(t, []string{"a", "b"}, g.names, "%q", args)
		assert.Equal(t, 5*time.Second, g.grace, "%q", args)
	}
}

func TestADoubleDashEndsTheFlags(t *testing.T) {
	var g got
	code, _, stderr := run(testProgram(&g), "manifest", "verify", "--store", "s", "--", "--not-a-flag")
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, []string{"--not-a-flag"}, g.names)
}

func TestTheNameIsAnArgumentOrNameAndBothMustAgree(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want []string
		err  string
	}{
		{args: []string{"start", "sb1"}, want: []string{"sb1"}},
		{args: []string{"start", "--name", "sb1"}, want: []string{"sb1"}},
		{args: []string{"start", "sb1", "--name", "sb1"}, want: []string{"sb1"}},
		{args: []string{"start", "sb1", "--name", "sb2"}, code: 2, err: "prog start: NAME sb1 and --name sb2 differ: give the name once\n"},
		{args: []string{"start"}, code: 2, err: "prog start: the sandbox's NAME is required\n"},
		{args: []string{"start", "a", "b"}, code: 2, err: "prog start: takes one NAME, not 2 (a b)\n"},
		{args: []string{"stop", "a", "b"}, want: []string{"a", "b"}},
		{args: []string{"stop", "--name", "a"}, want: []string{"a"}},
		{args: []string{"stop", "a", "b", "--name", "a"}, code: 2, err: "prog stop: NAME a b and --name a differ: give the name once\n"},
	} {
		var g got
		code, stdout, stderr := run(testProgram(&g), tc.args...)
		assert.Equal(t, tc.code, code, "%q", tc.args)
		assert.Empty(t, stdout, "%q", tc.args)
		assert.Equal(t, tc.err, stderr, "%q", tc.args)
		if tc.code == 0 {
			assert.Equal(t, tc.want, g.names, "%q", tc.args)
		}
	}
}

func TestHelpGoesToStdoutWithStatusZeroEverywhere(t *testing.T) {
	for _, args := range [][]string{
		{"-h"}, {"--help"}, {"help"}, {"help", "stop"}, {"help", "manifest", "verify"},
		{"start", "-h"}, {"start", "--help"}, {"start", "sb1", "--help"}, {"stop", "-help"},
		{"manifest", "--help"}, {"manifest", "verify", "-h"}, {"version", "-h"}, {"completion", "--help"},
	} {
		var g got
		code, stdout, stderr := run(testProgram(&g), args...)
		assert.Equal(t, 0, code, "%q", args)
		assert.Empty(t, stderr, "%q", args)
		assert.True(t, strings.HasPrefix(stdout, "usage: prog"), "%q: %s", args, stdout)
		assert.Nil(t, g.names, "%q: help runs nothing", args)
	}
	var g got
	_, stdout, _ := run(testProgram(&g), "stop", "--help")
	assert.Equal(t, `usage: prog stop [flags] (NAME... | --all)

Stops them in order.

flags (before or after the arguments):
  --all
    	every one
  --grace duration
    	how long (default 1s)
  --name string
    	the sandbox's name
`, stdout)
	_, stdout, _ = run(testProgram(&g), "--help")
	assert.Contains(t, stdout, "  stop (NAME... | --all)    stop them\n")
	assert.Contains(t, stdout, "  manifest verify FILE      check one\n")
	assert.Contains(t, stdout, "  completion bash|zsh|fish  print a completion script")
	assert.Contains(t, stdout, "\nMore words.\n")
}

func TestUsageErrorsGoToStderrWithStatusTwo(t *testing.T) {
	for _, tc := range []struct {
		args []string
		err  string
	}{
		{nil, "usage: prog COMMAND"},
		{[]string{"bogus"}, `prog: unknown command "bogus" (prog --help lists them)`},
		{[]string{"stop", "a", "--bogus"}, "prog stop: flag provided but not defined: -bogus (prog stop --help says what it takes)"},
		{[]string{"stop", "--grace", "soon"}, `prog stop: invalid value "soon" for flag -grace`},
		{[]string{"manifest"}, "usage: prog manifest COMMAND"},
		{[]string{"manifest", "nope"}, `prog manifest: unknown command "nope"`},
		{[]string{"version", "extra"}, `prog version: takes no arguments, not ["extra"]`},
		{[]string{"completion"}, "prog completion: name one shell: bash, zsh, fish"},
		{[]string{"completion", "csh"}, `prog completion: no completion for "csh"`},
	} {
		var g got
		code, stdout, stderr := run(testProgram(&g), tc.args...)
		assert.Equal(t, 2, code, "%q", tc.args)
		assert.Empty(t, stdout, "%q", tc.args)
		assert.Contains(t, stderr, tc.err, "%q", tc.args)
	}
}

func TestVersionAsTextAndAsJSON(t *testing.T) {
	var g got
	for _, args := range [][]string{{"version"}, {"--version"}, {"-version"}} {
		code, stdout, stderr := run(testProgram(&g), args...)
		require.Equal(t, 0, code, stderr)
		assert.Regexp(t, `^prog \S+ \(protocol \d+\.\.\d+(, commit [0-9a-f]+)?(, modified)?\)\n$`, stdout, "%q", args)
	}
	for _, args := range [][]string{{"version", "--json"}, {"--version", "--json"}} {
		code, stdout, stderr := run(testProgram(&g), args...)
		require.Equal(t, 0, code, stderr)
		var v api.VersionReport
		require.NoError(t, json.Unmarshal([]byte(stdout), &v), stdout)
		assert.Equal(t, Version("prog"), v, "%q", args)
		assert.Equal(t, api.SchemaVersion, v.SchemaVersion)
	}
}

// A release build's stamps are what --version and version --json say.
func TestVersionSaysTheStampedBuild(t *testing.T) {
	saved := [3]string{buildinfo.Version, buildinfo.Commit, buildinfo.Modified}
	t.Cleanup(func() { buildinfo.Version, buildinfo.Commit, buildinfo.Modified = saved[0], saved[1], saved[2] })
	const commit = "f6390a6e0f4c8b3e0e1d7a2b3c4d5e6f70819283"
	buildinfo.Version, buildinfo.Commit, buildinfo.Modified = "v1.2.3", commit, "true"

	var g got
	code, stdout, stderr := run(testProgram(&g), "--version")
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, fmt.Sprintf("prog v1.2.3 (protocol %d..%d, commit %s, modified)\n", protocol.MinVersion, protocol.MaxVersion, commit), stdout)

	code, stdout, stderr = run(testProgram(&g), "version", "--json")
	require.Equal(t, 0, code, stderr)
	var v api.VersionReport
	require.NoError(t, json.Unmarshal([]byte(stdout), &v), stdout)
	assert.Equal(t, "v1.2.3", v.Version)
	assert.Equal(t, commit, v.Commit)
	assert.True(t, v.Modified)

	buildinfo.Modified = "false"
	code, stdout, _ = run(testProgram(&g), "--version")
	require.Equal(t, 0, code)
	assert.NotContains(t, stdout, "modified")
}

func TestPathsAreEveryCommandWithItsOwnFlags(t *testing.T) {
	var g got
	assert.Equal(t, map[string][]string{
		"":                {"--help", "--version", "start", "stop", "manifest", "version", "completion"},
		"start":           {"--grace", "--name", "--help"},
		"stop":            {"--all", "--grace", "--name", "--help"},
		"manifest":        {"--help", "verify"},
		"manifest verify": {"-o", "--store", "--help"},
		"version":         {"--json", "--help"},
		"completion":      {"--help", "bash", "zsh", "fish"},
	}, testProgram(&g).Paths())
}

func TestEveryScriptNamesEveryCommandAndFlag(t *testing.T) {
	var g got
	p := testProgram(&g)
	for _, sh := range Shells {
		code, script, stderr := run(p, "completion", sh)
		require.Equal(t, 0, code, stderr)
		for path, words := range p.Paths() {
			if path != "" {
				assert.Contains(t, script, path, "%s: command %q", sh, path)
			}
			for _, w := range words {
				if sh == "fish" && strings.HasPrefix(w, "-") {
					// fish names a flag -l grace, -s o.
					opt := map[bool]string{true: "-l " + strings.TrimPrefix(w, "--"), false: "-s " + strings.TrimPrefix(w, "-")}[strings.HasPrefix(w, "--")]
					assert.Contains(t, script, fmt.Sprintf("'__prog_at \"%s\"' %s", path, opt), "%s: %q of %q", sh, w, path)
					continue
				}
				assert.Contains(t, script, w, "%s: %q of %q", sh, w, path)
			}
		}
	}
}
