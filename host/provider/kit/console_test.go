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

func TestConsoleDropsTerminalEscapes(t *testing.T) {
	var out bytes.Buffer
	c := NewConsole(&out, 1<<10)
	_, _ = c.Write([]byte("UEFI firmware\r\n\x1b[2J\x1b[01;01H\x1b[=3h\x1b"))
	_, _ = c.Write([]byte("[2Jtime=1 msg=modules\n"))
	assert.Equal(t, "UEFI firmware\ntime=1 msg=modules\n", out.String(), "sequences split across writes too")
}
