package simulator

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/gonum/mat"
	"gonum.org/v1/gonum/optimize/convex/lp"
)

// BoundResult is an upper bound on the milli-GPU that any placement of an
// arrival's pods can hold at once, with hindsight: no policy, online or not,
// allocates more at any point of the arrival (pods only arrive, so the set
// placed at any event is a subset of these pods placed feasibly).
type BoundResult struct {
	Workload string
	Seed     int64
	Tune     float64
	// Milli is the bound, Capacity the cluster's GPU milli, Requested what
	// the arrival's pods ask for in all.
	Milli              float64
	Capacity           int64
	Requested          int64
	NodeTypes, Classes int
	Vars, Rows         int
	// Relaxed is the relative raise of the right-hand sides that let the
	// simplex finish (0: none).
	Relaxed float64
	Wall    time.Duration
}

// Percent is the bound as the replay's metric: allocated milli over the
// cluster's GPU capacity, in %.
func (b *BoundResult) Percent() float64 { return 100 * b.Milli / float64(b.Capacity) }

// BoundCuts is how many of Fekete and Schepers' dual feasible functions
// u^(k), k = 1..BoundCuts, bound each dimension besides its capacity.
const BoundCuts = 4

// Bound computes an LP relaxation of the placement problem (docs/benchmarks.md,
// "The ceiling"):
//
//	maximise Σ v_p x_pt  (v_p: the GPU milli of a pod of class p; x_pt: how
//	                     many of them go to nodes of type t, fractional)
//	Σ_t x_pt ≤ n_p       (the arrival has n_p pods of class p)
//	Σ_p w(p) x_pt ≤ W_t  for every node type t and valid inequality w ≤ W
//
// Nodes of one type (CPU, memory, GPUs, model) are interchangeable, and a
// class is the pods with the same CPU, memory, GPUs, milli and models. x_pt
// exists only where one such pod fits an empty node of type t (its models
// allow t's). Each inequality holds on every node or device alone, so it
// holds for their sum: capacity (CPU, memory, GPU milli per node), and for
// k = 1..BoundCuts the dual feasible function u^(k) of each dimension, with
// a device's items the pod's k shares of m milli (a device holds at most one
// share over 500, two over 333, ...). Any real placement, summed per class
// and type, satisfies them all, so the LP's optimum bounds it. CPU-only pods
// add nothing to the objective and are left out (leaving them unplaced is
// feasible).
func Bound(a *Arrival, workload string, seed int64, tune float64) (*BoundResult, error) {
	start := time.Now()
	type nodeType struct {
		cpu, mem int64
		gpus     int
		model    string
		n        int
	}
	var types []*nodeType
	var capacity int64
	for _, r := range a.Nodes {
		capacity += int64(r.GPUs) * 1000
		if r.GPUs == 0 {
			continue
		}
		i := slices.IndexFunc(types, func(t *nodeType) bool {
			return t.cpu == r.CPUMilli && t.mem == r.MemoryMiB && t.gpus == r.GPUs && t.model == r.Model
		})
		if i < 0 {
			types = append(types, &nodeType{cpu: r.CPUMilli, mem: r.MemoryMiB, gpus: r.GPUs, model: r.Model})
			i = len(types) - 1
		}
		types[i].n++
	}
	type class struct {
		cpu, mem int64
		gpus     int
		milli    int64
		models   []string
		n        int
	}
	var classes []*class
	index := map[string]int{}
	var requested int64
	for i := range a.Pods {
		p := &a.Pods[i]
		requested += p.GPURequest()
		if p.NumGPU <= 0 || p.GPUMilli <= 0 {
			continue
		}
		key := fmt.Sprintf("%d/%d/%d/%d/%s", p.CPUMilli, p.MemoryMiB, p.NumGPU, p.GPUMilli, strings.Join(p.Models, "|"))
		j, ok := index[key]
		if !ok {
			j = len(classes)
			index[key] = j
			classes = append(classes, &class{cpu: p.CPUMilli, mem: p.MemoryMiB, gpus: p.NumGPU, milli: int64(p.GPUMilli), models: p.Models})
		}
		classes[j].n++
	}
	res := &BoundResult{Workload: workload, Seed: seed, Tune: tune, Capacity: capacity, Requested: requested,
		NodeTypes: len(types), Classes: len(classes)}

	// Variables.
	type variable struct{ p, t int }
	var vars []variable
	for p, c := range classes {
		for t, nt := range types {
			if c.cpu > nt.cpu || c.mem > nt.mem || c.gpus > nt.gpus || c.milli > 1000 ||
				(len(c.models) > 0 && !slices.Contains(c.models, nt.model)) {
				continue
			}
			vars = append(vars, variable{p, t})
		}
	}
	if len(vars) == 0 {
		res.Wall = time.Since(start)
		return res, nil
	}

	// Rows: coefficients by variable, and the right-hand side.
	type row struct {
		coef []float64
		rhs  float64
	}
	var rows []row
	seen := map[string]bool{}
	add := func(coef []float64, rhs float64) {
		nonzero := false
		for _, v := range coef {
			if v != 0 {
				nonzero = true
				break
			}
		}
		if !nonzero {
			return
		}
		key := fmt.Sprint(coef, rhs)
		if seen[key] {
			return
		}
		seen[key] = true
		rows = append(rows, row{coef, rhs})
	}
	for p, c := range classes {
		coef := make([]float64, len(vars))
		for j, v := range vars {
			if v.p == p {
				coef[j] = 1
			}
		}
		add(coef, float64(c.n))
	}
	for t, nt := range types {
		// A dimension: the capacity of one bin, how many bins the type
		// has, and a pod's items in it (count items of size s).
		dims := []struct {
			capacity int64
			bins     int
			count    func(c *class) int64
			size     func(c *class) int64
		}{
			{1000, nt.n * nt.gpus, func(c *class) int64 { return int64(c.gpus) }, func(c *class) int64 { return c.milli }},
			{int64(nt.gpus) * 1000, nt.n, func(*class) int64 { return 1 }, func(c *class) int64 { return int64(c.gpus) * c.milli }},
			{nt.cpu, nt.n, func(*class) int64 { return 1 }, func(c *class) int64 { return c.cpu }},
			{nt.mem, nt.n, func(*class) int64 { return 1 }, func(c *class) int64 { return c.mem }},
		}
		for _, d := range dims {
			if d.capacity <= 0 {
				continue
			}
			for k := 0; k <= BoundCuts; k++ {
				coef := make([]float64, len(vars))
				for j, v := range vars {
					if v.t != t {
						continue
					}
					c := classes[v.p]
					coef[j] = float64(d.count(c)) * dff(k, d.size(c), d.capacity)
				}
				add(coef, float64(d.bins))
			}
		}
	}

	// Standard form: minimise −v·x, [G I][x s] = h, x, s ≥ 0; the slacks
	// are a feasible basis (every h ≥ 0).
	m, n := len(rows), len(vars)
	A := mat.NewDense(m, n+m, nil)
	b := make([]float64, m)
	basic := make([]int, m)
	for i, r := range rows {
		for j, v := range r.coef {
			if v != 0 {
				A.Set(i, j, v)
			}
		}
		A.Set(i, n+i, 1)
		b[i] = r.rhs
		basic[i] = n + i
	}
	cost := make([]float64, n+m)
	for j, v := range vars {
		c := classes[v.p]
		cost[j] = -float64(int64(c.gpus)*c.milli) / 1000
	}
	// gonum's simplex can stall on a singular basis where the problem is
	// degenerate: then the right-hand sides are raised a little, unevenly
	// (a larger h only loosens the bound, so it stays an upper bound).
	var opt float64
	var err error
	for try, eps := 0, 0.0; ; try, eps = try+1, max(1e-9, eps*100) {
		bb := b
		if eps > 0 {
			bb = make([]float64, m)
			for i := range b {
				bb[i] = b[i] * (1 + eps*float64(1+(i*7919)%97)/97)
			}
		}
		opt, _, err = lp.Simplex(cost, A, bb, 1e-10, basic)
		if err == nil || try == 4 {
			res.Relaxed = eps
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("bound of %s seed %d: %w", workload, seed, err)
	}
	res.Milli = -opt * 1000
	res.Vars, res.Rows = n, m
	res.Wall = time.Since(start)
	return res, nil
}

// dff is Fekete and Schepers' dual feasible function u^(k) of an item of
// size x in a bin of capacity c, as a share of the bin: x/c if (k+1)x/c is
// an integer, else ⌊(k+1)x/c⌋/k. Items whose u^(k) sum over 1 do not fit one
// bin together; k = 0 is the capacity itself (x/c).
func dff(k int, x, c int64) float64 {
	if x <= 0 {
		return 0
	}
	if k == 0 || (int64(k+1)*x)%c == 0 {
		return float64(x) / float64(c)
	}
	return float64((int64(k+1)*x)/c) / float64(k)
}
