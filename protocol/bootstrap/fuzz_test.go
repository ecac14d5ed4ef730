package bootstrap

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// FuzzDecodeSandboxIO feeds the strict decoder arbitrary bytes (the private
// file is written by the host and readable by uid 1000 in the guest: both
// ends treat it as untrusted). Seeds: testdata/fuzz/FuzzDecodeSandboxIO.
func FuzzDecodeSandboxIO(f *testing.F) {
	f.Add([]byte(sandboxIOJSON))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := DecodeSandboxIO(data)
		if err != nil {
			// Only a bare sentinel: nothing of the input reaches the message.
			for _, e := range sandboxIOErrors {
				if err == e {
					return
				}
			}
			t.Fatalf("error is not one of the named sentinels: %v", err)
		}
		if len(data) > MaxSandboxIOSize {
			t.Fatalf("accepted %d bytes", len(data))
		}
		// A document the strict decoder accepts is one encoding/json reads
		// the same way, with exactly the contract's keys.
		var loose map[string]json.RawMessage
		if err := json.Unmarshal(data, &loose); err != nil {
			t.Fatalf("accepted a document encoding/json refuses: %v", err)
		}
		sandboxIOKeys := []string{"version", "link_url", "credential", "resource"}
		if len(loose) != len(sandboxIOKeys) {
			t.Fatalf("accepted %d top-level keys", len(loose))
		}
		for k := range loose {
			if !slices.Contains(sandboxIOKeys, k) {
				t.Fatalf("accepted a key outside the contract")
			}
		}
		// Canonical encoding round-trips.
		out, err := s.Encode()
		if err != nil {
			t.Fatalf("encode: %v", err)
		}
		back, err := DecodeSandboxIO(out)
		if err != nil {
			t.Fatalf("canonical form does not decode: %v", err)
		}
		if *back != *s {
			t.Fatalf("round trip changed the value")
		}
		_ = s.Validate(&Identity{TenantID: tenant, EnvironmentID: env, AllocationID: alloc})
	})
}

// FuzzDecodeBootstrap feeds the Bootstrap decoder arbitrary bytes; the guest
// decodes what the host sends and trusts nothing. Seeds:
// testdata/fuzz/FuzzDecodeBootstrap.
func FuzzDecodeBootstrap(f *testing.F) {
	valid, _ := json.Marshal(validDoc())
	f.Add(valid)
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := Decode(bytes.NewReader(data))
		if err != nil {
			return
		}
		verr := b.Validate()
		if verr != nil && strings.Contains(verr.Error(), "%!") {
			t.Fatalf("bad format in %q", verr)
		}
		// Whatever decodes re-encodes to a document that decodes to the
		// same encoding.
		out, err := json.Marshal(b)
		if err != nil {
			if errors.Is(err, ErrSandboxIOTooLarge) {
				return
			}
			t.Fatalf("marshal: %v", err)
		}
		b2, err := Decode(bytes.NewReader(out))
		if err != nil {
			t.Fatalf("re-encoded bootstrap does not decode: %v\n%s", err, out)
		}
		out2, _ := json.Marshal(b2)
		if !bytes.Equal(out, out2) {
			t.Fatalf("round trip changed the bootstrap:\n%s\n%s", out, out2)
		}
		if (b2.Validate() == nil) != (verr == nil) {
			t.Fatalf("validation differs after a round trip")
		}
	})
}

// FuzzDecodeCore feeds the decoder of Core's shape arbitrary bytes: what
// decodes maps to a Bootstrap that maps back (ToCore) to Core's shape
// decoding to the same Bootstrap. Seeds: testdata/fuzz/FuzzDecodeCore.
func FuzzDecodeCore(f *testing.F) {
	f.Add([]byte(coreDoc))
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := DecodeCore(bytes.NewReader(data))
		if err != nil {
			return
		}
		if verr := b.Validate(); verr != nil && strings.Contains(verr.Error(), "%!") {
			t.Fatalf("bad format in %q", verr)
		}
		c, err := ToCore(b)
		if err != nil {
			return // a repeated env name, which Validate refuses too
		}
		out, err := json.Marshal(c)
		if err != nil {
			return // a private file over 16 KiB
		}
		b2, err := DecodeCore(bytes.NewReader(out))
		if err != nil {
			t.Fatalf("Core's shape of a decoded bootstrap does not decode: %v\n%s", err, out)
		}
		if !reflect.DeepEqual(b, b2) {
			t.Fatalf("round trip changed the bootstrap:\n%s", out)
		}
	})
}
