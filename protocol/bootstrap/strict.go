package bootstrap

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
)

// encoding/json matches keys case-insensitively and keeps the last of
// repeated keys, so DisallowUnknownFields alone lets {"Version":1} and
// {"daemon":{...},"daemon":{...}} through. checkKeys walks the document's
// tokens along the Bootstrap type and refuses any key that is not exactly a
// field's JSON name, and any key repeated in one object. Values of types
// with their own strict decoder (SandboxIO) are left to that decoder.

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

// checkKeys checks data against the Bootstrap schema's keys. Syntax errors
// are reported as ErrDecode; value types are left to encoding/json.
func checkKeys(data []byte) error { return checkKeysOf(data, reflect.TypeFor[Bootstrap]()) }

// checkKeysOf checks data against the keys of type t.
func checkKeysOf(data []byte, t reflect.Type) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	return walkKeys(dec, t, "")
}

func walkKeys(dec *json.Decoder, t reflect.Type, where string) error {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("%w: %s", ErrDecode, safeJSONError(err))
	}
	d, isDelim := tok.(json.Delim)
	if !isDelim {
		return nil // a scalar: its type is checked by encoding/json
	}
	if t == nil || reflect.PointerTo(t).Implements(unmarshalerType) {
		return skipValue(dec, d)
	}
	switch {
	case d == '{' && (t.Kind() == reflect.Struct || t.Kind() == reflect.Map):
		// A struct takes exactly its fields' names; a map any key once.
		var fields map[string]reflect.Type
		if t.Kind() == reflect.Struct {
			fields = jsonFields(t)
		}
		seen := map[string]bool{}
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return fmt.Errorf("%w: %s", ErrDecode, safeJSONError(err))
			}
			key, _ := tok.(string)
			ft, ok := fields[key]
			name := key
			if fields == nil {
				// A map's keys are input: never echoed in an error.
				ft, ok, name = t.Elem(), true, "{}"
			}
			if !ok {
				return fmt.Errorf("%w %s", ErrUnknownKey, at(where))
			}
			if seen[key] {
				return fmt.Errorf("%w %s", ErrDuplicateKey, at(where))
			}
			seen[key] = true
			if err := walkKeys(dec, ft, join(where, name)); err != nil {
				return err
			}
		}
		_, err := dec.Token()
		if err != nil {
			return fmt.Errorf("%w: %s", ErrDecode, safeJSONError(err))
		}
		return nil
	case d == '[' && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array):
		for dec.More() {
			if err := walkKeys(dec, t.Elem(), where+"[]"); err != nil {
				return err
			}
		}
		_, err := dec.Token()
		if err != nil {
			return fmt.Errorf("%w: %s", ErrDecode, safeJSONError(err))
		}
		return nil
	}
	// The wrong JSON type for t: encoding/json reports it.
	return skipValue(dec, d)
}

// skipValue consumes the rest of an object or array whose opening
// delimiter was just read.
func skipValue(dec *json.Decoder, open json.Delim) error {
	if open != '{' && open != '[' {
		return nil
	}
	depth := 1
	for depth > 0 {
		tok, err := dec.Token()
		if err != nil {
			return fmt.Errorf("%w: %s", ErrDecode, safeJSONError(err))
		}
		if d, ok := tok.(json.Delim); ok {
			if d == '{' || d == '[' {
				depth++
			} else {
				depth--
			}
		}
	}
	return nil
}

// jsonFields maps a struct's exact JSON names to field types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	m := make(map[string]reflect.Type, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		m[name] = f.Type
	}
	return m
}

func join(where, key string) string {
	if where == "" {
		return key
	}
	return where + "." + key
}

func at(where string) string {
	if where == "" {
		return "at the top level"
	}
	return "in " + where
}

// sandboxIOErrors are the strict decoder's errors, passed through Decode
// unchanged so callers can test them with errors.Is.
var sandboxIOErrors = []error{
	ErrSandboxIOTooLarge, ErrSandboxIOSyntax, ErrSandboxIOTrailing, ErrSandboxIODuplicateKey,
	ErrSandboxIOKeyCase, ErrSandboxIOUnknownKey, ErrSandboxIOMissingKey, ErrSandboxIOType,
	ErrSandboxIOVersion, ErrNoLink,
}

func isSandboxIOError(err error) bool {
	for _, e := range sandboxIOErrors {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
