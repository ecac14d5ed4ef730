package sandbox

import (
	"bytes"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// Fuzz targets for the host's decoders of guest bytes that live in this
// package: log streams (readLines), the runtime's stderr (diagWriter) and
// guest text copied into events (guestText). The frame, message and header
// decoders are fuzzed in package protocol, egress targets in package egress.

func FuzzReadLines(f *testing.F) {
	f.Add([]byte("hello\nworld\n"))
	f.Add([]byte("no newline"))
	f.Add([]byte("crlf\r\nbad \xff utf8\n"))
	f.Add(bytes.Repeat([]byte("a"), MaxLogLine+10))
	f.Add([]byte("\n\n\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		total := 0
		err := readLines(bytes.NewReader(data), func(line string) {
			require.LessOrEqual(t, len(line), MaxLogLine, "a line is split at MaxLogLine")
			require.True(t, utf8.ValidString(line), "lines are valid UTF-8")
			require.NotContains(t, line, "\n")
			total += len(line)
		})
		require.NoError(t, err)
		require.LessOrEqual(t, total, len(data)*3, "replacement characters at most triple the size")
	})
}

func FuzzDiagWriter(f *testing.F) {
	f.Add([]byte("bwrap: oops\n"), 3)
	f.Add(bytes.Repeat([]byte("z"), MaxLogLine*2), 7)
	f.Add([]byte("\xff\xfe\n\x00"), 1)
	f.Add([]byte("\x1b]0;title\x07\xc2\x9b2J\n"), 2)
	f.Fuzz(func(t *testing.T, data []byte, chunk int) {
		if chunk <= 0 {
			chunk = 1
		}
		var out bytes.Buffer
		d := newDiagWriter(&out, "[x] ")
		for p := data; len(p) > 0; {
			n := min(chunk, len(p))
			w, err := d.Write(p[:n])
			require.NoError(t, err)
			require.Equal(t, n, w)
			p = p[n:]
		}
		require.LessOrEqual(t, out.Len(), MaxDiagBytes+MaxLogLine+200, "diagnostics are capped")
		require.LessOrEqual(t, len(d.partial), MaxLogLine, "an unterminated line is bounded")
		for _, l := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
			if out.Len() > 0 {
				require.True(t, strings.HasPrefix(l, "[x] "), "every line is prefixed: %q", l)
			}
		}
		require.True(t, utf8.ValidString(d.lastLines()))
		require.False(t, strings.ContainsFunc(out.String(), func(r rune) bool { return unicode.IsControl(r) && r != '\t' && r != '\n' }),
			"no terminal escape reaches the shim's stderr")
	})
}

func FuzzGuestText(f *testing.F) {
	f.Add("hello", 10)
	f.Add("a\x1b[31mb\x7f", 4)
	f.Add("csi \u009b31m osc \u009d0;x\u009c", 64)
	f.Add("é\xff", 1)
	f.Fuzz(func(t *testing.T, s string, n int) {
		if n < 0 || n > 4096 {
			return
		}
		g := guestText(s, n)
		require.True(t, utf8.ValidString(g))
		require.LessOrEqual(t, len(g), 3*n+3+3, "bounded: n bytes, each at most a replacement character, plus ...")
		require.False(t, strings.ContainsFunc(g, unicode.IsControl), "no control characters (C0, DEL, C1)")
	})
}
