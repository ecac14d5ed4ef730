package initramfs

import (
	"bytes"
	"io/fs"
	"strings"
	"testing"
)

// FuzzReadCpio: arbitrary bytes never panic, never allocate past the limit,
// and whatever decodes re-encodes to an archive that decodes the same.
func FuzzReadCpio(f *testing.F) {
	var buf bytes.Buffer
	w := NewCpioWriter(&buf)
	_ = w.WriteEntry(Entry{Name: ".", Mode: fs.ModeDir | 0o755})
	_ = w.WriteEntry(Entry{Name: "dev/console", Mode: fs.ModeDevice | fs.ModeCharDevice | 0o600, RdevMajor: 5, RdevMinor: 1})
	_ = w.WriteEntry(Entry{Name: "init", Mode: 0o755, Data: []byte("abc")})
	_ = w.Close()
	f.Add(buf.Bytes())
	f.Add([]byte("070701"))
	f.Fuzz(func(t *testing.T, b []byte) {
		entries, err := ReadCpio(bytes.NewReader(b), 1<<16)
		if err != nil {
			return
		}
		var out bytes.Buffer
		w := NewCpioWriter(&out)
		for _, e := range entries {
			if err := w.WriteEntry(e); err != nil {
				return // names the writer refuses (absolute, "TRAILER!!!")
			}
		}
		_ = w.Close()
		again, err := ReadCpio(bytes.NewReader(out.Bytes()), 1<<16)
		if err != nil {
			t.Fatalf("re-encoded archive does not decode: %v", err)
		}
		if len(again) != len(entries) {
			t.Fatalf("round trip changed the member count: %d != %d", len(again), len(entries))
		}
	})
}

// FuzzParseModulesDep: no panic, and every path accepted stays inside the
// modules directory.
func FuzzParseModulesDep(f *testing.F) {
	f.Add("kernel/a.ko:\nkernel/b.ko: kernel/a.ko\n")
	f.Add("a.ko.xz: b.ko.zst c.ko.gz\n# comment\n\n")
	f.Add("../x.ko:\n")
	f.Fuzz(func(t *testing.T, doc string) {
		md, err := ParseModulesDep(strings.NewReader(doc))
		if err != nil {
			return
		}
		for file, deps := range md.deps {
			for _, p := range append([]string{file}, deps...) {
				if strings.HasPrefix(p, "/") || strings.HasPrefix(p, "../") || p == ".." {
					t.Fatalf("accepted a path leaving the tree: %q", p)
				}
			}
		}
		names := make([]string, 0, len(md.byName))
		for n := range md.byName {
			names = append(names, n)
		}
		_, _ = md.Resolve(names, nil)
	})
}
