package client

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
)

// helperSession is docs/hosted.md's example session (schema version 3),
// as oac-guest helper wrote it.
const helperSession = `{"time":"2026-12-02T00:33:50.671519772Z","sandbox":"smoke","event":"state","schema_version":3,"mode":"helper","state":"starting","message":"creating sandbox","attempt":1}
{"time":"2026-12-02T00:33:50.673195651Z","sandbox":"smoke","event":"agent","schema_version":3,"mode":"helper","message":"guest agent connected","pid":9,"protocol":1,"agent_version":"dev","attempt":1}
{"time":"2026-12-02T00:33:50.673254973Z","sandbox":"smoke","event":"egress_policy","schema_version":3,"mode":"helper","message":"egress policy in force: deny by default; 1 rules, 0 upstreams","rules":["api.example.com:443","link link.example.com:443"],"attempt":1}
{"time":"2026-12-02T00:33:50.709548525Z","sandbox":"smoke","event":"process","schema_version":3,"mode":"helper","message":"started","process":"oac-sandbox-io","pid":18,"running":true,"attempt":1}
{"time":"2026-12-02T00:33:50.743348812Z","sandbox":"smoke","event":"log","schema_version":3,"mode":"helper","stream":"daemon/stdout","line":"listening","attempt":1}
{"time":"2026-12-02T00:33:50.849146169Z","sandbox":"smoke","event":"state","schema_version":3,"mode":"helper","state":"ready","message":"guest ready in 177ms: daemon healthy after 2 attempt(s) in 105ms","url":"http://127.0.0.1:4096","username":"runtime","attempt":1}
{"time":"2026-12-02T00:33:53.358498438Z","sandbox":"smoke","event":"process","schema_version":3,"mode":"helper","message":"exited","process":"daemon","pid":24,"running":false,"exit_code":0,"attempt":1}
{"time":"2026-12-02T00:33:53.359837716Z","sandbox":"smoke","event":"state","schema_version":3,"mode":"helper","state":"stopped","message":"stopped: stdin closed","attempt":1}
`

const helperFailed = `{"time":"2026-12-02T00:33:50.671519772Z","sandbox":"smoke","event":"state","schema_version":3,"mode":"helper","state":"failed","message":"bootstrap: sandbox_io.link_url must be wss","code":"public_url_unreachable","attempt":1}
`

func TestHelperOutputGivesTheReadyEventThenEveryEventToTheStop(t *testing.T) {
	// A stream that delivers a byte at a time, as an exec stream may.
	h := NewHelperOutput(iotest.OneByteReader(strings.NewReader(helperSession)))
	var seen []string
	ready, err := h.WaitReady(func(e api.Event) { seen = append(seen, e.Event) })
	require.NoError(t, err)
	assert.Equal(t, "http://127.0.0.1:4096", ready.URL)
	assert.Equal(t, "runtime", ready.Username)
	assert.Equal(t, []string{"state", "agent", "egress_policy", "process", "log", "state"}, seen)
	e, err := h.Next()
	require.NoError(t, err)
	assert.Equal(t, "exited", e.Message)
	e, err = h.Next()
	require.NoError(t, err)
	assert.Equal(t, api.StateStopped, e.State)
	_, err = h.Next()
	assert.ErrorIs(t, err, io.EOF)
}

// helperSession7 is helperSession as schema version 7 writes it: seq on
// every line.
func helperSession7() string {
	var b strings.Builder
	for i, l := range strings.Split(strings.TrimSuffix(helperSession, "\n"), "\n") {
		l = strings.Replace(l, `"schema_version":3`, fmt.Sprintf(`"schema_version":7,"seq":%d`, i+1), 1)
		b.WriteString(l + "\n")
	}
	return b.String()
}

func TestHelperOutputOfSchema7FollowsTheSeqAndSaysWhenALineWasLost(t *testing.T) {
	h := NewHelperOutput(strings.NewReader(helperSession7()))
	n := 0
	for {
		e, err := h.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		n++
		assert.Equal(t, uint64(n), e.Seq)
	}
	assert.Equal(t, 8, n)

	lines := strings.Split(helperSession7(), "\n")
	lost := strings.Join(append(lines[:2:2], lines[3:]...), "\n")
	_, err := NewHelperOutput(strings.NewReader(lost)).WaitReady(nil)
	assert.EqualError(t, err, "client: oac-guest helper output, line 3: seq 4 after 2: a line was lost or the stream is not one helper's from its start")
	_, err = NewHelperOutput(strings.NewReader(strings.Join(lines[1:], "\n"))).WaitReady(nil)
	assert.EqualError(t, err, "client: oac-guest helper output, line 1: seq 2 after 0: a line was lost or the stream is not one helper's from its start")
}

func TestAFailedHelperIsAFailedErrorWithItsCode(t *testing.T) {
	_, err := NewHelperOutput(strings.NewReader(helperFailed)).WaitReady(nil)
	var fe *FailedError
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, api.CodePublicURLUnreachable, fe.Code)
	assert.False(t, Retryable(err))
}

func TestHelperOutputThatBreaksTheContractIsRefusedByLineAndRule(t *testing.T) {
	first, ready := strings.SplitN(helperSession, "\n", 2)[0], strings.Split(helperSession, "\n")[5]
	with := func(old, new string) string { return strings.Replace(first, old, new, 1) }
	cases := []struct{ name, out, want string }{
		{"not JSON", "Welcome to the sandbox!\n", "line 1: not one JSON event object"},
		{"a shell's prompt", "$ " + first + "\n", "line 1: not one JSON event object"},
		{"two objects", first + first + "\n", "line 1: not one JSON event object"},
		{"an unknown key", with(`"attempt":1`, `"attempt":1,"password":"x"`) + "\n", "line 1: not an event of this client's schema: unknown key\n"},
		{"a key twice", with(`"attempt":1`, `"attempt":1,"attempt":1`) + "\n", `line 1: not an event of this client's schema: a key appears more than once in one object (key "attempt")`},
		{"a key in another case", with(`"attempt":1`, `"Attempt":1`) + "\n", `line 1: not an event of this client's schema: a key differs from a known one only in letter case (key "Attempt")`},
		{"a wrong type", with(`"attempt":1`, `"attempt":"1"`) + "\n", "line 1: not an event of this client's schema: a value has the wrong type or range"},
		{"not the helper", with(`"mode":"helper",`, "") + "\n", `line 1: not an event of oac-guest helper ("mode" is not "helper"): is the platform running the helper?`},
		{"a newer schema", with(`"schema_version":3`, `"schema_version":999`) + "\n", "line 1: schema version 999 is newer than this client's"},
		{"no schema version", with(`"schema_version":3,`, "") + "\n", "line 1: no schema_version"},
		{"an unknown kind", with(`"event":"state"`, `"event":"paused"`) + "\n", "line 1: event kind is not one oac-guest helper writes"},
		{"an answer", with(`"event":"state"`, `"event":"answer"`) + "\n", `line 1: event kind "answer" is not one oac-guest helper writes`},
		{"no time", with(`"time":"2026-12-02T00:33:50.671519772Z",`, "") + "\n", "line 1: no time"},
		{"another sandbox", first + "\n" + strings.Replace(ready, `"smoke"`, `"other"`, 1) + "\n", "line 2: another sandbox's event"},
		{"attempt 2", with(`"attempt":1`, `"attempt":2`) + "\n", "line 1: attempt 2: the helper has only attempt 1"},
		{"an unknown state", with(`"starting"`, `"paused"`) + "\n", "line 1: a state that is not one oac-guest helper writes (starting, ready, failed, stopped)"},
		{"warm", with(`"starting"`, `"warm"`) + "\n", "line 1: a state that is not one oac-guest helper writes (starting, ready, failed, stopped)"},
		{"a state on a log", with(`"event":"state"`, `"event":"log"`) + "\n", "line 1: a state on a log event"},
		{"failed without a code", strings.Replace(helperFailed, `"code":"public_url_unreachable",`, "", 1), "line 1: a failed state without a published failure code"},
		{"not UTF-8", with(`creating`, "creat\xffing") + "\n", "line 1: not UTF-8"},
		{"a huge line", first[:len(first)-1] + `,"line":"` + strings.Repeat("x", MaxHelperLine) + "\"}\n", "line 1: longer than 65536 bytes"},
		{"cut in a line", first, "line 1: the output ended inside a line: the stream was cut"},
		{"cut before the end", first + "\n", "line 1: the output ended before the last state (stopped or failed): the helper was killed or the stream cut"},
		{"after the end", helperSession + first + "\n", "line 9: output after the last state (stopped or failed)"},
		{"empty", "", "line 0: the output ended before the last state"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := NewHelperOutput(strings.NewReader(c.out))
			var err error
			for err == nil {
				_, err = h.Next()
			}
			var he *HelperError
			require.ErrorAs(t, err, &he, "%v", err)
			assert.Contains(t, err.Error()+"\n", "client: oac-guest helper output, "+c.want)
			_, again := h.Next()
			assert.Equal(t, err, again, "the first error stays")
		})
	}
	_, err := NewHelperOutput(strings.NewReader(first + "\n")).WaitReady(nil)
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF, "a cut stream says so")
	_, err = NewHelperOutput(strings.NewReader(first + "\n" + strings.Split(helperSession, "\n")[7] + "\n")).WaitReady(nil)
	assert.EqualError(t, err, "client: oac-guest helper output, line 2: stopped before ready: stopped: stdin closed")
	_, err = NewHelperOutput(iotest.ErrReader(errors.New("stream reset"))).Next()
	assert.EqualError(t, err, "client: read oac-guest helper's output: stream reset")
}
