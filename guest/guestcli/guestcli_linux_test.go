package guestcli

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/schema"
)

func TestVersionPrintsTheAgentVersionAndProtocolRange(t *testing.T) {
	var stdout, stderr bytes.Buffer
	assert.Equal(t, 0, Main([]string{"--version"}, &stdout, &stderr))
	assert.Regexp(t, `^oac-guest \S+ \(protocol \d+\.\.\d+(, commit [0-9a-f]+)?(, modified)?\)\n$`, stdout.String())
	assert.Empty(t, stderr.String())
}

func TestUsageErrorsExit2BeforeAnythingStarts(t *testing.T) {
	for _, args := range [][]string{{"--no-such-flag"}, {"serve"}, {"--transport", "unix:///x", "extra"}} {
		var stdout, stderr bytes.Buffer
		assert.Equal(t, 2, Main(args, &stdout, &stderr), "%q", args)
		assert.Empty(t, stdout.String(), "%q", args)
		assert.NotEmpty(t, stderr.String(), "%q", args)
	}
}

func TestHelpIsOnStdoutWithStatusZero(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"--help"}, {"--debug", "--help"}, {"helper", "-h"}, {"helper", "--help"},
		{"bridge", "--help"}, {"seed-kept", "-h"}, {"version", "--help"}} {
		var stdout, stderr bytes.Buffer
		assert.Equal(t, 0, Main(args, &stdout, &stderr), "%q", args)
		assert.Empty(t, stderr.String(), "%q", args)
		assert.Contains(t, stdout.String(), "usage: oac-guest", "%q", args)
	}
}

func TestVersionJSONFollowsItsSchema(t *testing.T) {
	for _, args := range [][]string{{"version", "--json"}, {"--version", "--json"}} {
		var stdout, stderr bytes.Buffer
		require.Equal(t, 0, Main(args, &stdout, &stderr), "%q: %s", args, stderr.String())
		assert.NoError(t, schema.Validate(schema.Version, stdout.Bytes()), stdout.String())
		assert.Contains(t, stdout.String(), `"program": "oac-guest"`)
	}
}

func TestSubcommandUsageErrorsExit2(t *testing.T) {
	for _, args := range [][]string{{"helper", "extra"}, {"bridge"}, {"bridge", "a", "b"}, {"seed-kept"}, {"version", "x"}, {"helper", "--bogus"}} {
		var stdout, stderr bytes.Buffer
		assert.Equal(t, 2, Main(args, &stdout, &stderr), "%q", args)
		assert.Empty(t, stdout.String(), "%q", args)
		assert.NotEmpty(t, stderr.String(), "%q", args)
	}
}
