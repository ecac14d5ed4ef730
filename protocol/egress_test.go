package protocol

import (
	"bytes"
	"encoding/json"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEgressCodesMatchTheContract(t *testing.T) {
	want := map[EgressCode]string{
		1: "InvalidArgument", 2: "UnsupportedNetwork", 3: "Denied", 4: "NameNotResolved",
		5: "NameResolutionFailed", 6: "ConnectionRefused", 7: "Unreachable", 8: "TimedOut",
		9: "ResourceExhausted", 10: "Cancelled", 11: "IO", 12: "Unknown",
	}
	for c, n := range want {
		assert.Equal(t, n, c.String())
		assert.True(t, c.Valid())
	}
	assert.False(t, EgressCode(13).Valid())
	assert.False(t, EgressCode(-1).Valid())
	assert.Equal(t, "EgressCode(13)", EgressCode(13).String())
}

func TestEgressHeaderValidation(t *testing.T) {
	ok := []StreamHeader{
		{Kind: KindEgress, Host: "example.com", Port: 443, Via: ViaConnect},
		{Kind: KindEgress, Host: "2001:db8::1", Port: 1},
		{Kind: KindEgress, Host: "bücher.example", Port: 65535, Via: ViaSOCKS5},
		{Kind: KindEgress, Host: "a.test", Port: 22, Via: ViaTransparent, SrcPort: 40312},
		{Kind: KindLog, Name: "daemon/stdout"},
	}
	for _, h := range ok {
		assert.NoError(t, h.Validate(), "%+v", h)
	}
	bad := []StreamHeader{
		{Kind: KindEgress, Host: "", Port: 443},
		{Kind: KindEgress, Host: "a", Port: 0},
		{Kind: KindEgress, Host: "a", Port: 65536},
		{Kind: KindEgress, Host: "a\x00b", Port: 80},
		{Kind: KindEgress, Host: "a b", Port: 80},
		{Kind: KindEgress, Host: "a/b", Port: 80},
		{Kind: KindEgress, Host: string(bytes.Repeat([]byte("a"), MaxEgressHost+1)), Port: 80},
		{Kind: KindEgress, Host: "\xff", Port: 80},
		{Kind: KindEgress, Host: "a", Port: 80, Via: "ftp"},
		{Kind: KindLog, Name: "x", Host: "a"},
		{Kind: KindControl, Port: 1},
		{Kind: KindEgress, Host: "a", Port: 80, SrcPort: 65536},
		{Kind: KindEgress, Host: "a", Port: 80, SrcPort: -1},
		{Kind: KindDNS, Host: "a", SrcPort: 1},
		{Kind: KindForward, Port: 80, SrcPort: 1},
	}
	for _, h := range bad {
		assert.ErrorIs(t, h.Validate(), ErrBadBody, "%+v", h)
	}
}

func TestEgressReplyRoundTripAndValidation(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go func() {
		_ = WriteEgressReply(a, EgressReply{Code: EgressDenied, Reason: "no rule allows x:25", Rule: ""})
	}()
	r, err := ReadEgressReply(b, time.Second)
	require.NoError(t, err)
	assert.Equal(t, EgressReply{Code: EgressDenied, Error: "Denied", Effect: EffectNone, Reason: "no rule allows x:25"}, r)
	assert.False(t, r.OK())

	assert.NoError(t, EgressReply{}.Validate())
	assert.Error(t, EgressReply{Code: 13, Effect: EffectNone}.Validate())
	assert.Error(t, EgressReply{Code: EgressIO, Effect: "maybe"}.Validate())
	assert.Error(t, EgressReply{Code: EgressIO, Effect: EffectNone, Reason: "a\nb"}.Validate())
}

func TestReadEgressReplyTimesOut(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	_, err := ReadEgressReply(b, 20*time.Millisecond)
	require.Error(t, err)
}

// FuzzStreamHeaderRoundTrip feeds arbitrary bytes to the stream header reader: it
// must never panic, never accept an oversized frame, and a header it
// accepts must survive a round trip unchanged.
func FuzzStreamHeaderRoundTrip(f *testing.F) {
	for _, h := range []StreamHeader{
		{Kind: KindEgress, Host: "example.com", Port: 443, Via: ViaConnect},
		{Kind: KindEgress, Host: "::ffff:127.0.0.1", Port: 80, Via: ViaHTTP},
		{Kind: KindLog, Name: "daemon/stdout"},
	} {
		body, _ := json.Marshal(h)
		f.Add(AppendFrame(nil, TypeStreamHeader, body))
	}
	f.Add(AppendFrame(nil, TypeStreamHeader, []byte(`{"kind":"egress","host":"a","port":1e9}`)))
	f.Fuzz(func(t *testing.T, data []byte) {
		var h StreamHeader
		err := ReadMessage(bytes.NewReader(data), MaxHeaderFrame, TypeStreamHeader, &h)
		if err != nil || h.Validate() != nil {
			return
		}
		body, err := json.Marshal(h)
		require.NoError(t, err)
		var h2 StreamHeader
		require.NoError(t, ReadMessage(bytes.NewReader(AppendFrame(nil, TypeStreamHeader, body)), MaxHeaderFrame, TypeStreamHeader, &h2))
		require.Equal(t, h, h2)
		require.NoError(t, h2.Validate())
	})
}

// FuzzEgressReply does the same for the host's answer frame.
func FuzzEgressReply(f *testing.F) {
	for _, r := range []EgressReply{
		{},
		{Code: EgressDenied, Error: "Denied", Effect: EffectNone, Reason: "port 25 is not allowed", Rule: ""},
		{Code: EgressTimedOut, Error: "TimedOut", Effect: EffectPossible, Reason: "connect timed out"},
	} {
		body, _ := json.Marshal(r)
		f.Add(AppendFrame(nil, TypeEgressReply, body))
	}
	f.Add(AppendFrame(nil, TypeError, []byte(`{"code":"internal","message":"x"}`)))
	f.Fuzz(func(t *testing.T, data []byte) {
		var r EgressReply
		err := ReadMessage(bytes.NewReader(data), MaxHeaderFrame, TypeEgressReply, &r)
		if err != nil || r.Validate() != nil {
			return
		}
		var buf bytes.Buffer
		require.NoError(t, WriteEgressReply(&buf, r))
		var r2 EgressReply
		require.NoError(t, ReadMessage(&buf, MaxHeaderFrame, TypeEgressReply, &r2))
		require.NoError(t, r2.Validate())
		require.Equal(t, r.Code, r2.Code)
	})
}
