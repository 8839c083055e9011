package simulator

import (
	"encoding/json"
	"math"
	"strconv"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
)

// Columns is the number of discretised arrival points: 0..130 %.
const Columns = 131

// Event is the cluster after one pod: the GPU request of every pod
// submitted so far (bound or failed) and of the pods bound, in milli.
type Event struct {
	Arrived, Allocated int64
}

// Curve is the allocation ratio (%) at each arrived-workload percent; NaN
// where no event is near.
type Curve [Columns]float64

// Discretize reproduces the published analysis (openb-benchmark.md §4;
// merge_alloc_discrete.py at the original's commit 8f3d641) in its own
// arithmetic: with G the GPUs, arrive% = round-half-even(A/G/10) and alloc% =
// round(U/G/10, 2), both Python's round (pandas' apply hands it Python
// floats); column k is the mean alloc% of the events with arrive% = k, or of
// those with k−1 ≤ arrive% ≤ k+1 when none has exactly k, summed as pandas
// sums (numpy's pairwise sum) and rounded as numpy rounds (npRound2). A mean
// on a rounding boundary (30.995) lands on the published side only when
// summed and rounded that way.
func Discretize(events []Event, capacity int64) Curve {
	gpus := float64(capacity) / gpu.MilliPerGPU
	var by [Columns + 2][]float64
	for _, e := range events {
		k := math.RoundToEven(float64(e.Arrived) / gpus / 10)
		if k < 0 || k > Columns {
			continue
		}
		by[int(k)] = append(by[int(k)], round2(float64(e.Allocated)/gpus/10))
	}
	var c Curve
	for k := 0; k < Columns; k++ {
		vals := by[k]
		if len(vals) == 0 {
			// pandas keeps the frame's order: by event, not by column.
			vals = nil
			for _, e := range events {
				a := math.RoundToEven(float64(e.Arrived) / gpus / 10)
				if a >= float64(k-1) && a <= float64(k+1) {
					vals = append(vals, round2(float64(e.Allocated)/gpus/10))
				}
			}
		}
		if len(vals) == 0 {
			c[k] = math.NaN()
			continue
		}
		c[k] = npRound2(pairwiseSum(vals) / float64(len(vals)))
	}
	return c
}

// pairwiseSum adds as numpy's pairwise_sum does (the sum pandas' mean
// takes): fewer than 8 values in order; up to 128 in eight interleaved
// partial sums; more in two halves split at a multiple of 8.
func pairwiseSum(a []float64) float64 {
	n := len(a)
	switch {
	case n < 8:
		var s float64
		for _, v := range a {
			s += v
		}
		return s
	case n <= 128:
		var r [8]float64
		copy(r[:], a[:8])
		i := 8
		for ; i < n-n%8; i += 8 {
			for j := range r {
				r[j] += a[i+j]
			}
		}
		s := ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
		for ; i < n; i++ {
			s += a[i]
		}
		return s
	default:
		h := n / 2
		h -= h % 8
		return pairwiseSum(a[:h]) + pairwiseSum(a[h:])
	}
}

// round2 rounds to 2 decimals as Python's round(x, 2) does: correctly,
// from the float's exact value, ties to even.
func round2(x float64) float64 {
	v, _ := strconv.ParseFloat(strconv.FormatFloat(x, 'f', 2, 64), 64)
	return v
}

// npRound2 rounds to 2 decimals as numpy's round does a numpy float (what
// pandas' mean returns): scaled by 100, rounded half to even, scaled back
// (2.675 gives 2.68, where round2 gives 2.67).
func npRound2(x float64) float64 {
	return math.RoundToEven(x*100) / 100
}

// Stats is a mean and sample standard deviation.
type Stats struct {
	Mean, SD float64
	N        int
}

// MeanSD summarises values, skipping NaN.
func MeanSD(values []float64) Stats {
	var s Stats
	var sum float64
	for _, v := range values {
		if !math.IsNaN(v) {
			sum += v
			s.N++
		}
	}
	if s.N == 0 {
		return Stats{Mean: math.NaN(), SD: math.NaN()}
	}
	s.Mean = sum / float64(s.N)
	if s.N > 1 {
		var ss float64
		for _, v := range values {
			if !math.IsNaN(v) {
				ss += (v - s.Mean) * (v - s.Mean)
			}
		}
		s.SD = math.Sqrt(ss / float64(s.N-1))
	}
	return s
}

// MarshalJSON writes NaN (no event near that column) as null.
func (c Curve) MarshalJSON() ([]byte, error) {
	b := []byte{'['}
	for i, v := range c {
		if i > 0 {
			b = append(b, ',')
		}
		if math.IsNaN(v) {
			b = append(b, "null"...)
		} else {
			b = strconv.AppendFloat(b, v, 'f', -1, 64)
		}
	}
	return append(b, ']'), nil
}

// UnmarshalJSON reads null back as NaN.
func (c *Curve) UnmarshalJSON(b []byte) error {
	var vals []*float64
	if err := json.Unmarshal(b, &vals); err != nil {
		return err
	}
	for i := range c {
		c[i] = math.NaN()
		if i < len(vals) && vals[i] != nil {
			c[i] = *vals[i]
		}
	}
	return nil
}
