package crashpoint

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var knownCommands = map[string]bool{"create": true, "start": true, "run": true, "reset": true, "destroy": true}

func TestEveryPointHasAUniqueNameKnownCommandsAndAnOutcome(t *testing.T) {
	seen := map[string]bool{}
	for _, p := range Points() {
		assert.Regexp(t, `^[a-z]+/[a-z-]+$`, p.Name())
		assert.False(t, seen[p.Name()], "%s declared twice", p.Name())
		seen[p.Name()] = true
		require.NotEmpty(t, p.Commands(), p.Name())
		for _, c := range p.Commands() {
			assert.True(t, knownCommands[c], "%s: unknown command %q", p.Name(), c)
		}
		assert.Contains(t, []Outcome{Before, Nothing, Done}, p.Leaves(), p.Name())
		assert.NotEmpty(t, p.Step(), p.Name())
	}
}

// docs/kept.md's table is the points' own words: a point added here
// without its line there (or changed on one side) fails.
func TestTheDocsTableListsEveryPointAsDeclared(t *testing.T) {
	b, err := os.ReadFile("../../docs/kept.md")
	require.NoError(t, err)
	row := regexp.MustCompile("(?m)^\\| `([a-z]+/[a-z-]+)` \\| ([a-z, ]+) \\| (.+) \\| ([a-z]+) \\|$")
	var got, want []string
	for _, m := range row.FindAllStringSubmatch(string(b), -1) {
		got = append(got, strings.Join(m[1:], " | "))
	}
	for _, p := range Points() {
		want = append(want, strings.Join([]string{p.Name(), strings.Join(p.Commands(), ", "), p.Step(), string(p.Leaves())}, " | "))
	}
	assert.Equal(t, want, got)
}

func TestAReleaseBuildNeverCrashes(t *testing.T) {
	if Enabled {
		t.Skip("built with -tags crashpoints")
	}
	t.Setenv(EnvVar, CreateLocked.Name())
	Hit(CreateLocked) // returns
}
