package helper

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

// fuzzMarker is the 24-byte secret the fuzz seeds carry in their string
// values (credential, password, env, argv): no error message may quote it.
const fuzzMarker = "SECRET-fuzz-marker-0a1b2"

// marked is s with its secrets replaced by fuzzMarker.
func marked(s string) string {
	return strings.NewReplacer(credential, fuzzMarker, password, fuzzMarker).Replace(s)
}

// FuzzReadPayload feeds the helper's stdin arbitrary bytes: the payload
// comes from the platform's agent, and the helper trusts nothing in it.
// Seeds: the ones below and testdata/fuzz/FuzzReadPayload.
func FuzzReadPayload(f *testing.F) {
	if len(fuzzMarker) != 24 {
		f.Fatalf("the marker is %d bytes", len(fuzzMarker))
	}
	for _, s := range []string{
		marked(payload),
		marked(payload) + "\n \t",
		marked(payload) + "\n" + marked(payload),
		`{}`,
		`{"runtime":{"command":["/bin/true"],"env":{"K":"` + fuzzMarker + `"}}}`,
		``,
		`[` + marked(payload) + `]`,
		`"` + fuzzMarker + `"`,
		marked(`{"Runtime":{"password":"` + password + `"}}`),
		marked(`{"runtime":{"password":"` + password + `"},"runtime":{}}`),
		marked(`{"runtime":{"command":["/bin/true"],"port":4096},"sandbox_io":` + sandboxIOJSON + `}`),
		marked(`{"sandbox_io":{"version":1,"link_url":"` + linkURL + `","credential":"` + credential + `","resource":{},"x":1}}`),
		marked(`{"runtime":{"password":"` + password + `"`),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		b, rest, err := ReadPayload(bytes.NewReader(data))
		if err != nil {
			if b != nil || rest != nil {
				t.Fatalf("an error (%v) with a bootstrap or a rest", err)
			}
			if !errors.Is(err, bootstrap.ErrInvalid) {
				t.Fatalf("the error is not one of package bootstrap's rules: %v", err)
			}
			msg := err.Error()
			if strings.Contains(msg, fuzzMarker) {
				t.Fatalf("the error quotes the input's secret: %q", msg)
			}
			if strings.Contains(msg, "%!") {
				t.Fatalf("bad format in %q", msg)
			}
			return
		}
		if b == nil || rest == nil {
			t.Fatalf("no error, bootstrap %v, rest %v", b, rest)
		}

		// The payload is the first JSON value of data, bounded; the rest is
		// exactly what follows it, nothing lost.
		dec := json.NewDecoder(bytes.NewReader(data))
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			t.Fatalf("accepted what encoding/json refuses: %v", err)
		}
		if len(raw) > bootstrap.MaxSize {
			t.Fatalf("accepted a payload of %d bytes", len(raw))
		}
		end := dec.InputOffset()
		got, err := io.ReadAll(rest)
		if err != nil {
			t.Fatalf("read the rest: %v", err)
		}
		if !bytes.Equal(got, data[end:]) {
			t.Fatalf("the rest is %q, want %q", got, data[end:])
		}
		wantWatch := error(nil)
		if len(bytes.TrimLeft(data[end:], " \t\r\n")) > 0 {
			wantWatch = ErrTrailingInput
		}
		if werr := WatchRest(bytes.NewReader(got)); werr != wantWatch {
			t.Fatalf("WatchRest of %q: %v, want %v", got, werr, wantWatch)
		}

		// It reads as DecodeCore reads the payload alone.
		want, err := bootstrap.DecodeCore(bytes.NewReader(data[:end]))
		if err != nil {
			t.Fatalf("DecodeCore refuses what ReadPayload accepted: %v", err)
		}
		if !reflect.DeepEqual(b, want) {
			t.Fatalf("ReadPayload and DecodeCore differ:\n%+v\n%+v", b, want)
		}

		// And maps back to Core's shape, or says why it cannot.
		c, err := bootstrap.ToCore(b)
		if err != nil {
			if !errors.Is(err, bootstrap.ErrNotCore) {
				t.Fatalf("ToCore: %v", err)
			}
			return
		}
		if _, err := json.Marshal(c); err != nil && !errors.Is(err, bootstrap.ErrSandboxIOTooLarge) {
			t.Fatalf("encode Core's shape: %v", err)
		}
		if verr := b.Validate(); verr != nil && strings.Contains(verr.Error(), fuzzMarker) {
			t.Fatalf("a validation error quotes the input's secret: %q", verr)
		}
	})
}
