package simulator

import (
	"encoding/json"
	"math"
	"strconv"
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

// Discretize reproduces the published analysis (openb-benchmark.md §4):
// arrive% = round-half-even(100·A/C), alloc% = round(100·U/C, 2); column k is
// the mean alloc% of the events with arrive% = k, rounded to 2 decimals, or
// of those with k−1 ≤ arrive% ≤ k+1 when none has exactly k.
func Discretize(events []Event, capacity int64) Curve {
	var sum [Columns + 2]float64
	var n [Columns + 2]int
	for _, e := range events {
		k := math.RoundToEven(100 * float64(e.Arrived) / float64(capacity))
		if k < 0 || k > Columns {
			continue
		}
		sum[int(k)] += round2(100 * float64(e.Allocated) / float64(capacity))
		n[int(k)]++
	}
	var c Curve
	for k := 0; k < Columns; k++ {
		if n[k] > 0 {
			c[k] = round2(sum[k] / float64(n[k]))
			continue
		}
		var s float64
		var m int
		for j := max(k-1, 0); j <= k+1; j++ {
			s += sum[j]
			m += n[j]
		}
		if m > 0 {
			c[k] = round2(s / float64(m))
		} else {
			c[k] = math.NaN()
		}
	}
	return c
}

// round2 rounds to 2 decimals as Python's round(x, 2) does: correctly,
// from the float's exact value, ties to even.
func round2(x float64) float64 {
	v, _ := strconv.ParseFloat(strconv.FormatFloat(x, 'f', 2, 64), 64)
	return v
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
