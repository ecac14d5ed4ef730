package directguard

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"testing"

	"github.com/mdlayher/netlink"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// diagMsg encodes an inet_diag_msg as the kernel answers it, naming the
// socket storage of maps mapIDs.
func diagMsg(t testing.TB, e diagEntry, mapIDs ...uint32) []byte {
	b := make([]byte, sizeofDiagMsg)
	b[0], b[1] = e.Family, e.State
	e.ID.put(b[4:])
	if len(mapIDs) == 0 {
		return b
	}
	ae := netlink.NewAttributeEncoder()
	ae.Nested(inetDiagSkBPFStorages, func(stores *netlink.AttributeEncoder) error {
		for _, id := range mapIDs {
			stores.Nested(unix.SK_DIAG_BPF_STORAGE, func(st *netlink.AttributeEncoder) error {
				st.Uint32(unix.SK_DIAG_BPF_STORAGE_MAP_ID, id)
				st.Bytes(unix.SK_DIAG_BPF_STORAGE_MAP_VALUE, make([]byte, 20))
				return nil
			})
		}
		return nil
	})
	attrs, err := ae.Encode()
	require.NoError(t, err)
	return append(b, attrs...)
}

var exampleEntry = diagEntry{Family: unix.AF_INET, State: tcpEstablished, ID: sockID{
	SrcPort: 33639, DstPort: 35841,
	Src: [16]byte{127, 0, 0, 1}, Dst: [16]byte{127, 0, 0, 1},
	Cookie: 407080,
}}

// The attributes of a real answer (Linux 6.18): INET_DIAG_SKMEMINFO's
// neighbours, INET_DIAG_CGROUP_ID, INET_DIAG_SOCKOPT, and the storage of
// map 651.
const realAttrs = "050008000000000008000f00000000000c001500010000000000000006001600520000002800148024000180080002008b02000018000300040000007f000001000000000000000000000000"

func TestADiagAnswerNamesItsSocketAndTheSeal(t *testing.T) {
	attrs, err := hex.DecodeString(realAttrs)
	require.NoError(t, err)
	real := append(diagMsg(t, exampleEntry), attrs...)
	e, err := parseDiagMsg(real, 651)
	require.NoError(t, err)
	want := exampleEntry
	want.Sealed = true
	assert.Equal(t, want, e)

	e, err = parseDiagMsg(real, 652)
	require.NoError(t, err)
	assert.False(t, e.Sealed, "another map's storage is not the seal")

	e, err = parseDiagMsg(diagMsg(t, exampleEntry, 7, 9), 9)
	require.NoError(t, err)
	assert.True(t, e.Sealed)

	_, err = parseDiagMsg(real[:sizeofDiagMsg-1], 651)
	assert.ErrorContains(t, err, "short")
	bad := append([]byte(nil), real...)
	bad[0] = unix.AF_UNIX
	_, err = parseDiagMsg(bad, 651)
	assert.ErrorContains(t, err, "family")
	_, err = parseDiagMsg(append(diagMsg(t, exampleEntry), 0xff, 0, 1, 0), 651)
	assert.Error(t, err, "an attribute longer than the answer")
}

// FuzzParseDiagMsg: the kernel's sock_diag answers are parsed with bounds
// checks; no bytes panic the parser, and an answer it accepts is an inet
// socket named as the bytes name it, sealed only where the map's ID is in
// them.
func FuzzParseDiagMsg(f *testing.F) {
	attrs, err := hex.DecodeString(realAttrs)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(append(diagMsg(f, exampleEntry), attrs...), uint32(651))
	f.Add(diagMsg(f, exampleEntry), uint32(651))
	f.Add(diagMsg(f, exampleEntry, 1, 2, 3), uint32(2))
	f.Add(diagMsg(f, exampleEntry)[:40], uint32(0))
	f.Fuzz(func(t *testing.T, b []byte, mapID uint32) {
		e, err := parseDiagMsg(b, mapID)
		if err != nil {
			return
		}
		require.GreaterOrEqual(t, len(b), sizeofDiagMsg)
		assert.Contains(t, []uint8{unix.AF_INET, unix.AF_INET6}, e.Family)
		id := make([]byte, sizeofSockID)
		e.ID.put(id)
		assert.Equal(t, b[4:4+sizeofSockID], id)
		if e.Sealed {
			var want [4]byte
			binary.NativeEndian.PutUint32(want[:], mapID)
			assert.True(t, bytes.Contains(b[sizeofDiagMsg:], want[:]))
		}
	})
}
