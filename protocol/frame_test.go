package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAppendFrameWritesBigEndianHeaderThenBody(t *testing.T) {
	got := AppendFrame([]byte("prefix"), TypeStreamHeader, []byte(`{"kind":"log"}`))

	want := append([]byte("prefix"), 0x00, 0x07, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0e)
	want = append(want, `{"kind":"log"}`...)
	assert.Equal(t, want, got)
}

func TestFrameRoundTripsThroughWriteFrameAndReadFrame(t *testing.T) {
	for typ := range typeNames {
		t.Run(typ.String(), func(t *testing.T) {
			var buf bytes.Buffer
			require.NoError(t, WriteFrame(&buf, typ, []byte(`{"a":1}`)))

			f, err := ReadFrame(&buf, MaxControlFrame)
			require.NoError(t, err)
			assert.Equal(t, Frame{Type: typ, Body: []byte(`{"a":1}`)}, f)
			assert.Zero(t, buf.Len(), "ReadFrame must consume exactly one frame")
		})
	}
}

func TestReadFrameReadsBackToBackFramesOneAtATime(t *testing.T) {
	var stream []byte
	stream = AppendFrame(stream, TypeState, []byte(`{"state":"ready"}`))
	stream = AppendFrame(stream, TypeShutdown, nil)
	r := bytes.NewReader(stream)

	f1, err := ReadFrame(r, MaxControlFrame)
	require.NoError(t, err)
	assert.Equal(t, TypeState, f1.Type)
	f2, err := ReadFrame(r, MaxControlFrame)
	require.NoError(t, err)
	assert.Equal(t, TypeShutdown, f2.Type)
	assert.Empty(t, f2.Body)
	_, err = ReadFrame(r, MaxControlFrame)
	assert.ErrorIs(t, err, io.EOF)
}

func TestReadFrameReportsCleanEOFBetweenFramesAsEOFNotTruncation(t *testing.T) {
	_, err := ReadFrame(bytes.NewReader(nil), MaxControlFrame)

	assert.Equal(t, io.EOF, err, "a peer that closes between frames ended the stream cleanly")
	assert.NotErrorIs(t, err, ErrTruncated)
}

func TestReadFrameRefusesGarbageAsUnknownType(t *testing.T) {
	for name, garbage := range map[string]string{
		"http request":   "GET / HTTP/1.1\r\nHost: x\r\n\r\n",
		"ssh banner":     "SSH-2.0-OpenSSH_9.6\r\n",
		"zero bytes":     strings.Repeat("\x00", 16),
		"all ones":       strings.Repeat("\xff", 16),
		"type past last": string(frameHeader(lastType()+1, 0, 2)) + "{}",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ReadFrame(strings.NewReader(garbage), MaxControlFrame)

			require.ErrorIs(t, err, ErrUnknownType)
			assert.Contains(t, err.Error(), "another protocol or sent garbage")
		})
	}
}

func TestReadFrameReportsTruncatedHeader(t *testing.T) {
	for n := 1; n < HeaderSize; n++ {
		hdr := frameHeader(TypeHello, 0, 2)[:n]

		_, err := ReadFrame(bytes.NewReader(hdr), MaxControlFrame)

		require.ErrorIs(t, err, ErrTruncated, "header of %d bytes", n)
		assert.Contains(t, err.Error(), "header cut short")
	}
}

func TestReadFrameReportsTruncatedBody(t *testing.T) {
	data := append(frameHeader(TypeHello, 0, 10), `{"min`...)

	_, err := ReadFrame(bytes.NewReader(data), MaxControlFrame)

	require.ErrorIs(t, err, ErrTruncated)
	assert.Contains(t, err.Error(), "body of 10 bytes")
}

func TestHostRefusesOversizedFrameBeforeReadingBody(t *testing.T) {
	for _, n := range []uint32{MaxControlFrame + 1, 1 << 30, 0xffffffff} {
		// The peer really sends the body it announced: the reader never runs
		// dry, so only the length check stops the read.
		r := &countingReader{r: io.MultiReader(bytes.NewReader(frameHeader(TypeBootstrap, 0, n)), endless{})}

		_, err := ReadFrame(r, MaxControlFrame)

		require.ErrorIs(t, err, ErrFrameTooLarge)
		assert.Equal(t, HeaderSize, r.n, "no body byte may be read once the length is refused")
		assert.Contains(t, err.Error(), "limit 262144")
	}
}

func TestHostRefusesOversizedFrameWithoutAllocatingItsBody(t *testing.T) {
	hdr := frameHeader(TypeBootstrap, 0, 0xffffffff)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)

	for range 100 {
		_, err := ReadFrame(bytes.NewReader(hdr), MaxControlFrame)
		require.ErrorIs(t, err, ErrFrameTooLarge)
	}

	runtime.ReadMemStats(&after)
	// 100 refusals of a 4 GiB body: only the small error values are allocated.
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(1<<20))
}

func TestReadFrameAcceptsBodyExactlyAtTheLimit(t *testing.T) {
	body := bytes.Repeat([]byte("a"), MaxHeaderFrame)

	f, err := ReadFrame(bytes.NewReader(AppendFrame(nil, TypeStreamHeader, body)), MaxHeaderFrame)
	require.NoError(t, err)
	assert.Len(t, f.Body, MaxHeaderFrame)

	_, err = ReadFrame(bytes.NewReader(AppendFrame(nil, TypeStreamHeader, append(body, 'a'))), MaxHeaderFrame)
	assert.ErrorIs(t, err, ErrFrameTooLarge)
}

func TestReadFrameRefusesNonZeroFlags(t *testing.T) {
	for _, flags := range []uint16{0x0001, 0x8000, 0xffff} {
		data := append(frameHeader(TypeHello, flags, 2), "{}"...)

		_, err := ReadFrame(bytes.NewReader(data), MaxControlFrame)

		require.ErrorIs(t, err, ErrBadFlags)
	}
}

func TestReadFrameChecksTypeThenFlagsThenLength(t *testing.T) {
	_, err := ReadFrame(bytes.NewReader(frameHeader(0x0999, 1, 0xffffffff)), MaxControlFrame)
	assert.ErrorIs(t, err, ErrUnknownType)

	_, err = ReadFrame(bytes.NewReader(frameHeader(TypeHello, 1, 0xffffffff)), MaxControlFrame)
	assert.ErrorIs(t, err, ErrBadFlags)
}

func TestReadFrameCutsOffPeerStallingMidFrame(t *testing.T) {
	shortenFrameBodyTimeout(t, 100*time.Millisecond)
	reader, peer := pipePair(t)
	go func() {
		// Header and 3 of 10 body bytes, then silence.
		_, _ = peer.Write(append(frameHeader(TypeHello, 0, 10), `{"m`...))
	}()

	start := time.Now()
	_, err := ReadFrame(reader, MaxControlFrame)

	require.ErrorIs(t, err, ErrTruncated)
	assert.Contains(t, err.Error(), "timeout")
	assert.Less(t, time.Since(start), 5*time.Second)
}

func TestReadFrameWaitsForAHeaderWithoutABodyDeadline(t *testing.T) {
	// Between frames the peer may be quiet for as long as it likes: only a
	// started frame is timed.
	shortenFrameBodyTimeout(t, 20*time.Millisecond)
	reader, peer := pipePair(t)
	go func() {
		time.Sleep(100 * time.Millisecond)
		_, _ = peer.Write(AppendFrame(nil, TypeShutdown, []byte(`{}`)))
	}()

	f, err := ReadFrame(reader, MaxControlFrame)

	require.NoError(t, err)
	assert.Equal(t, TypeShutdown, f.Type)
}

func TestReadFrameClearsTheBodyDeadlineAfterwards(t *testing.T) {
	r := &deadlineRecorder{Reader: bytes.NewReader(AppendFrame(nil, TypeHello, []byte(`{}`)))}

	before := time.Now()
	_, err := ReadFrame(r, MaxControlFrame)
	require.NoError(t, err)

	d := r.recorded()
	require.Len(t, d, 2)
	assert.WithinDuration(t, before.Add(FrameBodyTimeout), d[0], time.Second)
	assert.True(t, d[1].IsZero(), "the body deadline must be cleared after the frame")
}

func TestReadFrameSetsNoDeadlineForAnEmptyBody(t *testing.T) {
	r := &deadlineRecorder{Reader: bytes.NewReader(AppendFrame(nil, TypeShutdown, nil))}

	_, err := ReadFrame(r, MaxControlFrame)

	require.NoError(t, err)
	assert.Empty(t, r.recorded())
}

func TestControlBodyTimeoutNeverExtendsTheCallersDeadline(t *testing.T) {
	// FrameBodyTimeout stays at 10 s: a peer that starts a frame just before
	// the caller's deadline must not buy itself 10 more seconds.
	local, peer := pipePair(t)
	c := NewControl(local)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(150*time.Millisecond)))
	go func() { _, _ = peer.Write(frameHeader(TypeState, 0, 10)) }()

	start := time.Now()
	_, err := c.Recv()

	require.ErrorIs(t, err, ErrTruncated)
	assert.Less(t, time.Since(start), 3*time.Second)
}

func TestControlKeepsItsReadDeadlineAcrossFrames(t *testing.T) {
	local, peer := pipePair(t)
	c := NewControl(local)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(300*time.Millisecond)))
	go func() { _, _ = peer.Write(AppendFrame(nil, TypeState, []byte(`{"state":"ready"}`))) }()

	var st State
	require.NoError(t, c.RecvMessage(TypeState, &st))
	assert.Equal(t, StateReady, st.State)

	// Reading that frame must not have cleared the deadline the caller set.
	done := make(chan error, 1)
	go func() { _, err := c.Recv(); done <- err }()
	select {
	case err := <-done:
		var ne interface{ Timeout() bool }
		require.ErrorAs(t, err, &ne)
		assert.True(t, ne.Timeout())
	case <-time.After(5 * time.Second):
		local.Close()
		<-done
		t.Fatal("the second Recv ignored the deadline set on the Control")
	}
}

func TestWriteFrameRefusesBodiesOverTheControlLimit(t *testing.T) {
	var buf bytes.Buffer

	err := WriteFrame(&buf, TypeBootstrap, make([]byte, MaxControlFrame+1))

	require.ErrorIs(t, err, ErrFrameTooLarge)
	assert.Zero(t, buf.Len(), "nothing may be written")
	require.NoError(t, WriteFrame(&buf, TypeBootstrap, make([]byte, MaxControlFrame)))
}

// writeCounter counts Write calls.
type writeCounter struct{ calls int }

func (w *writeCounter) Write(p []byte) (int, error) { w.calls++; return len(p), nil }

func TestWriteFrameWritesAFrameInOneWriteCall(t *testing.T) {
	w := &writeCounter{}

	require.NoError(t, WriteFrame(w, TypeState, []byte(`{"state":"ready"}`)))

	assert.Equal(t, 1, w.calls)
}

func TestWriteMessageReportsValuesThatCannotBeEncoded(t *testing.T) {
	var buf bytes.Buffer

	err := WriteMessage(&buf, TypeState, map[string]any{"c": make(chan int)})

	require.Error(t, err)
	assert.Contains(t, err.Error(), "encode State")
	assert.Zero(t, buf.Len())
}

func TestDecodeRequiresExactlyOneJSONObject(t *testing.T) {
	for _, tc := range []struct {
		name string
		body string
		ok   bool
	}{
		{"object", `{"state":"ready"}`, true},
		{"object with surrounding whitespace", " \n\t{\"state\":\"ready\"}\r\n ", true},
		{"empty object", `{}`, true},
		{"empty body", ``, false},
		{"only whitespace", "  \n ", false},
		{"null", `null`, false},
		{"array", `[{"state":"ready"}]`, false},
		{"string", `"ready"`, false},
		{"number", `42`, false},
		{"trailing object", `{"state":"ready"}{"state":"failed"}`, false},
		{"trailing garbage", `{"state":"ready"}x`, false},
		{"trailing NUL", "{\"state\":\"ready\"}\x00", false},
		{"trailing comma", `{"state":"ready"},`, false},
		{"unterminated object", `{"state":"ready"`, false},
		{"wrong field type", `{"state":1}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var st State
			err := Frame{Type: TypeState, Body: []byte(tc.body)}.Decode(&st)
			if tc.ok {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrBadBody)
			assert.True(t, strings.HasPrefix(err.Error(), "State: "), "error names the frame type: %v", err)
		})
	}
}

func TestDecodeIgnoresUnknownFieldsFromNewerPeers(t *testing.T) {
	var h Hello

	err := Frame{Type: TypeHello, Body: []byte(`{"min_version":1,"max_version":2,"future":{"x":[1,2]}}`)}.Decode(&h)

	require.NoError(t, err)
	assert.Equal(t, Hello{MinVersion: 1, MaxVersion: 2}, h)
}

func TestReadMessageRefusesAFrameOfTheWrongType(t *testing.T) {
	data := AppendFrame(nil, TypeState, []byte(`{"state":"ready"}`))

	err := ReadMessage(bytes.NewReader(data), MaxControlFrame, TypeWelcome, &Welcome{})

	require.ErrorIs(t, err, ErrUnexpectedType)
	assert.EqualError(t, err, "unexpected frame type: got State, want Welcome")
}

func TestReadMessageTurnsAnErrorFrameIntoPeerError(t *testing.T) {
	var buf bytes.Buffer
	require.NoError(t, WriteMessage(&buf, TypeError, Error{Code: CodeBootstrap, Message: "bad argv"}))

	err := ReadMessage(&buf, MaxControlFrame, TypeWelcome, &Welcome{})

	var pe *PeerError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, Error{Code: CodeBootstrap, Message: "bad argv"}, pe.Err)
	assert.EqualError(t, err, "peer error bootstrap_invalid: bad argv")
}

func TestReadMessageDecodesAnErrorFrameWhenAskedForOne(t *testing.T) {
	var buf bytes.Buffer
	require.NoError(t, WriteMessage(&buf, TypeError, Error{Code: CodeInternal, Message: "boom"}))

	var e Error
	require.NoError(t, ReadMessage(&buf, MaxControlFrame, TypeError, &e))
	assert.Equal(t, Error{Code: CodeInternal, Message: "boom"}, e)
}

func TestReadMessageRefusesAMalformedErrorFrame(t *testing.T) {
	data := AppendFrame(nil, TypeError, []byte(`not json`))

	err := ReadMessage(bytes.NewReader(data), MaxControlFrame, TypeWelcome, &Welcome{})

	require.ErrorIs(t, err, ErrBadBody)
	var pe *PeerError
	assert.False(t, errors.As(err, &pe))
}

func TestReadMessagePassesFrameErrorsThrough(t *testing.T) {
	data := append(frameHeader(TypeWelcome, 0, MaxControlFrame+1), "{}"...)

	err := ReadMessage(bytes.NewReader(data), MaxControlFrame, TypeWelcome, &Welcome{})

	assert.ErrorIs(t, err, ErrFrameTooLarge)
}

func TestTypeStringNamesKnownTypesAndPrintsOthersInHex(t *testing.T) {
	assert.Equal(t, "Hello", TypeHello.String())
	assert.Equal(t, "StreamHeader", TypeStreamHeader.String())
	assert.Equal(t, "Type(0x0000)", Type(0).String())
	assert.Equal(t, "Type(0xbeef)", Type(0xbeef).String())
	assert.True(t, TypeError.Known())
	assert.False(t, (lastType() + 1).Known())
}

func TestWriteMessageEncodesBodiesAsJSONObjects(t *testing.T) {
	var buf bytes.Buffer
	require.NoError(t, WriteMessage(&buf, TypeShutdown, Shutdown{Reason: "stop", GraceMS: 1500}))

	f, err := ReadFrame(&buf, MaxControlFrame)
	require.NoError(t, err)
	assert.JSONEq(t, `{"reason":"stop","grace_ms":1500}`, string(f.Body))
	var got Shutdown
	require.NoError(t, json.Unmarshal(f.Body, &got))
	assert.Equal(t, Shutdown{Reason: "stop", GraceMS: 1500}, got)
}

// lastType is the highest frame type of version 1.
func lastType() Type {
	var last Type
	for t := range typeNames {
		last = max(last, t)
	}
	return last
}
