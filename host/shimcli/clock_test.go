package shimcli

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/host/sandbox"
)

func TestClockIntervalFlagDefaultsToTenSecondsTakesZeroForOffAndRefusesTinyOnes(t *testing.T) {
	var stderr bytes.Buffer
	f, code := parseRunFlags("run", []string{"--name", "c1"}, &stderr)
	require.Zero(t, code, stderr.String())
	assert.Equal(t, sandbox.DefaultClockInterval, clockSetting(f.clockInterval))

	f, code = parseRunFlags("run", []string{"--name", "c1", "--clock-interval", "0"}, &stderr)
	require.Zero(t, code, stderr.String())
	assert.Negative(t, clockSetting(f.clockInterval), "0 turns clock keeping off")

	f, code = parseRunFlags("run", []string{"--name", "c1", "--clock-interval", "250ms"}, &stderr)
	require.Zero(t, code, stderr.String())
	assert.Equal(t, 250*time.Millisecond, clockSetting(f.clockInterval))

	for _, bad := range []string{"10ms", "-1s"} {
		stderr.Reset()
		_, code = parseRunFlags("run", []string{"--name", "c1", "--clock-interval", bad}, &stderr)
		assert.Equal(t, 2, code, bad)
		assert.Contains(t, stderr.String(), "--clock-interval must be 0 (off) or at least 100ms", bad)
	}
}
