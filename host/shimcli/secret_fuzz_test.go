package shimcli

import (
	"bytes"
	"io"
	"regexp"
	"testing"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/host/failure"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

// passwordErrorText is every message readPasswordLine may return for
// bytes from a reader that does not fail: a rule broken, a position, a
// count, and never the line's own bytes.
var passwordErrorText = regexp.MustCompile(`^--password-stdin: (stdin ended before the password line|` +
	`the first line of stdin is longer than 1024 characters|` +
	`character \d+ of the password line is (a space|not ASCII|a control character)|` +
	`the password line has \d+ characters) \(` + regexp.QuoteMeta(passwordRule) + `\)$`)

// FuzzReadPasswordLine: arbitrary stdin never panics; a password read
// follows the bootstrap's rules and leaves every byte after its line
// unread; a refusal is one of the known messages, with the invalid_config
// code.
func FuzzReadPasswordLine(f *testing.F) {
	f.Add([]byte(goodPassword + "\n" + credBoot + "\n"))
	f.Add([]byte(goodPassword + "\r\n{\"cmd\":\"stop\"}\n"))
	f.Add([]byte(goodPassword))
	f.Add([]byte(""))
	f.Add([]byte("\n"))
	f.Add([]byte("short\n"))
	f.Add([]byte("a password with spaces in it\n"))
	f.Add([]byte("pässwörd-pässwörd-pässwörd\n"))
	f.Add(bytes.Repeat([]byte("x"), bootstrap.MaxPassword+1))
	f.Add(append(bytes.Repeat([]byte("x"), bootstrap.MaxPassword), "\r\n"...))
	f.Fuzz(func(t *testing.T, in []byte) {
		pw, rest, err := readPasswordLine(bytes.NewReader(in))
		if err != nil {
			if !passwordErrorText.MatchString(err.Error()) {
				t.Fatalf("unexpected refusal: %q", err)
			}
			if failure.Code(err) != api.CodeInvalidConfig {
				t.Fatalf("refusal %q has code %q", err, failure.Code(err))
			}
			return
		}
		if !bootstrap.ValidPassword(pw) {
			t.Fatalf("took a password the bootstrap refuses: %q", pw)
		}
		left, err := io.ReadAll(rest)
		if err != nil {
			t.Fatal(err)
		}
		line, after, found := bytes.Cut(in, []byte("\n"))
		if !found {
			after = nil
		}
		if !bytes.Equal(after, left) {
			t.Fatalf("rest is %q, want what followed the line, %q", left, after)
		}
		if want := string(bytes.TrimSuffix(line, []byte("\r"))); pw != want {
			t.Fatalf("password %q, want the line %q", pw, want)
		}
	})
}
