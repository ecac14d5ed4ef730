package guestcli

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestVersionPrintsTheAgentVersionAndProtocolRange(t *testing.T) {
	var stdout, stderr bytes.Buffer
	assert.Equal(t, 0, Main([]string{"--version"}, &stdout, &stderr))
	assert.Regexp(t, `^oac-guest \S+ \(protocol \d+\.\.\d+\)\n$`, stdout.String())
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
