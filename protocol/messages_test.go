package protocol

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStreamHeaderValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		header StreamHeader
		errMsg string // empty: valid
	}{
		{"control", StreamHeader{Kind: KindControl}, ""},
		{"log with a name", StreamHeader{Kind: KindLog, Name: "daemon/stdout"}, ""},
		{"egress", StreamHeader{Kind: KindEgress, Host: "10.0.0.1", Port: 443, Via: ViaConnect}, ""},
		{"forward", StreamHeader{Kind: KindForward, Port: 8080}, ""},
		{"forward with a name", StreamHeader{Kind: KindForward, Name: "daemon", Port: 4096}, ""},
		{"forward without a port", StreamHeader{Kind: KindForward}, "forward port must be 1..65535"},
		{"forward port over 65535", StreamHeader{Kind: KindForward, Port: 65536}, "forward port must be 1..65535"},
		{"forward negative port", StreamHeader{Kind: KindForward, Port: -1}, "forward port must be 1..65535"},
		{"forward naming a host", StreamHeader{Kind: KindForward, Host: "10.0.0.1", Port: 22}, "never a host"},
		{"forward with via", StreamHeader{Kind: KindForward, Via: ViaConnect, Port: 22}, "never a host"},
		{"log with a port", StreamHeader{Kind: KindLog, Port: 22}, "egress and forward streams only"},
		{"name of exactly the limit", StreamHeader{Kind: KindLog, Name: strings.Repeat("n", MaxStreamName)}, ""},
		{"non-ASCII name", StreamHeader{Kind: KindLog, Name: "démon/stdout"}, ""},
		{"empty kind", StreamHeader{}, "unknown stream kind"},
		{"unknown kind", StreamHeader{Kind: "shell"}, "unknown stream kind"},
		{"kind in another case", StreamHeader{Kind: "Control"}, "unknown stream kind"},
		{"kind with padding", StreamHeader{Kind: " log"}, "unknown stream kind"},
		{"name one byte over the limit", StreamHeader{Kind: KindLog, Name: strings.Repeat("n", MaxStreamName+1)}, "longer than 128 bytes"},
		{"multi-byte name over the limit in bytes", StreamHeader{Kind: KindLog, Name: strings.Repeat("é", 65)}, "longer than 128 bytes"},
		{"newline in name", StreamHeader{Kind: KindLog, Name: "daemon\nstdout"}, "control characters"},
		{"carriage return in name", StreamHeader{Kind: KindLog, Name: "daemon\r"}, "control characters"},
		{"NUL in name", StreamHeader{Kind: KindLog, Name: "daemon\x00"}, "control characters"},
		{"tab in name", StreamHeader{Kind: KindLog, Name: "a\tb"}, "control characters"},
		{"escape in name", StreamHeader{Kind: KindLog, Name: "\x1b[31mred"}, "control characters"},
		{"DEL in name", StreamHeader{Kind: KindLog, Name: "a\x7f"}, "control characters"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.header.Validate()
			if tc.errMsg == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrBadBody)
			assert.Contains(t, err.Error(), tc.errMsg)
		})
	}
}

func TestStreamHeaderValidateQuotesOnlyAShortPrefixOfAnUnknownKind(t *testing.T) {
	kind := strings.Repeat("k", 32) + "SECRET-TAIL" + strings.Repeat("z", 4000)

	err := StreamHeader{Kind: kind}.Validate()

	require.ErrorIs(t, err, ErrBadBody)
	assert.NotContains(t, err.Error(), "SECRET-TAIL")
	assert.Less(t, len(err.Error()), 120)
}

func TestStreamHeaderValidateEscapesAnUnknownKindInTheError(t *testing.T) {
	err := StreamHeader{Kind: "a\nb\x1b"}.Validate()

	require.Error(t, err)
	assert.NotContains(t, err.Error(), "\n")
	assert.NotContains(t, err.Error(), "\x1b")
}

// The JSON field names are the wire format: the table in the package doc is
// the reference, and a renamed Go field must not change them.
func TestMessagesUseTheDocumentedJSONFieldNames(t *testing.T) {
	exit := 3
	for _, tc := range []struct {
		msg  any
		want string
	}{
		{
			Hello{MinVersion: 1, MaxVersion: 2, AgentVersion: "a", PID: 1, Capabilities: []string{"c"}},
			`{"min_version":1,"max_version":2,"agent_version":"a","pid":1,"capabilities":["c"]}`,
		},
		{
			Welcome{Version: 1, HostVersion: "h", Capabilities: []string{"c"}, TimeUnixNano: 5},
			`{"version":1,"host_version":"h","capabilities":["c"],"time_unix_nano":5}`,
		},
		{
			State{State: StateFailed, Message: "m", Process: &ProcessStatus{Name: "daemon", PID: 7, Running: false, ExitCode: &exit, Signal: "KILL"}},
			`{"state":"failed","message":"m","process":{"name":"daemon","pid":7,"running":false,"exit_code":3,"signal":"KILL"}}`,
		},
		{Shutdown{Reason: "r", GraceMS: 6000}, `{"reason":"r","grace_ms":6000}`},
		{
			Error{Code: CodeVersionMismatch, Message: "m", MinVersion: 1, MaxVersion: 1},
			`{"code":"version_mismatch","message":"m","min_version":1,"max_version":1}`,
		},
		{StreamHeader{Kind: KindLog, Name: "daemon/stdout"}, `{"kind":"log","name":"daemon/stdout"}`},
		{StreamHeader{Kind: KindControl}, `{"kind":"control"}`},
	} {
		got, err := json.Marshal(tc.msg)
		require.NoError(t, err)
		assert.JSONEq(t, tc.want, string(got), "%T", tc.msg)
	}
}

func TestPeerErrorNamesTheCodeAndMessage(t *testing.T) {
	err := &PeerError{Err: Error{Code: CodeProtocol, Message: "bad frame"}}

	assert.EqualError(t, err, "peer error protocol_error: bad frame")
}

func TestTimeMessageRoundTrips(t *testing.T) {
	var buf strings.Builder
	require.NoError(t, WriteMessage(&buf, TypeTime, Time{TimeUnixNano: 1_700_000_000_123_456_789}))
	var got Time
	require.NoError(t, ReadMessage(strings.NewReader(buf.String()), MaxControlFrame, TypeTime, &got))
	assert.Equal(t, int64(1_700_000_000_123_456_789), got.TimeUnixNano)
	assert.Equal(t, "Time", TypeTime.String())
	assert.True(t, TypeTime.Known())
}
