package apiserver

import (
	"bytes"
	"context"
	"testing"

	"github.com/oac/sandbox-agent/api"
	"github.com/stretchr/testify/require"
)

// FuzzServeLines feeds an arbitrary byte stream to the line framing: it
// must never panic, answer at most one line per input line, and never
// answer with more than api.MaxLine bytes of input accepted as one command.
func FuzzServeLines(f *testing.F) {
	f.Add([]byte("{\"cmd\":\"status\"}\n{\"cmd\":\"stop\"}\r\n\n"))
	f.Add([]byte("{\"cmd\":\"status\"}"))
	f.Add([]byte("\n\n\r\n  \n"))
	f.Add(append(bytes.Repeat([]byte("x"), api.MaxLine+10), '\n'))
	f.Fuzz(func(t *testing.T, data []byte) {
		s := &Server{Handler: HandlerFunc(func(context.Context, api.Command) (any, error) { return nil, nil })}
		n := 0
		err := s.ServeLines(context.Background(), bytes.NewReader(data), func(api.Answer) error { n++; return nil })
		require.NoError(t, err)
		require.LessOrEqual(t, n, bytes.Count(data, []byte("\n"))+1)
	})
}
