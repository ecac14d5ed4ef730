package bench

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestInterleaveRotatesWhichGoesFirstAndKeepsEachOnesSamples(t *testing.T) {
	var order []string
	f := func(name string, v float64) func() (float64, error) {
		return func() (float64, error) { order = append(order, name); return v, nil }
	}
	xs, err := Interleave(3, f("a", 1), f("b", 2), f("c", 3))
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b", "c", "b", "c", "a", "c", "a", "b"}, order)
	assert.Equal(t, [][]float64{{1, 1, 1}, {2, 2, 2}, {3, 3, 3}}, xs)
}

func TestPairAlternatesBaselineAndSubject(t *testing.T) {
	var order []string
	n := 0.0
	f := func(name string) func() (float64, error) {
		return func() (float64, error) { order = append(order, name); n++; return n, nil }
	}
	b, s, err := Pair(2, f("base"), f("subj"))
	require.NoError(t, err)
	assert.Equal(t, []string{"base", "subj", "subj", "base"}, order)
	assert.Equal(t, []float64{1, 4}, b)
	assert.Equal(t, []float64{2, 3}, s)
}

func TestInterleaveStopsAtTheFirstError(t *testing.T) {
	calls := 0
	boom := errors.New("boom")
	_, err := Interleave(5, func() (float64, error) { calls++; return 0, boom }, func() (float64, error) { calls++; return 1, nil })
	assert.ErrorIs(t, err, boom)
	assert.Equal(t, 1, calls)
}
