package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strconv"
	"strings"
)

// MaxDepth bounds how deeply objects and arrays may nest.
const MaxDepth = 32

// The problems an Error reports; test with errors.Is.
var (
	ErrSyntax    = errors.New("not valid JSON")
	ErrTrailing  = errors.New("trailing data after the value")
	ErrDuplicate = errors.New("a key appears more than once in one object")
	ErrCase      = errors.New("a key differs from a known one only in letter case")
	ErrUnknown   = errors.New("unknown key")
	ErrMissing   = errors.New("a required key is missing")
	ErrType      = errors.New("a value has the wrong JSON type")
	ErrTooMany   = errors.New("an array has more items than allowed")
	ErrDepth     = errors.New("nested too deeply")
)

// Error is the first problem found in a document.
type Error struct {
	// Err is one of the Err* problems.
	Err error
	// Path is where: "" for the top level, "daemon.health", "processes[]".
	Path string
	// Key is the key concerned: the repeated, case-variant, unknown or
	// missing key, or the member whose value has the wrong type.
	Key string
	// Index is the position of the innermost array element on the path,
	// -1 when there is none.
	Index int
	// Offset is where in the input the problem was found.
	Offset int64
	// Cause is encoding/json's error under ErrSyntax (io.EOF for an
	// empty document).
	Cause error
}

func (e *Error) Error() string {
	s := e.Err.Error()
	if e.Key != "" {
		s += " (" + strconv.Quote(e.Key) + ")"
	}
	if e.Path != "" {
		s += " in " + e.Path
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

// Kind is the JSON type a value must have.
type Kind int

// Kinds. Any checks nothing, except that an object with Keys or an array
// with Elem is walked when the value is one (encoding/json then reports
// a wrong type).
const (
	Any Kind = iota
	Object
	Array
	String
	Int // an integer: no fraction, no exponent, within int64
	Bool
)

// Schema describes a value.
type Schema struct {
	Kind Kind
	// Fields are an object's known keys, in order, and their values.
	Fields []Field
	// RequireAll makes every field required.
	RequireAll bool
	// OpenKeys lets an object have keys besides Fields (their values are
	// not inspected; repeated keys are still refused).
	OpenKeys bool
	// Elem is an array's element; MaxItems bounds the array (0: no bound).
	Elem     *Schema
	MaxItems int
}

// Field is one known key of an object.
type Field struct {
	Name string
	*Schema
	Required bool
}

// Check walks data, which must be exactly one JSON value, along s. It
// returns nil or an *Error.
func Check(data []byte, s *Schema) error {
	w := &walker{dec: json.NewDecoder(bytes.NewReader(data)), index: -1}
	w.dec.UseNumber()
	tok, err := w.token()
	if err != nil {
		return err
	}
	if err := w.value(tok, s, "", 0); err != nil {
		return err
	}
	if _, err := w.dec.Token(); err != io.EOF {
		return w.fail(ErrTrailing, "", "")
	}
	return nil
}

type walker struct {
	dec   *json.Decoder
	index int
}

func (w *walker) fail(problem error, path, key string) *Error {
	return &Error{Err: problem, Path: path, Key: key, Index: w.index, Offset: w.dec.InputOffset()}
}

func (w *walker) token() (json.Token, error) {
	tok, err := w.dec.Token()
	if err != nil {
		e := w.fail(ErrSyntax, "", "")
		e.Cause = err
		return nil, e
	}
	return tok, nil
}

// value checks the value whose first token is tok; key names it in its
// object ("" elsewhere), for a type error.
func (w *walker) value(tok json.Token, s *Schema, path string, depth int) error {
	return w.member(tok, s, path, "", depth)
}

func (w *walker) member(tok json.Token, s *Schema, path, key string, depth int) error {
	if s == nil {
		s = &Schema{}
	}
	d, isDelim := tok.(json.Delim)
	if isDelim && depth >= MaxDepth {
		return w.fail(ErrDepth, path, "")
	}
	wrong := func() error { return w.fail(ErrType, path, key) }
	at := join(path, key)
	switch s.Kind {
	case Object:
		if d != '{' {
			return wrong()
		}
		return w.object(s, at, depth+1)
	case Array:
		if d != '[' {
			return wrong()
		}
		return w.array(s, at, depth+1)
	case String:
		if _, ok := tok.(string); !ok {
			return wrong()
		}
		return nil
	case Bool:
		if _, ok := tok.(bool); !ok {
			return wrong()
		}
		return nil
	case Int:
		n, ok := tok.(json.Number)
		if !ok || strings.ContainsAny(string(n), ".eE") {
			return wrong()
		}
		if _, err := strconv.ParseInt(string(n), 10, 64); err != nil {
			return wrong()
		}
		return nil
	}
	switch {
	case d == '{' && s.Fields != nil:
		return w.object(s, at, depth+1)
	case d == '[' && s.Elem != nil:
		return w.array(s, at, depth+1)
	case isDelim:
		return w.skip(d, at, depth+1)
	}
	return nil
}

func (w *walker) object(s *Schema, path string, depth int) error {
	seen := make(map[string]bool, len(s.Fields))
	for w.dec.More() {
		tok, err := w.token()
		if err != nil {
			return err
		}
		k, _ := tok.(string)
		if seen[k] {
			return w.fail(ErrDuplicate, path, k)
		}
		seen[k] = true
		f, problem := s.field(k)
		if problem != nil {
			return w.fail(problem, path, k)
		}
		if tok, err = w.token(); err != nil {
			return err
		}
		if err := w.member(tok, f, path, k, depth); err != nil {
			return err
		}
	}
	if _, err := w.token(); err != nil { // the closing '}'
		return err
	}
	for _, f := range s.Fields {
		if (f.Required || s.RequireAll) && !seen[f.Name] {
			return w.fail(ErrMissing, path, f.Name)
		}
	}
	return nil
}

// field returns the schema of key k, or why k is not allowed.
func (s *Schema) field(k string) (*Schema, error) {
	for _, f := range s.Fields {
		if f.Name == k {
			return f.Schema, nil
		}
	}
	if s.OpenKeys {
		return nil, nil
	}
	for _, f := range s.Fields {
		if strings.EqualFold(f.Name, k) {
			return nil, ErrCase
		}
	}
	return nil, ErrUnknown
}

func (w *walker) array(s *Schema, path string, depth int) error {
	outer := w.index
	defer func() { w.index = outer }()
	for i := 0; w.dec.More(); i++ {
		if s.MaxItems > 0 && i >= s.MaxItems {
			w.index = outer
			return w.fail(ErrTooMany, path, "")
		}
		w.index = i
		tok, err := w.token()
		if err != nil {
			return err
		}
		if err := w.value(tok, s.Elem, path+"[]", depth); err != nil {
			return err
		}
	}
	w.index = outer
	_, err := w.token() // the closing ']'
	return err
}

// skip consumes the rest of an object or array whose opening delimiter
// was just read, inspecting nothing but the nesting.
func (w *walker) skip(open json.Delim, path string, depth int) error {
	if open != '{' && open != '[' {
		return nil
	}
	for level := 1; level > 0; {
		tok, err := w.token()
		if err != nil {
			return err
		}
		if d, ok := tok.(json.Delim); ok {
			if d == '{' || d == '[' {
				level++
				if depth+level > MaxDepth {
					return w.fail(ErrDepth, path, "")
				}
			} else {
				level--
			}
		}
	}
	return nil
}

func join(path, key string) string {
	switch {
	case key == "":
		return path
	case path == "":
		return key
	}
	return path + "." + key
}

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

// ForType is the schema of Go type t as encoding/json reads it, for
// keys: a struct's objects may have exactly its fields' JSON names (none
// required), slices and arrays are walked, and types with their own
// UnmarshalJSON, maps and scalars are not inspected (Any).
func ForType(t reflect.Type) *Schema {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) {
		return &Schema{}
	}
	switch t.Kind() {
	case reflect.Struct:
		s := &Schema{Fields: []Field{}}
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
			s.Fields = append(s.Fields, Field{Name: name, Schema: ForType(f.Type)})
		}
		return s
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return &Schema{} // []byte is a base64 string
		}
		return &Schema{Elem: ForType(t.Elem())}
	}
	return &Schema{}
}

// String describes a problem for a message: the rule and where.
func (k Kind) String() string {
	return [...]string{"any", "object", "array", "string", "integer", "boolean"}[k]
}
