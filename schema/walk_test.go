package schema_test

import (
	"encoding/json"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/protocol/bootstrap"
	"github.com/oac/sandbox-agent/schema"
)

// The schema files as plain JSON, to walk them next to the Go types.

type node = map[string]any

type docs map[string]node

func loadDocs(t *testing.T) docs {
	t.Helper()
	d := docs{}
	for _, n := range schema.Names {
		data, err := schema.File(n)
		require.NoError(t, err)
		var v node
		require.NoError(t, json.Unmarshal(data, &v), n)
		d[n] = v
	}
	return d
}

// at is a schema node and the file it is in (for relative $refs).
type at struct {
	file string
	n    node
}

// def returns a $defs entry of a file.
func (d docs) def(file, name string) at {
	defs, _ := d[file]["$defs"].(node)
	n, _ := defs[name].(node)
	if n == nil {
		panic("no $defs/" + name + " in " + file)
	}
	return at{file, n}
}

// resolve follows $ref until the node has none.
func (d docs) resolve(a at) at {
	for {
		ref, ok := a.n["$ref"].(string)
		if !ok {
			return a
		}
		file, frag, _ := strings.Cut(ref, "#")
		if file == "" {
			file = a.file
		}
		if frag == "" {
			a = at{file, d[file]}
			continue
		}
		a = d.def(file, strings.TrimPrefix(frag, "/$defs/"))
	}
}

// alternatives returns the object schemas a node stands for: itself, or
// each alternative of its oneOf, recursively.
func (d docs) alternatives(a at) []at {
	a = d.resolve(a)
	one, ok := a.n["oneOf"].([]any)
	if !ok {
		return []at{a}
	}
	var out []at
	for _, x := range one {
		out = append(out, d.alternatives(at{a.file, x.(node)})...)
	}
	return out
}

// properties returns the union of the properties of a node's
// alternatives, and for each the alternatives that have it.
func (d docs) properties(a at) map[string][]at {
	out := map[string][]at{}
	for _, alt := range d.alternatives(a) {
		props, _ := alt.n["properties"].(node)
		for k, v := range props {
			pv, ok := v.(node)
			if !ok {
				continue
			}
			out[k] = append(out[k], at{alt.file, pv})
		}
	}
	return out
}

func required(a at) []string {
	var out []string
	r, _ := a.n["required"].([]any)
	for _, x := range r {
		out = append(out, x.(string))
	}
	return out
}

// jsonType is the JSON type a schema node allows: from type, const, enum
// or its alternatives ("" when it does not say).
func (d docs) jsonType(a at) string {
	a = d.resolve(a)
	if t, ok := a.n["type"].(string); ok {
		return t
	}
	typeOf := func(v any) string {
		switch v.(type) {
		case string:
			return "string"
		case bool:
			return "boolean"
		case float64:
			return "integer"
		}
		return "?"
	}
	if c, ok := a.n["const"]; ok {
		return typeOf(c)
	}
	if e, ok := a.n["enum"].([]any); ok && len(e) > 0 {
		return typeOf(e[0])
	}
	if one, ok := a.n["oneOf"].([]any); ok && len(one) > 0 {
		return d.jsonType(at{a.file, one[0].(node)})
	}
	return ""
}

// field is one JSON field of a Go struct.
type field struct {
	name      string
	typ       reflect.Type
	omitempty bool
}

// fieldsOf lists a struct's JSON fields, embedded structs flattened.
func fieldsOf(t reflect.Type) []field {
	var out []field
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		name, opts, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			out = append(out, fieldsOf(f.Type)...)
			continue
		}
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, field{name, f.Type, slices.Contains(strings.Split(opts, ","), "omitempty")})
	}
	return out
}

var (
	timeType     = reflect.TypeFor[time.Time]()
	durationType = reflect.TypeFor[bootstrap.Duration]()
	rawType      = reflect.TypeFor[json.RawMessage]()
)

// agree checks that Go type t and schema node a describe the same JSON: the
// same JSON type, and for structs the same field names (the union of the
// alternatives' properties) with agreeing types. With output set, a field
// Go always writes (no omitempty) must be required by every alternative.
func (d docs) agree(t *testing.T, path string, typ reflect.Type, a at, output bool) {
	t.Helper()
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	want := d.jsonType(a)
	switch {
	case typ == timeType, typ == durationType:
		assert.Equal(t, "string", want, path)
		return
	case typ.Kind() == reflect.Interface:
		return // "result": per command, checked on its own
	case typ == rawType:
		// A document kept as its bytes (claim's bootstrap): an object, its
		// own schema checked against its own Go type.
		assert.Equal(t, "object", want, path)
		return
	}
	switch typ.Kind() {
	case reflect.String:
		assert.Equal(t, "string", want, path)
	case reflect.Bool:
		assert.Equal(t, "boolean", want, path)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		assert.Equal(t, "integer", want, path)
	case reflect.Slice:
		if assert.Equal(t, "array", want, path) {
			r := d.resolve(a)
			items, ok := r.n["items"].(node)
			if assert.True(t, ok, "%s: an array schema says what its items are", path) {
				d.agree(t, path+"[]", typ.Elem(), at{r.file, items}, output)
			}
		}
	case reflect.Map:
		if assert.Equal(t, "object", want, path) {
			r := d.resolve(a)
			items, ok := r.n["additionalProperties"].(node)
			if assert.True(t, ok, "%s: a map schema says what its values are", path) {
				d.agree(t, path+"{}", typ.Elem(), at{r.file, items}, output)
			}
		}
	case reflect.Struct:
		d.agreeStruct(t, path, typ, a, output)
	default:
		t.Errorf("%s: Go kind %s has no JSON type here", path, typ.Kind())
	}
}

func (d docs) agreeStruct(t *testing.T, path string, typ reflect.Type, a at, output bool) {
	t.Helper()
	props := d.properties(a)
	fields := fieldsOf(typ)
	var goNames, schemaNames []string
	for _, f := range fields {
		goNames = append(goNames, f.name)
	}
	for k := range props {
		schemaNames = append(schemaNames, k)
	}
	sort.Strings(goNames)
	sort.Strings(schemaNames)
	assert.Equal(t, goNames, schemaNames, "%s: the JSON fields of Go type %s and the schema's properties", path, typ)
	for _, f := range fields {
		for _, p := range props[f.name] {
			d.agree(t, path+"."+f.name, f.typ, p, output)
		}
		if output && !f.omitempty {
			for _, alt := range d.alternatives(a) {
				assert.Contains(t, required(alt), f.name, "%s: Go always writes %q, so the schema requires it", path, f.name)
			}
		}
	}
}
