package protocol

import (
	"bytes"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDNSStreamHeaderValidation(t *testing.T) {
	ok := StreamHeader{Kind: KindDNS, Host: "api.example.com"}
	assert.NoError(t, ok.Validate())
	for _, h := range []StreamHeader{
		{Kind: KindDNS},
		{Kind: KindDNS, Host: strings.Repeat("a", MaxDNSName+1)},
		{Kind: KindDNS, Host: "a b"},
		{Kind: KindDNS, Host: "a\x00b"},
		{Kind: KindDNS, Host: "a/b"},
		{Kind: KindDNS, Host: "a.test", Port: 53},
		{Kind: KindDNS, Host: "a.test", Via: ViaDNS},
	} {
		assert.ErrorIs(t, h.Validate(), ErrBadBody, "%+v", h)
	}
	assert.NoError(t, StreamHeader{Kind: KindEgress, Host: "a.test", Port: 443, Via: ViaTransparent}.Validate())
}

func TestDNSReplyRoundTripAndValidation(t *testing.T) {
	var buf bytes.Buffer
	require.NoError(t, WriteDNSReply(&buf, DNSReply{Code: EgressDenied, Reason: "no rule allows x on any port"}))
	a, b := net.Pipe()
	go func() { _, _ = a.Write(buf.Bytes()); a.Close() }()
	r, err := ReadDNSReply(b, 5*time.Second)
	require.NoError(t, err)
	assert.Equal(t, DNSReply{Code: EgressDenied, Error: "Denied", Effect: EffectNone, Reason: "no rule allows x on any port"}, r)
	assert.Error(t, DNSReply{Code: 13}.Validate())
	assert.Error(t, DNSReply{Code: EgressDenied, Effect: "maybe"}.Validate())
	assert.Equal(t, "DNSReply", TypeDNSReply.String())
}
