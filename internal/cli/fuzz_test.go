package cli

import (
	"io"
	"strings"
	"testing"
	"time"
)

// Parse never panics on any argv, and what it returns as positional
// arguments are arguments it was given, in their order, none of them a
// flag it took (unless after "--").
func FuzzParse(f *testing.F) {
	for _, seed := range []string{"stop\x00a\x00--grace\x005s", "a\x00--\x00--all", "--name\x00-h", "--grace=x", "-", "a\x00--all=false\x00b"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, argv string) {
		args := strings.Split(argv, "\x00")
		fs := FlagSet("fuzz")
		fs.Duration("grace", time.Second, "")
		fs.Bool("all", false, "")
		fs.String("name", "", "")
		pos, code, ok := Parse(fs, args, Env{Stdout: io.Discard, Stderr: io.Discard})
		if !ok {
			if code != 0 && code != 2 {
				t.Fatalf("status %d", code)
			}
			return
		}
		i := 0
		for _, p := range pos {
			for i < len(args) && args[i] != p {
				i++
			}
			if i == len(args) {
				t.Fatalf("positional %q is not among the arguments %q in order", p, args)
			}
			i++
		}
		if _, err := Names(fs, pos); err == nil && len(pos) > 1 && fs.Lookup("name").Value.String() != "" {
			t.Fatalf("--name beside %d names was taken", len(pos))
		}
	})
}
