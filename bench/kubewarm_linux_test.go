package bench

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestClaimToReadyIsTheBootAfterCreate(t *testing.T) {
	var l lineCatch
	l.want = []byte("boot phases")
	// The line arrives in pieces, among others.
	for _, part := range []string{"time=x level=DEBUG msg=\"other\"\ntime=x level=DEBUG msg=\"boot ph", "ases\" sandbox=b phases=\"create 40.5ms, start runtime 120ms, guest connects 80.25ms, ",
		"handshake 2.5ms, bootstrap to ready 150µs\"\nlater line with boot phases\n"} {
		_, err := fmt.Fprint(&l, part)
		require.NoError(t, err)
	}
	assert.Contains(t, l.String(), "create 40.5ms")
	d, err := claimToReady(l.String())
	require.NoError(t, err)
	assert.Equal(t, 120*time.Millisecond+80250*time.Microsecond+2500*time.Microsecond+150*time.Microsecond, d)

	_, err = claimToReady("")
	assert.ErrorContains(t, err, "were not in its stderr")
}
