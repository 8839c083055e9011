package simulator

import (
	"context"
	"math"
	"math/rand"
	"slices"
	"testing"
)

// Every u^(k) is dual feasible: items that fit one bin together never sum
// over 1. Checked on every multiset of integer items that fits a bin of 12
// (and of 1000 on random ones).
func TestDFFIsDualFeasible(t *testing.T) {
	var walk func(c, left, min int64, items []int64)
	checked := 0
	walk = func(c, left, min int64, items []int64) {
		for k := 0; k <= BoundCuts+2; k++ {
			var s float64
			for _, x := range items {
				s += dff(k, x, c)
			}
			if s > 1+1e-12 {
				t.Fatalf("u^(%d) of %v in a bin of %d sums to %v", k, items, c, s)
			}
		}
		checked++
		for x := min; x <= left; x++ {
			walk(c, left-x, x, append(items, x))
		}
	}
	walk(12, 12, 1, nil)
	// Σ_{s ≤ 12} p(s): the multisets of positive integers summing to at most 12.
	if checked != 272 {
		t.Errorf("checked %d multisets in a bin of 12, want 272", checked)
	}
	rng := rand.New(rand.NewSource(1))
	for i := 0; i < 20000; i++ {
		left := int64(1000)
		var items []int64
		for left > 0 && rng.Intn(6) > 0 {
			x := 1 + rng.Int63n(left)
			items = append(items, x)
			left -= x
		}
		walk(1000, 0, 1, items)
	}
	// u^(1): a device holds at most one item over half of it.
	if got := dff(1, 600, 1000) + dff(1, 600, 1000); got != 2 {
		t.Errorf("u^(1) of two 600s = %v, want 2", got)
	}
}

func arrivalOf(nodes []NodeRow, pods []PodRow) *Arrival {
	return &Arrival{Nodes: nodes, Pods: pods}
}

// Hand-worked instances, where the bound is the optimum: the capacity
// alone would give more.
func TestBoundHandWorked(t *testing.T) {
	n := func(cpu int64, gpus int, model string) NodeRow {
		return NodeRow{Name: "n", CPUMilli: cpu, MemoryMiB: 1 << 20, GPUs: gpus, Model: model}
	}
	p := func(cpu int64, k, m int, models ...string) PodRow {
		return PodRow{Name: "p", CPUMilli: cpu, MemoryMiB: 1024, NumGPU: k, GPUMilli: m, Models: models}
	}
	for _, tc := range []struct {
		name  string
		nodes []NodeRow
		pods  []PodRow
		want  float64
	}{
		// Capacity allows 1000: a device holds only one share over 500.
		{"two 600s on one GPU", []NodeRow{n(8000, 1, "T4")}, []PodRow{p(1, 1, 600), p(1, 1, 600)}, 600},
		// Capacity allows 1000: three shares over 333 need two devices.
		{"three 400s on one GPU", []NodeRow{n(8000, 1, "T4")}, []PodRow{p(1, 1, 400), p(1, 1, 400), p(1, 1, 400)}, 800},
		// The model: only the T4 node may take the pods.
		{"model", []NodeRow{n(8000, 1, "T4"), n(8000, 2, "V100")}, []PodRow{p(1, 1, 1000, "T4"), p(1, 1, 1000, "T4")}, 1000},
		// CPU: each pod needs 5 of the node's 8 cores, one fits.
		{"cpu", []NodeRow{n(8000, 2, "T4")}, []PodRow{p(5000, 1, 1000), p(5000, 1, 1000)}, 1000},
		// A pod larger than every node fits nowhere, not even in part.
		{"too large", []NodeRow{n(8000, 2, "T4")}, []PodRow{p(9000, 1, 1000)}, 0},
		// A 2-GPU pod does not fit a 1-GPU node.
		{"gpus per node", []NodeRow{n(8000, 1, "T4"), n(8000, 1, "T4")}, []PodRow{p(1, 2, 1000)}, 0},
		// CPU-only pods count nothing, and take nothing in the bound.
		{"cpu-only", []NodeRow{n(8000, 1, "T4")}, []PodRow{p(8000, 0, 0), p(1, 1, 300)}, 300},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := Bound(arrivalOf(tc.nodes, tc.pods), "hand", 0, 1)
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(b.Milli-tc.want) > 1e-3 {
				t.Errorf("bound %v, want %v", b.Milli, tc.want)
			}
		})
	}
}

// The bound is never under the best placement, found by trying every one on
// small random instances.
func TestBoundAboveExhaustiveOptimum(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	tight := 0
	for trial := 0; trial < 300; trial++ {
		var nodes []NodeRow
		for i := 0; i < 1+rng.Intn(2); i++ {
			nodes = append(nodes, NodeRow{Name: "n", CPUMilli: int64(4000 + 4000*rng.Intn(2)), MemoryMiB: 8192,
				GPUs: []int{1, 2, 4}[rng.Intn(3)], Model: []string{"T4", "G2"}[rng.Intn(2)]})
		}
		var pods []PodRow
		for i := 0; i < 2+rng.Intn(4); i++ {
			p := PodRow{Name: "p", CPUMilli: int64(1000 * (1 + rng.Intn(5))), MemoryMiB: int64(1024 * (1 + rng.Intn(6)))}
			switch rng.Intn(4) {
			case 0:
				p.NumGPU, p.GPUMilli = 1+rng.Intn(3), 1000
			case 1, 2:
				p.NumGPU, p.GPUMilli = 1, []int{200, 300, 400, 500, 600, 750}[rng.Intn(6)]
			}
			if p.NumGPU > 0 && rng.Intn(4) == 0 {
				p.Models = []string{"T4"}
			}
			pods = append(pods, p)
		}
		best := exhaustive(nodes, pods)
		b, err := Bound(arrivalOf(nodes, pods), "random", int64(trial), 1)
		if err != nil {
			t.Fatal(err)
		}
		if b.Milli < float64(best)-1e-6 {
			t.Fatalf("trial %d: bound %v under the optimum %d\nnodes %+v\npods %+v", trial, b.Milli, best, nodes, pods)
		}
		if math.Abs(b.Milli-float64(best)) < 1e-3 {
			tight++
		}
		// The certificate is the LP's optimum, not a looser bound.
		if math.Abs(b.Milli-b.Primal) > 1e-3 {
			t.Errorf("trial %d: certified %v, simplex %v", trial, b.Milli, b.Primal)
		}
	}
	t.Logf("the bound is the optimum in %d of 300 instances", tight)
}

// exhaustive is the most GPU milli a placement of a subset of pods holds.
func exhaustive(nodes []NodeRow, pods []PodRow) int64 {
	type state struct {
		cpu, mem []int64
		dev      [][]int64
	}
	s := state{cpu: make([]int64, len(nodes)), mem: make([]int64, len(nodes)), dev: make([][]int64, len(nodes))}
	for i, n := range nodes {
		s.cpu[i], s.mem[i] = n.CPUMilli, n.MemoryMiB
		s.dev[i] = make([]int64, n.GPUs)
		for d := range s.dev[i] {
			s.dev[i][d] = 1000
		}
	}
	var best int64
	var place func(i int, got int64)
	place = func(i int, got int64) {
		if got > best {
			best = got
		}
		if i == len(pods) {
			return
		}
		place(i+1, got) // unplaced
		p := pods[i]
		for ni, n := range nodes {
			if p.CPUMilli > s.cpu[ni] || p.MemoryMiB > s.mem[ni] {
				continue
			}
			if p.NumGPU > 0 && len(p.Models) > 0 && !slices.Contains(p.Models, n.Model) {
				continue
			}
			s.cpu[ni] -= p.CPUMilli
			s.mem[ni] -= p.MemoryMiB
			// Every set of NumGPU devices with GPUMilli free each.
			var pick func(from, left int)
			pick = func(from, left int) {
				if left == 0 {
					place(i+1, got+p.GPURequest())
					return
				}
				for d := from; d < len(s.dev[ni]); d++ {
					if s.dev[ni][d] >= int64(p.GPUMilli) {
						s.dev[ni][d] -= int64(p.GPUMilli)
						pick(d+1, left-1)
						s.dev[ni][d] += int64(p.GPUMilli)
					}
				}
			}
			pick(0, p.NumGPU)
			s.cpu[ni] += p.CPUMilli
			s.mem[ni] += p.MemoryMiB
		}
	}
	place(0, 0)
	return best
}

// No replay allocates more than the bound of its arrival: the real
// framework and plugins, every policy, a generated trace.
func TestBoundAboveReplays(t *testing.T) {
	dir := smallTrace(t, 12, 120, 3)
	tr, err := Load(dir, "small")
	if err != nil {
		t.Fatal(err)
	}
	for _, seed := range []int64{42, 43} {
		a, err := NewArrival(tr, seed, 1.3)
		if err != nil {
			t.Fatal(err)
		}
		b, err := Bound(a, "small", seed, 1.3)
		if err != nil {
			t.Fatal(err)
		}
		if b.Milli > float64(b.Capacity)+1e-3 || b.Milli > float64(b.Requested)+1e-3 {
			t.Errorf("seed %d: bound %v over the capacity %d or the request %d", seed, b.Milli, b.Capacity, b.Requested)
		}
		for _, p := range []Policy{Learned, FGD, BestFit, Spread} {
			r, err := Run(context.Background(), Experiment{Trace: tr, Policy: p, Seed: seed, Tune: 1.3})
			if err != nil {
				t.Fatal(err)
			}
			if float64(r.FinalAllocated) > b.Milli+1e-6 {
				t.Errorf("seed %d: %s allocated %d, over the bound %v", seed, p, r.FinalAllocated, b.Milli)
			}
			t.Logf("seed %d %s: %d of bound %.0f (capacity %d)", seed, p, r.FinalAllocated, b.Milli, b.Capacity)
		}
	}
}

// The certificate is a bound whatever the solver answered: from the optimal
// vertex it is the optimum; from a wrong vertex or none, larger, never less.
//
//	maximise x0 + x1 subject to x0 ≤ 1, x1 ≤ 1, x0 + x1 ≤ 1.5 (optimum 1.5)
func TestCertifyAnyAnswer(t *testing.T) {
	g := [][]float64{{1, 0}, {0, 1}, {1, 1}}
	h := []float64{1, 1, 1.5}
	v := []float64{1, 1}
	rows := []int{0, 1}
	for _, tc := range []struct {
		name string
		x    []float64 // x0, x1, then the slacks
		want func(float64) bool
	}{
		{"optimal", []float64{1, 0.5, 0, 0.5, 0}, func(b float64) bool { return math.Abs(b-1.5) < 1e-9 }},
		{"none", []float64{0, 0, 1, 1, 1.5}, func(b float64) bool { return b >= 1.5-1e-9 }},
		{"a worse vertex", []float64{1, 0, 0, 1, 0.5}, func(b float64) bool { return b >= 1.5-1e-9 }},
	} {
		b, err := certify(g, h, v, rows, tc.x)
		if err != nil {
			t.Fatal(err)
		}
		if !tc.want(b) {
			t.Errorf("%s: certified %v", tc.name, b)
		}
	}
}
