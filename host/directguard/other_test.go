//go:build !linux

package directguard

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func childMain() bool { return false }

func TestOpenSaysDirectModeNeedsLinux(t *testing.T) {
	g, err := Open(Config{})
	require.Error(t, err)
	assert.Nil(t, g)
	assert.Contains(t, err.Error(), "direct mode needs Linux")
}
