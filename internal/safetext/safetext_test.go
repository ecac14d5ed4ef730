package safetext

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCleanBoundsAndReplacesWhatCannotBeShown(t *testing.T) {
	assert.Equal(t, "a b", Clean("a\nb", 10, ' '))
	assert.Equal(t, "a?b", Clean("a\x7fb", 10, '?'))
	assert.Equal(t, "abc...", Clean("abcdef", 3, ' '))
	assert.Equal(t, "abcdef", Clean("abcdef", 6, ' '))
	assert.Equal(t, "\uFFFD", Clean("\xff", 10, ' '))
	assert.Equal(t, "...", Clean("é", 1, ' '), "never cuts a rune in half")
	assert.Equal(t, "bücher", Clean("bücher", 10, '?'), "printable text stays")
}

func FuzzClean(f *testing.F) {
	for _, s := range []string{"", "a\nb", "\xff\xfe", "é", strings.Repeat("x", 100), "\x00\x1f\x7f"} {
		f.Add(s, 10)
	}
	f.Fuzz(func(t *testing.T, s string, max int) {
		if max < 0 || max > 1<<16 {
			return
		}
		c := Clean(s, max, '?')
		require.True(t, utf8.ValidString(c))
		require.False(t, strings.ContainsFunc(c, func(r rune) bool { return r < 0x20 || r == 0x7f }))
		require.LessOrEqual(t, len(c), max+3)
	})
}
