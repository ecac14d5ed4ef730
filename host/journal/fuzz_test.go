package journal

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// FuzzReader: whatever a segment holds after a crash, the reader gives
// only whole lines that are one JSON object of at most MaxLine bytes
// with a seq above the one before, gaps that go forward, and never more
// than the file held.
func FuzzReader(f *testing.F) {
	for _, s := range []string{
		"{\"event\":\"state\",\"seq\":1,\"state\":\"starting\"}\n{\"event\":\"state\",\"seq\":2,\"state\":\"ready\"}\n",
		"{\"event\":\"state\",\"seq\":1}\n{\"event\":\"state\",\"seq\":2,\"sta",
		"{\"seq\":3}\n{\"seq\":2}\n{\"seq\":9}\n",
		"{\"seq\":0}\n{\"seq\":-1}\n{\"seq\":1.5}\n{\"seq\":\"1\"}\n{\"seq\":18446744073709551615}\n{\"seq\":18446744073709551616}\n",
		"\n\n{}\n[]\nnull\n{\"seq\":1}{\"seq\":2}\n",
		"{\"seq\":1,\"seq\":2}\n{\"seq\":3}\r\n",
	} {
		f.Add([]byte(s), uint64(0))
		f.Add([]byte(s), uint64(2))
	}
	f.Fuzz(func(t *testing.T, data []byte, from uint64) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, segName(1)), data, 0o600); err != nil {
			t.Fatal(err)
		}
		r := Open(dir, from)
		defer r.Close()
		var last uint64
		total := 0
		for range len(data) + 2 {
			it, err := r.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if it.Gap.To != 0 {
				if it.Gap.From > it.Gap.To || it.Gap.From <= last {
					t.Fatalf("gap %d-%d after %d", it.Gap.From, it.Gap.To, last)
				}
				last = it.Gap.To
				continue
			}
			if it.Seq <= last || it.Seq < from || len(it.Line) > MaxLine || !json.Valid(it.Line) || it.Line[len(it.Line)-1] != '\n' {
				t.Fatalf("line %d after %d: %q", it.Seq, last, it.Line)
			}
			last = it.Seq
			total += len(it.Line)
		}
		if total+r.Torn() > len(data) {
			t.Fatalf("gave %d bytes and %d torn of %d", total, r.Torn(), len(data))
		}
	})
}
