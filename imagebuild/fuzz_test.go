package imagebuild

import (
	"archive/tar"
	"bytes"
	"io"
	"io/fs"
	"strings"
	"testing"
	"time"
)

// FuzzReadTar: arbitrary bytes never panic; every accepted path stays
// inside the root, hard links point at regular files, and what was read
// writes back out as a tar that reads again to the same paths.
func FuzzReadTar(f *testing.F) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	_ = tw.WriteHeader(&tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755})
	_ = tw.WriteHeader(&tar.Header{Name: "etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644, Size: 3})
	_, _ = tw.Write([]byte("abc"))
	_ = tw.WriteHeader(&tar.Header{Name: "etc/pw", Typeflag: tar.TypeLink, Linkname: "etc/passwd"})
	_ = tw.WriteHeader(&tar.Header{Name: "bin", Typeflag: tar.TypeSymlink, Linkname: "usr/bin"})
	_ = tw.WriteHeader(&tar.Header{Name: "dev/null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3, Mode: 0o666})
	_ = tw.Close()
	f.Add(buf.Bytes())
	f.Add([]byte{0x1f, 0x8b, 8, 0})
	f.Add(bytes.Repeat([]byte{0}, 1024))
	f.Fuzz(func(t *testing.T, b []byte) {
		tree, err := ReadTar(bytes.NewReader(b), memorySink, TarLimits{MaxEntries: 1000, MaxBytes: 1 << 20})
		if err != nil {
			return
		}
		for _, p := range tree.Paths() {
			if strings.HasPrefix(p, "/") || p == ".." || strings.HasPrefix(p, "../") || strings.Contains(p, "/../") {
				t.Fatalf("accepted a path leaving the root: %q", p)
			}
			n := tree.Get(p)
			if n.HardLink != "" {
				if h := tree.Get(n.HardLink); h == nil || !h.IsReg() {
					t.Fatalf("hard link %q to a non-file %q", p, n.HardLink)
				}
			}
		}
		var out bytes.Buffer
		if err := WriteTar(tree, time.Unix(0, 0), &out); err != nil {
			return // e.g. a name too long for any tar format
		}
		again, err := ReadTar(bytes.NewReader(out.Bytes()), memorySink, TarLimits{})
		if err != nil {
			t.Fatalf("written tar does not read: %v", err)
		}
		if again.Len() != tree.Len() {
			t.Fatalf("round trip changed the entry count: %d != %d", again.Len(), tree.Len())
		}
		for _, p := range tree.Paths() {
			a, b := tree.Get(p), again.Get(p)
			if b == nil || a.Mode&(fs.ModeType|fs.ModePerm) != b.Mode&(fs.ModeType|fs.ModePerm) {
				t.Fatalf("round trip changed %q", p)
			}
		}
	})
}

// FuzzParseOCI: the layout's JSON parsers never panic and accept only
// descriptors with a sha256 digest and a sane size.
func FuzzParseOCI(f *testing.F) {
	f.Add([]byte(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:` + strings.Repeat("a", 64) + `","size":10}]}`))
	f.Add([]byte(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:` + strings.Repeat("b", 64) + `","size":5},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:` + strings.Repeat("c", 64) + `","size":7}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if idx, err := ParseIndex(b); err == nil {
			for _, d := range idx.Manifests {
				if !digestRE.MatchString(d.Digest) || d.Size < 0 {
					t.Fatalf("accepted descriptor %+v", d)
				}
			}
		}
		if m, err := ParseManifest(b); err == nil {
			if !digestRE.MatchString(m.Config.Digest) || len(m.Layers) == 0 {
				t.Fatalf("accepted manifest %+v", m)
			}
		}
	})
}

// memorySink keeps contents in memory.
func memorySink(index int, r io.Reader) (string, []byte, error) {
	b, err := io.ReadAll(r)
	return "", b, err
}
