package strictjson

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzCheck feeds arbitrary documents to the walker, as a hostile writer
// of a bootstrap, a command or a manifest could. It must never panic;
// every refusal is an *Error; an accepted document is one valid JSON value
// that encoding/json decodes into the schema's shape.
func FuzzCheck(f *testing.F) {
	for _, s := range []string{
		`{"name":"a"}`, `{"name":"a","tags":["x"],"resource":{"id":"1","generation":1}}`,
		`{"name":"a","name":"b"}`, `{"n\u0061me":"a","name":"b"}`, `{"Name":"a"}`, `{"name":"a"} {}`,
		`{"name":"a","free":[[[[[]]]]]}`, `[`, ``, "{\"name\":\"\xff\"}", `{"name":"a","resource":{"generation":1e3}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		err := Check(data, doc)
		if err != nil {
			var e *Error
			require.True(t, errors.As(err, &e))
			return
		}
		require.True(t, json.Valid(data))
		var v struct {
			Name     string   `json:"name"`
			Tags     []string `json:"tags"`
			On       bool     `json:"on"`
			Resource struct {
				ID         string `json:"id"`
				Generation int64  `json:"generation"`
			} `json:"resource"`
		}
		require.NoError(t, json.Unmarshal(data, &v))
		require.LessOrEqual(t, len(v.Tags), 2)
	})
}
