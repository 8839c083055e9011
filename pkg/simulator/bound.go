package simulator

import (
	"fmt"
	"math"
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
	// Primal is the simplex's optimum; Milli is the certified bound
	// (certify), equal to it up to rounding when the simplex was right.
	Primal float64
	// Relaxed is the largest relative raise of the right-hand sides in
	// the LP the simplex solved (the certificate uses the original ones).
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
	add := func(coef []float64, rhs float64) int {
		nonzero := false
		for _, v := range coef {
			if v != 0 {
				nonzero = true
				break
			}
		}
		if !nonzero {
			return -1
		}
		key := fmt.Sprint(coef, rhs)
		if seen[key] {
			return -1
		}
		seen[key] = true
		rows = append(rows, row{coef, rhs})
		return len(rows) - 1
	}
	// classRow[p] is the row that counts class p's pods (every variable of
	// a class has coefficient 1 there): the certificate's repair uses it.
	classRow := make([]int, len(classes))
	for p, c := range classes {
		coef := make([]float64, len(vars))
		for j, v := range vars {
			if v.p == p {
				coef[j] = 1
			}
		}
		classRow[p] = add(coef, float64(c.n))
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
	// The right-hand sides are raised by a tiny relative amount, unevenly:
	// a degenerate vertex (basic variables at 0, common here) then becomes
	// one whose basic variables are all positive, so that certify finds the
	// basis from the solution alone; gonum's simplex also stalls on some
	// degenerate problems (a singular basis), and a larger raise is tried
	// then. The certificate uses the original sides.
	var opt float64
	var x []float64
	var err error
	for try, eps := 0, 1e-7; try < 4; try, eps = try+1, eps*100 {
		bb := make([]float64, m)
		for i := range b {
			bb[i] = b[i] * (1 + eps*float64(1+(i*7919)%97)/97)
		}
		opt, x, err = lp.Simplex(cost, A, bb, 1e-10, basic)
		res.Relaxed = eps
		if err == nil {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("bound of %s seed %d: %w", workload, seed, err)
	}
	res.Primal = -opt * 1000
	value := make([]float64, n)
	for j := range vars {
		value[j] = -cost[j]
	}
	rowCoef := make([][]float64, m)
	rhs := make([]float64, m)
	for i, r := range rows {
		rowCoef[i], rhs[i] = r.coef, r.rhs
	}
	varRow := make([]int, n)
	for j, v := range vars {
		varRow[j] = classRow[v.p]
	}
	dual, err := certify(rowCoef, rhs, value, varRow, x)
	if err != nil {
		return nil, fmt.Errorf("bound of %s seed %d: %w", workload, seed, err)
	}
	res.Milli = dual * 1000
	res.Vars, res.Rows = n, m
	res.Wall = time.Since(start)
	return res, nil
}

// certify turns the simplex's answer into a bound that does not rest on it:
// by weak duality, hᵀu bounds the maximum of vᵀx over Gx ≤ h, x ≥ 0 for
// every u ≥ 0 with Gᵀu ≥ v. u is read off the primal solution x (its positive
// columns, completed with slacks into a basis B, u = B⁻ᵀ c_B), clipped at 0,
// and then made feasible outright: a variable's shortfall is added to its
// class row's u, where its coefficient is 1. At an optimal basis nothing is
// added and hᵀu is the LP optimum; anything the solver got wrong only makes
// hᵀu larger, never an invalid bound.
func certify(g [][]float64, h, v []float64, varRow []int, x []float64) (float64, error) {
	m, n := len(h), len(v)
	// The basis: x's positive columns, in order, and the slacks of the rows
	// that Gaussian elimination on those columns leaves without a pivot.
	var cols []int
	for j := 0; j < n+m; j++ {
		if x[j] != 0 {
			cols = append(cols, j)
		}
	}
	col := func(j, i int) float64 {
		if j >= n {
			if j-n == i {
				return 1
			}
			return 0
		}
		return g[i][j]
	}
	work := make([][]float64, len(cols))
	for k, j := range cols {
		work[k] = make([]float64, m)
		for i := 0; i < m; i++ {
			work[k][i] = col(j, i)
		}
	}
	used := make([]bool, m)
	var basis []int
	for k := range work {
		p, best := -1, 1e-9
		for i := 0; i < m; i++ {
			if !used[i] && math.Abs(work[k][i]) > best {
				p, best = i, math.Abs(work[k][i])
			}
		}
		if p < 0 {
			continue // dependent on the columns before it
		}
		used[p] = true
		basis = append(basis, cols[k])
		for k2 := k + 1; k2 < len(work); k2++ {
			f := work[k2][p] / work[k][p]
			if f == 0 {
				continue
			}
			for i := 0; i < m; i++ {
				work[k2][i] -= f * work[k][i]
			}
		}
	}
	for i := 0; i < m; i++ {
		if !used[i] {
			basis = append(basis, n+i)
		}
	}
	bt := mat.NewDense(m, m, nil)
	cb := make([]float64, m)
	for r, j := range basis {
		for i := 0; i < m; i++ {
			bt.Set(r, i, col(j, i))
		}
		if j < n {
			cb[r] = v[j]
		}
	}
	var u mat.VecDense
	if err := u.SolveVec(bt, mat.NewVecDense(m, cb)); err != nil {
		// No dual from this basis: the trivial one (every pod placed).
		u = *mat.NewVecDense(m, nil)
	}
	y := make([]float64, m)
	for i := range y {
		y[i] = max(0, u.AtVec(i))
	}
	for j := 0; j < n; j++ {
		var s float64
		for i := 0; i < m; i++ {
			if g[i][j] != 0 {
				s += g[i][j] * y[i]
			}
		}
		if short := v[j] - s; short > 0 {
			if varRow[j] < 0 {
				return 0, fmt.Errorf("variable %d has no class row", j)
			}
			y[varRow[j]] += short
		}
	}
	var bound float64
	for i := range h {
		bound += h[i] * y[i]
	}
	return bound, nil
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
