package bench

import (
	"fmt"
	"math"
	"sort"
	"time"
)

// Stat summarises repeated measurements of one quantity.
type Stat struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	N      int     `json:"n"`
}

// Summarise computes a Stat; it panics on no samples (a bug in the caller).
func Summarise(xs []float64) Stat {
	if len(xs) == 0 {
		panic("bench: no samples")
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return Stat{Median: med, Min: s[0], Max: s[len(s)-1], N: len(s)}
}

// Percentile returns the p-th percentile (0..100) of xs by nearest rank.
func Percentile(xs []float64, p float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

// Pair runs baseline and subject alternately n times each and returns
// their samples. Each function returns one measurement.
func Pair(n int, baseline, subject func() (float64, error)) (b, s []float64, err error) {
	xs, err := Interleave(n, baseline, subject)
	if err != nil {
		return nil, nil, err
	}
	return xs[0], xs[1], nil
}

// Interleave runs each of fs once per round, n rounds, and returns each
// one's samples (out[i] is fs[i]'s). Round r starts with fs[r mod
// len(fs)] and goes on in order, so each one goes first, second, ... as
// often as any other: load on the machine hits all alike.
func Interleave(n int, fs ...func() (float64, error)) ([][]float64, error) {
	out := make([][]float64, len(fs))
	for r := range n {
		for j := range fs {
			i := (r + j) % len(fs)
			x, err := fs[i]()
			if err != nil {
				return nil, err
			}
			out[i] = append(out[i], x)
		}
	}
	return out, nil
}

// ms converts a duration to milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func fmtNum(x float64) string {
	switch {
	case x == 0:
		return "0"
	case math.Abs(x) >= 100:
		return fmt.Sprintf("%.0f", x)
	case math.Abs(x) >= 10:
		return fmt.Sprintf("%.1f", x)
	default:
		return fmt.Sprintf("%.2f", x)
	}
}
