package bootstrap

import (
	"errors"
	"fmt"
	"reflect"
	"slices"

	"github.com/oac/sandbox-agent/internal/strictjson"
)

// encoding/json matches keys case-insensitively and keeps the last of
// repeated keys, so DisallowUnknownFields alone lets {"Version":1} and
// {"daemon":{...},"daemon":{...}} through. checkKeys walks the document
// along the Bootstrap type (package internal/strictjson) and refuses any
// key that is not exactly a field's JSON name, any key repeated in one
// object, and anything after the object. Value types are left to
// encoding/json, and values of types with their own strict decoder
// (SandboxIO) to that decoder.

var (
	bootstrapSchema = strictjson.ForType(reflect.TypeFor[Bootstrap]())
	coreSchema      = withMapKeysOnce(strictjson.ForType(reflect.TypeFor[Core]()), "runtime", "env")
)

// withMapKeysOnce makes the map at path (object keys) refuse a key given
// twice: strictjson leaves maps alone, and encoding/json would keep the
// last of two values.
func withMapKeysOnce(s *strictjson.Schema, path ...string) *strictjson.Schema {
	at := s
	for i, name := range path {
		j := slices.IndexFunc(at.Fields, func(f strictjson.Field) bool { return f.Name == name })
		if i == len(path)-1 {
			at.Fields[j].Schema = &strictjson.Schema{Fields: []strictjson.Field{}, OpenKeys: true}
		} else {
			at = at.Fields[j].Schema
		}
	}
	return s
}

// checkKeys checks data against the keys of schema s (bootstrapSchema,
// coreSchema).
func checkKeys(data []byte, s *strictjson.Schema) error {
	err := strictjson.Check(data, s)
	var e *strictjson.Error
	if !errors.As(err, &e) {
		return err
	}
	switch {
	case errors.Is(err, strictjson.ErrUnknown), errors.Is(err, strictjson.ErrCase):
		return fmt.Errorf("%w %s", ErrUnknownKey, at(e.Path))
	case errors.Is(err, strictjson.ErrDuplicate):
		return fmt.Errorf("%w %s", ErrDuplicateKey, at(e.Path))
	case errors.Is(err, strictjson.ErrTrailing):
		return fmt.Errorf("%w: trailing data after the object", ErrDecode)
	case errors.Is(err, strictjson.ErrSyntax):
		return fmt.Errorf("%w: %s", ErrDecode, safeJSONError(e.Cause))
	}
	return fmt.Errorf("%w: %v", ErrDecode, e.Err)
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
