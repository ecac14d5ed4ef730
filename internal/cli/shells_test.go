package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// script writes prog's completion script for sh to a file.
func script(t *testing.T, p *Program, sh string) string {
	t.Helper()
	code, out, stderr := run(p, "completion", sh)
	require.Equal(t, 0, code, stderr)
	file := filepath.Join(t.TempDir(), "prog."+sh)
	require.NoError(t, os.WriteFile(file, []byte(out), 0o644))
	return file
}

// offered runs a shell and returns the words it prints, one a line, sorted.
func offered(t *testing.T, name string, args ...string) []string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	require.NoError(t, err, "%s", out)
	var words []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if l != "" {
			w, _, _ := strings.Cut(l, "\t") // fish: WORD<TAB>description
			words = append(words, w)
		}
	}
	sort.Strings(words)
	return words
}

// split is a path's flags and its words, each sorted.
func split(words []string) (flags, rest []string) {
	for _, w := range words {
		if strings.HasPrefix(w, "-") {
			flags = append(flags, w)
		} else {
			rest = append(rest, w)
		}
	}
	sort.Strings(flags)
	sort.Strings(rest)
	return flags, rest
}

// bash itself completes "-" after every command path to that command's
// flags, and an empty word to its subcommands or fixed words.
func TestBashCompletesEveryCommandsFlagsAndWords(t *testing.T) {
	var g got
	p := testProgram(&g)
	file := script(t, p, "bash")
	assert.Equal(t, []string{"complete -o default -F _prog prog"}, offered(t, "bash", "-c", "source "+file+" && complete -p prog"))
	for path, words := range p.Paths() {
		flags, rest := split(words)
		ws := strings.Fields("prog " + path)
		// A flag and its value before the cursor are skipped.
		at := func(cur string) string {
			all := append(append([]string{}, ws...), cur)
			if path == "stop" {
				all = append(append([]string{}, ws...), "--grace", "5s", "a", cur)
			}
			quoted := make([]string, len(all))
			for i, w := range all {
				quoted[i] = shQuote(w)
			}
			return "source " + file + "; COMP_WORDS=(" + strings.Join(quoted, " ") + "); COMP_CWORD=" +
				strconv.Itoa(len(all)-1) + "; _prog; printf '%s\\n' \"${COMPREPLY[@]}\""
		}
		assert.Equal(t, flags, offered(t, "bash", "-c", at("-")), "flags of %q", path)
		if path != "stop" {
			assert.Equal(t, rest, offered(t, "bash", "-c", at("")), "words of %q", path)
		}
	}
	// After a flag that takes a value, the shell's own file names (-o default).
	assert.Empty(t, offered(t, "bash", "-c", "source "+file+"; COMP_WORDS=(prog manifest verify --store ''); COMP_CWORD=4; _prog; printf '%s\\n' \"${COMPREPLY[@]}\""))
}

// fish, where installed, completes the same (complete -C).
func TestFishCompletesEveryCommandsFlagsAndWords(t *testing.T) {
	if _, err := exec.LookPath("fish"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("fish is not installed: make test-deps installs it (apt-get install fish)")
		}
		t.Skip("fish is not installed here: apt-get install fish")
	}
	var g got
	p := testProgram(&g)
	file := script(t, p, "fish")
	for path, words := range p.Paths() {
		flags, rest := split(words)
		line := strings.TrimSpace("prog " + path)
		got := offered(t, "fish", "--no-config", "-c", "source "+file+"; complete -C '"+line+" -'")
		// fish offers both spellings of a long flag that takes a value (--store, --store=).
		var gotFlags []string
		for _, f := range got {
			if !strings.HasSuffix(f, "=") {
				gotFlags = append(gotFlags, f)
			}
		}
		assert.Equal(t, flags, gotFlags, "flags of %q", path)
		if len(rest) > 0 {
			assert.Equal(t, rest, offered(t, "fish", "--no-config", "-c", "source "+file+"; complete -C '"+line+" '"), "words of %q", path)
		}
	}
}

// zsh, where installed, parses the script, and its function offers each
// path's flags and words (zsh's completion system stood in for by
// functions that print what they are given).
func TestZshCompletesEveryCommandsFlagsAndWords(t *testing.T) {
	if _, err := exec.LookPath("zsh"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("zsh is not installed: make test-deps installs it (apt-get install zsh)")
		}
		t.Skip("zsh is not installed here: apt-get install zsh")
	}
	var g got
	p := testProgram(&g)
	file := script(t, p, "zsh")
	stubs := `compdef() { :; }; _files() { :; }; _describe() { shift 3; printf '%s\n' "${(@)${(P)1}%%:*}"; }; source ` + file + `; `
	for path, words := range p.Paths() {
		flags, rest := split(words)
		ws := strings.Fields("prog " + path)
		call := func(prefix string) string {
			quoted := make([]string, 0, len(ws)+1)
			for _, w := range append(append([]string{}, ws...), prefix) {
				quoted = append(quoted, shQuote(w))
			}
			return stubs + "words=(" + strings.Join(quoted, " ") + "); CURRENT=" + strconv.Itoa(len(ws)+1) + "; PREFIX=" + shQuote(prefix) + "; _prog"
		}
		assert.Equal(t, flags, offered(t, "zsh", "-f", "-c", call("-")), "flags of %q", path)
		if len(rest) > 0 {
			assert.Equal(t, rest, offered(t, "zsh", "-f", "-c", call("")), "words of %q", path)
		}
	}
}
