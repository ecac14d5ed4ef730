package manifest

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
)

// FuzzDecode: arbitrary bytes never panic; whatever decodes is valid,
// re-encodes, and decodes to the same manifest (mirrors and install
// included).
func FuzzDecode(f *testing.F) {
	f.Add([]byte(valid()))
	f.Add([]byte(`{"schema":1,"release":"r","artifacts":[]}`))
	f.Add([]byte(`{"schema":1,"schema":1}`))
	f.Add([]byte(`{"Schema":1}`))
	f.Add([]byte(valid() + "{}"))
	f.Add([]byte(withMirrorsAndInstall()))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(bytes.NewReader(b))
		if err != nil {
			if !strings.Contains(err.Error(), "invalid manifest") {
				t.Fatalf("error does not wrap ErrInvalid: %v", err)
			}
			return
		}
		if err := m.Validate(); err != nil {
			t.Fatalf("decoded an invalid manifest: %v", err)
		}
		var buf bytes.Buffer
		if err := Encode(m, &buf); err != nil {
			t.Fatalf("encode: %v", err)
		}
		again, err := Decode(&buf)
		if err != nil {
			t.Fatalf("re-encoded manifest does not decode: %v", err)
		}
		if !reflect.DeepEqual(again, m) {
			t.Fatal("round trip changed the manifest")
		}
	})
}
