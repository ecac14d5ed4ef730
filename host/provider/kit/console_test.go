package kit

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestConsoleWriterStripsCarriageReturnsAndStopsAtTheLimit(t *testing.T) {
	var out bytes.Buffer
	c := NewConsole(&out, 10)
	n, err := c.Write([]byte("abc\r\ndef\r\n"))
	assert.NoError(t, err)
	assert.Equal(t, 10, n)
	assert.Equal(t, "abc\ndef\n", out.String())
	n, _ = c.Write([]byte("0123456789"))
	assert.Equal(t, 10, n, "always accepts, so qemu never blocks")
	n, _ = c.Write([]byte("more"))
	assert.Equal(t, 4, n)
	assert.Equal(t, "abc\ndef\n01\nconsole output limit of 10 bytes reached; further console output dropped\n", out.String())

	// The limit cuts inside a write, too.
	out.Reset()
	w := NewConsole(&out, 5)
	n, err = w.Write([]byte("ab\r\ncdef"))
	require.NoError(t, err)
	assert.Equal(t, 8, n)
	_, _ = w.Write([]byte("more"))
	assert.Equal(t, "ab\ncd\nconsole output limit of 5 bytes reached; further console output dropped\n", out.String())
}
