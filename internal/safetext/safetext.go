// Package safetext is the one sanitizer of untrusted text (what a guest,
// a control client or a runtime wrote) before it goes into an event, an
// error, a log line or a status: valid UTF-8, no control characters,
// bounded.
//
// It owns that rule and nothing else. It must not decide whether text is
// allowed (callers refuse what breaks their rules) or escape for a
// particular syntax (JSON encoding does its own).
package safetext

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// Clean returns s with each invalid UTF-8 byte replaced by U+FFFD and each
// control character (C0 below 0x20, DEL 0x7f and C1 0x80-0x9f: no terminal
// escape, ESC or CSI, survives) by repl, cut to at most max
// bytes on a rune boundary with "..." appended when it was longer (so at
// most max+3 bytes).
func Clean(s string, max int, repl rune) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return repl
		}
		return r
	}, strings.ToValidUTF8(s, "\uFFFD"))
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// Line is Clean for a line of output (a log line, a runtime's stderr):
// tabs stay, and there is no bound (the reader bounds lines).
func Line(s string) string {
	bad := func(r rune) bool { return unicode.IsControl(r) && r != '\t' }
	if !strings.ContainsFunc(s, bad) && utf8.ValidString(s) {
		return s
	}
	return strings.Map(func(r rune) rune {
		if bad(r) {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(s, "\uFFFD"))
}
