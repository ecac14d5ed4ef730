package direct

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"golang.org/x/sys/unix"
)

// FuzzParseSockaddr: the workload's address bytes are untrusted; any of
// them parse without a panic, and an accepted one is IPv4 or IPv6 with
// its port where struct sockaddr keeps it.
func FuzzParseSockaddr(f *testing.F) {
	in4 := make([]byte, 16)
	binary.NativeEndian.PutUint16(in4, unix.AF_INET)
	binary.BigEndian.PutUint16(in4[2:], 443)
	copy(in4[4:], []byte{198, 18, 0, 5})
	f.Add(in4)
	in6 := make([]byte, 28)
	binary.NativeEndian.PutUint16(in6, unix.AF_INET6)
	binary.BigEndian.PutUint16(in6[2:], 80)
	in6[8+10], in6[8+11], in6[8+12] = 0xff, 0xff, 10
	f.Add(in6)
	f.Add([]byte{0, 0})
	f.Add([]byte{1, 0, '/', 't', 'm', 'p'})
	f.Fuzz(func(t *testing.T, b []byte) {
		ap, ok := ParseSockaddr(b)
		if !ok {
			return
		}
		assert.True(t, ap.Addr().Is4() || ap.Addr().Is6())
		assert.Equal(t, binary.BigEndian.Uint16(b[2:]), ap.Port())
		assert.False(t, ap.Addr().Is4In6(), "a mapped address is unmapped")
	})
}
