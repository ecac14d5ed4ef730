package strictjson

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var resource = &Schema{Kind: Object, RequireAll: true, Fields: []Field{
	{Name: "id", Schema: &Schema{Kind: String}},
	{Name: "generation", Schema: &Schema{Kind: Int}},
}}

var doc = &Schema{Kind: Object, Fields: []Field{
	{Name: "name", Schema: &Schema{Kind: String}, Required: true},
	{Name: "tags", Schema: &Schema{Kind: Array, MaxItems: 2, Elem: &Schema{Kind: String}}},
	{Name: "on", Schema: &Schema{Kind: Bool}},
	{Name: "resource", Schema: resource},
	{Name: "items", Schema: &Schema{Kind: Array, Elem: resource}},
	{Name: "free"},
}}

func TestCheckAcceptsWhatTheSchemaDescribes(t *testing.T) {
	for _, d := range []string{
		`{"name":"a"}`,
		` {"name":"a","tags":["x","y"],"on":true,"resource":{"id":"r","generation":-3},"free":{"any":[1,{"x":null}]}} `,
		`{"n\u0061me":"a"}`,
		`{"name":"a","items":[{"id":"1","generation":1},{"generation":2,"id":"2"}]}`,
	} {
		assert.NoError(t, Check([]byte(d), doc), d)
	}
}

func TestCheckFindsTheFirstProblemInDocumentOrder(t *testing.T) {
	for _, tc := range []struct {
		doc   string
		err   error
		path  string
		key   string
		index int
	}{
		{``, ErrSyntax, "", "", -1},
		{`{"name":"a"`, ErrSyntax, "", "", -1},
		{`{"name":"a",}`, ErrSyntax, "", "", -1},
		{`{"name":"a"} {}`, ErrTrailing, "", "", -1},
		{`{"name":"a"}x`, ErrTrailing, "", "", -1},
		{`[]`, ErrType, "", "", -1},
		{`{"name":"a","name":"b"}`, ErrDuplicate, "", "name", -1},
		{`{"name":"a","n\u0061me":"b"}`, ErrDuplicate, "", "name", -1},
		{`{"name":"a","resource":{"id":"1","id":"1","generation":1}}`, ErrDuplicate, "resource", "id", -1},
		{`{"Name":"a"}`, ErrCase, "", "Name", -1},
		{`{"name":"a","resource":{"ID":"1"}}`, ErrCase, "resource", "ID", -1},
		{`{"name":"a","extra":1,"name":2}`, ErrUnknown, "", "extra", -1},
		{`{}`, ErrMissing, "", "name", -1},
		{`{"name":"a","resource":{"id":"1"}}`, ErrMissing, "resource", "generation", -1},
		{`{"name":"a","items":[{"id":"1","generation":1},{"id":"2"}]}`, ErrMissing, "items[]", "generation", 1},
		{`{"name":1}`, ErrType, "", "name", -1},
		{`{"name":null}`, ErrType, "", "name", -1},
		{`{"name":"a","on":"true"}`, ErrType, "", "on", -1},
		{`{"name":"a","tags":"x"}`, ErrType, "", "tags", -1},
		{`{"name":"a","tags":[1]}`, ErrType, "tags[]", "", 0},
		{`{"name":"a","tags":["a","b","c"]}`, ErrTooMany, "tags", "", -1},
		{`{"name":"a","resource":{"id":"1","generation":1.0}}`, ErrType, "resource", "generation", -1},
		{`{"name":"a","resource":{"id":"1","generation":1e3}}`, ErrType, "resource", "generation", -1},
		{`{"name":"a","resource":{"id":"1","generation":99999999999999999999}}`, ErrType, "resource", "generation", -1},
		{`{"name":"a","resource":[]}`, ErrType, "", "resource", -1},
		{`{"name":"a","free":` + strings.Repeat("[", 40) + strings.Repeat("]", 40) + `}`, ErrDepth, "free", "", -1},
	} {
		err := Check([]byte(tc.doc), doc)
		var e *Error
		require.True(t, errors.As(err, &e), "%s: %v", tc.doc, err)
		assert.ErrorIs(t, err, tc.err, tc.doc)
		assert.Equal(t, tc.path, e.Path, tc.doc)
		assert.Equal(t, tc.key, e.Key, tc.doc)
		assert.Equal(t, tc.index, e.Index, tc.doc)
	}
}

func TestAnEmptyDocumentIsASyntaxErrorAtOffsetZero(t *testing.T) {
	var e *Error
	require.ErrorAs(t, Check(nil, doc), &e)
	assert.Zero(t, e.Offset)
	assert.NotNil(t, e.Cause)
}

type inner struct {
	Port int `json:"port"`
}

type custom struct{}

func (*custom) UnmarshalJSON([]byte) error { return nil }

type outer struct {
	Name    string            `json:"name,omitempty"`
	Inner   *inner            `json:"inner"`
	List    []inner           `json:"list"`
	Env     map[string]string `json:"env"`
	Own     custom            `json:"own"`
	Skipped string            `json:"-"`
	Plain   int
	private int
}

func TestForTypeChecksKeysAndLeavesTypesToTheDecoder(t *testing.T) {
	s := ForType(reflect.TypeFor[outer]())
	for _, d := range []string{
		`{"name":"x","inner":{"port":1},"list":[{"port":2}],"env":{"A":"1","A":"2"},"own":{"own":1,"own":2},"Plain":1}`,
		`{"name":5,"inner":[],"list":{}}`, // wrong types: encoding/json's to report
		`[1]`, `"x"`,
	} {
		assert.NoError(t, Check([]byte(d), s), d)
	}
	for d, want := range map[string]error{
		`{"Name":"x"}`:                     ErrCase,
		`{"-":1}`:                          ErrUnknown,
		`{"private":1}`:                    ErrUnknown,
		`{"inner":{"port":1,"port":2}}`:    ErrDuplicate,
		`{"list":[{"port":1},{"PORT":1}]}`: ErrCase,
		`{"name":"x","name":"x"}`:          ErrDuplicate,
	} {
		assert.ErrorIs(t, Check([]byte(d), s), want, d)
	}
}
