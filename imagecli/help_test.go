package imagecli

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
)

// What oac-image build does on Windows (build_windows.go), run here.
func TestBuildWhereItCannotRunSaysWhyAndWhatToRunInstead(t *testing.T) {
	var stdout, stderr bytes.Buffer
	assert.Equal(t, 1, refuseBuild([]string{"--agent", "a", "--sandbox-io", "s", "-o", "out"}, &stdout, &stderr))
	assert.Empty(t, stdout.String())
	assert.Contains(t, stderr.String(), "oac-image build runs on Linux and macOS build hosts only")
	assert.Contains(t, stderr.String(), "oac-image stage --manifest FILE --platform windows")
	assert.Contains(t, stderr.String(), "oac-image manifest verify FILE --store DIR")

	stdout.Reset()
	stderr.Reset()
	assert.Equal(t, 0, refuseBuild([]string{"--help"}, &stdout, &stderr), "help is not an error")
	assert.Contains(t, stdout.String(), "usage: oac-image build")
	assert.Contains(t, stdout.String(), "Windows cannot write")
	assert.Empty(t, stderr.String())
}
