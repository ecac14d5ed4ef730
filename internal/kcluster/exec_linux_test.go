//go:build linux

package kcluster

import (
	"bufio"
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMaskBytesMasksEveryByteAsTheRepeatedKeyDoes(t *testing.T) {
	mask := [4]byte{0x12, 0x34, 0x56, 0x78}
	for _, n := range []int{0, 1, 3, 7, 8, 9, 15, 16, 17, 1000} {
		p := make([]byte, n)
		for i := range p {
			p[i] = byte(i * 7)
		}
		want := make([]byte, n)
		for i := range p {
			want[i] = p[i] ^ mask[i%4]
		}
		maskBytes(p, mask)
		assert.Equal(t, want, p, "%d bytes", n)
	}
}

func TestAFrameWrittenIsReadBackWhole(t *testing.T) {
	for _, n := range []int{0, 125, 126, 65535, 65536, 300 << 10} {
		payload := bytes.Repeat([]byte{'x', 'y', 'z'}, n/3+1)[:n]
		var b bytes.Buffer
		require.NoError(t, writeFrame(&b, 0x2, payload))
		fin, op, got, err := readFrame(bufio.NewReader(&b))
		require.NoError(t, err)
		assert.True(t, fin)
		assert.Equal(t, byte(0x2), op)
		assert.Equal(t, payload, got, "%d bytes", n)
	}
}
