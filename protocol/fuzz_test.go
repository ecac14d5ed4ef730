package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// FuzzReadFrame feeds arbitrary bytes to the frame reader the way a hostile
// peer would. It must never panic, never return a body over the limit, never
// read past a refused header, and every accepted frame must re-encode to the
// bytes it was read from.
func FuzzReadFrame(f *testing.F) {
	f.Add(AppendFrame(nil, TypeHello, []byte(`{"min_version":1,"max_version":1,"agent_version":"0.1","pid":1}`)))
	f.Add(AppendFrame(nil, TypeStreamHeader, []byte(`{"kind":"control"}`)))
	f.Add(AppendFrame(nil, TypeShutdown, nil))
	f.Add(frameHeader(TypeBootstrap, 0, MaxControlFrame+1))
	f.Add(frameHeader(TypeHello, 1, 2))
	f.Add([]byte("GET / HTTP/1.1\r\n"))
	f.Add([]byte{0, 1, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := &countingReader{r: bytes.NewReader(data)}
		fr, err := ReadFrame(r, MaxControlFrame)
		if err != nil {
			require.Nil(t, fr.Body, "no body alongside an error")
			switch {
			case errors.Is(err, io.EOF):
				require.Empty(t, data, "io.EOF only for a stream that ended between frames")
			case errors.Is(err, ErrTruncated):
			case errors.Is(err, ErrUnknownType), errors.Is(err, ErrBadFlags), errors.Is(err, ErrFrameTooLarge):
				require.Equal(t, HeaderSize, r.n, "a refused header must stop the read before the body")
			default:
				t.Fatalf("unclassified error %v", err)
			}
			return
		}
		require.LessOrEqual(t, len(fr.Body), MaxControlFrame)
		require.True(t, fr.Type.Known())
		require.Equal(t, HeaderSize+len(fr.Body), r.n, "exactly one frame consumed")
		require.Equal(t, data[:r.n], AppendFrame(nil, fr.Type, fr.Body))
	})
}

// FuzzDecodeMessages decodes arbitrary frame bodies into every message type.
// An accepted body is one valid JSON object, and decoding is stable: what we
// decode, re-encode and decode again encodes the same.
func FuzzDecodeMessages(f *testing.F) {
	f.Add([]byte(`{"min_version":1,"max_version":2,"agent_version":"a","pid":1,"capabilities":["x"]}`))
	f.Add([]byte(`{"version":1,"host_version":"h","time_unix_nano":-1}`))
	f.Add([]byte(`{"state":"failed","process":{"name":"daemon","exit_code":1,"running":false}}`))
	f.Add([]byte(`{"code":"version_mismatch","message":"m","min_version":1,"max_version":1}`))
	f.Add([]byte(`{"kind":"log","name":"daemon/stdout"}`))
	f.Add([]byte(`{"kind":"forward","port":4096}`))
	f.Add([]byte(`{"time_unix_nano":1700000000000000000}`))
	f.Add([]byte(`{"token":"0123456789abcdef0123456789abcdef"}`))
	f.Add([]byte(`{"id":18446744073709551615,"host":"api.example.com","port":443,"via":"transparent"}`))
	f.Add([]byte(`{"id":3,"code":3,"error":"Denied","effect":"none","reason":"no rule","rule":""}`))
	f.Add([]byte(`{"port":4096,"name":"daemon"}`))
	f.Add([]byte(`{} {}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"pid":1e99}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, typ := range []Type{TypeHello, TypeWelcome, TypeState, TypeShutdown, TypeError, TypeStreamHeader, TypeTime, TypeChannel, TypeConnect, TypeConnected, TypeForward} {
			checkDecode(t, typ, body)
		}
	})
}

func checkDecode(t *testing.T, typ Type, body []byte) {
	fresh := func() any {
		switch typ {
		case TypeHello:
			return &Hello{}
		case TypeWelcome:
			return &Welcome{}
		case TypeState:
			return &State{}
		case TypeShutdown:
			return &Shutdown{}
		case TypeError:
			return &Error{}
		case TypeStreamHeader:
			return &StreamHeader{}
		case TypeTime:
			return &Time{}
		case TypeChannel:
			return &Channel{}
		case TypeConnect:
			return &Connect{}
		case TypeConnected:
			return &Connected{}
		case TypeForward:
			return &Forward{}
		}
		panic("unreachable")
	}
	v := fresh()
	err := Frame{Type: typ, Body: body}.Decode(v)
	if err != nil {
		require.ErrorIs(t, err, ErrBadBody)
		return
	}
	trimmed := bytes.TrimSpace(body)
	require.True(t, json.Valid(trimmed), "accepted invalid JSON")
	require.Equal(t, byte('{'), trimmed[0], "accepted a body that is not an object")
	switch m := v.(type) {
	case *StreamHeader:
		_ = m.Validate()
	case *Connect:
		if m.Validate() == nil {
			require.LessOrEqual(t, len(m.Token), MaxDataToken)
			require.NoError(t, m.Header().Validate(), "a valid Connect is a valid egress header")
		}
	case *Connected:
		_ = m.EgressReply.Validate()
	case *Forward:
		_ = m.Header().Validate()
	}
	enc1, err := json.Marshal(v)
	require.NoError(t, err)
	v2 := fresh()
	require.NoError(t, Frame{Type: typ, Body: enc1}.Decode(v2))
	enc2, err := json.Marshal(v2)
	require.NoError(t, err)
	require.Equal(t, string(enc1), string(enc2))
}

// FuzzStreamHeader reads a stream header from arbitrary bytes as the host
// does for every stream a guest opens. Whatever it accepts is valid, it
// never reads more than one header frame, and it always clears its deadline.
func FuzzStreamHeader(f *testing.F) {
	f.Add(AppendFrame(nil, TypeStreamHeader, []byte(`{"kind":"control"}`)))
	f.Add(AppendFrame(nil, TypeStreamHeader, []byte(`{"kind":"log","name":"daemon/stdout"}`)))
	f.Add(AppendFrame(nil, TypeStreamHeader, []byte(`{"kind":"log","name":"a\nb"}`)))
	f.Add(AppendFrame(nil, TypeStreamHeader, []byte(`{"kind":"shell"}`)))
	f.Add(AppendFrame(nil, TypeError, []byte(`{"code":"internal","message":"x"}`)))
	f.Add(frameHeader(TypeStreamHeader, 0, MaxHeaderFrame+1))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := &countingReader{r: bytes.NewReader(data)}
		c := newFakeConn(r)
		h, err := ReadStreamHeader(c, time.Minute)

		require.LessOrEqual(t, r.n, HeaderSize+MaxHeaderFrame)
		d := c.recorded()
		require.NotEmpty(t, d)
		require.True(t, d[len(d)-1].IsZero(), "deadline left set")
		if err != nil {
			return
		}
		require.NoError(t, h.Validate())
		require.LessOrEqual(t, len(h.Name), MaxStreamName)
		require.False(t, strings.ContainsFunc(h.Name, func(r rune) bool { return r < 0x20 || r == 0x7f }))
	})
}
