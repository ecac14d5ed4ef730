package safetext

import (
	"strings"
	"testing"
	"unicode"
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
	assert.Equal(t, "?[31m?2J?]0;x?", Clean("\x1b[31m\u009b2J\u009d]0;x\u009c", 64, '?'), "ESC and C1 (CSI, OSC, ST) never pass")
}

func TestLineKeepsTabsAndNothingElse(t *testing.T) {
	assert.Equal(t, "tab\tkept   bell \uFFFD", Line("tab\tkept \x1b bell\a\xff"))
	assert.Equal(t, "plain line", Line("plain line"))
}

func FuzzClean(f *testing.F) {
	for _, s := range []string{"", "a\nb", "\xff\xfe", "é", strings.Repeat("x", 100), "\x00\x1f\x7f", "\u009b31m\x1b]0;t\a"} {
		f.Add(s, 10)
	}
	f.Fuzz(func(t *testing.T, s string, max int) {
		if max < 0 || max > 1<<16 {
			return
		}
		c := Clean(s, max, '?')
		require.True(t, utf8.ValidString(c))
		require.False(t, strings.ContainsFunc(c, unicode.IsControl), "no C0, DEL or C1 control")
		require.LessOrEqual(t, len(c), max+3)
	})
}
