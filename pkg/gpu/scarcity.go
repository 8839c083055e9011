package gpu

import (
	"math"
	"sort"
	"sync/atomic"
)

// Fleet is a cluster's GPU capacity per model, in milli-GPU. It is
// immutable; build it with a FleetBuilder.
type Fleet struct {
	models []fleetModel // sorted by model
	total  int64
}

type fleetModel struct {
	model, fold string
	milli       int64
}

// FleetBuilder sums nodes' GPUs per model.
type FleetBuilder struct{ milli map[[2]string]int64 }

// Add counts a node's schedulable devices.
func (b *FleetBuilder) Add(s *NodeState) {
	if s.Count <= 0 {
		return
	}
	if b.milli == nil {
		b.milli = map[[2]string]int64{}
	}
	b.milli[[2]string{s.Model, s.ModelFold}] += int64(s.Count) * MilliPerGPU
}

// Fleet returns what was added; prev when it holds the same, so that what
// is cached against prev stays valid.
func (b *FleetBuilder) Fleet(prev *Fleet) *Fleet {
	f := &Fleet{models: make([]fleetModel, 0, len(b.milli))}
	for k, v := range b.milli {
		f.models = append(f.models, fleetModel{model: k[0], fold: k[1], milli: v})
		f.total += v
	}
	sort.Slice(f.models, func(i, j int) bool { return f.models[i].model < f.models[j].model })
	if prev != nil && prev.total == f.total && len(prev.models) == len(f.models) {
		same := true
		for i := range f.models {
			if f.models[i] != prev.models[i] {
				same = false
				break
			}
		}
		if same {
			return prev
		}
	}
	return f
}

// Scarcity prices a GPU model by the target's demand that only a few models
// can serve. Each GPU task spreads its GPU over the capacity of the models
// it allows; a model's load π is what the tasks put on each of its GPUs,
// relative to the load were every task free to go anywhere. A pod taking a
// GPU of a model more loaded than the least loaded one it allows takes it
// from tasks that have fewer places to go (F and the stranded-GPU term
// price a GPU of every model alike). Immutable.
type Scarcity struct {
	fleet *Fleet
	pi    map[string]float64 // by model
}

type scarcitySlot struct{ p atomic.Pointer[Scarcity] }

// Scarcity is the workload's load per model of the fleet, nil when every
// model is loaded alike (no task restricts its model, or none that
// matters here): then nothing is priced. Memoised per fleet.
func (w *Workload) Scarcity(f *Fleet) *Scarcity {
	if f == nil || f.total == 0 || !w.restricted {
		return nil
	}
	if c := w.scarce.p.Load(); c != nil && c.fleet == f {
		if c.pi == nil {
			return nil
		}
		return c
	}
	c := w.scarcity(f)
	w.scarce.p.Store(c)
	if c.pi == nil {
		return nil
	}
	return c
}

func (w *Workload) scarcity(f *Fleet) *Scarcity {
	c := &Scarcity{fleet: f}
	pi := make([]float64, len(f.models))
	var all, unrestricted float64 // load with the tasks' own models, and free of them
	restricted := false
	for i := range w.tasks {
		t := &w.tasks[i]
		if t.Milli == 0 {
			continue
		}
		g := t.Weight * float64(t.Milli) * float64(t.Count)
		var capacity int64
		if t.Models.Empty() {
			capacity = f.total
		} else {
			for _, m := range f.models {
				if t.Models.Matches(m.model, m.fold) {
					capacity += m.milli
				}
			}
			restricted = restricted || capacity < f.total
		}
		if capacity == 0 {
			continue // no GPU here can run it
		}
		unrestricted += g
		all += g / float64(capacity)
		for j, m := range f.models {
			if t.Models.Empty() || t.Models.Matches(m.model, m.fold) {
				pi[j] += g / float64(capacity)
			}
		}
	}
	if !restricted || all == 0 {
		return c
	}
	norm := unrestricted / float64(f.total)
	lo, hi := math.Inf(1), math.Inf(-1)
	c.pi = make(map[string]float64, len(f.models))
	for j, m := range f.models {
		v := pi[j] / norm
		c.pi[m.model] = v
		lo, hi = min(lo, v), max(hi, v)
	}
	if hi-lo < 1e-9 {
		c.pi = nil
	}
	return c
}

// RestrictsModels reports whether a GPU task restricts its model: without
// one, Scarcity is nil whatever the fleet.
func (w *Workload) RestrictsModels() bool { return w.restricted }

// Of is the load on a model's GPUs; ok is false for a model the fleet does
// not have.
func (c *Scarcity) Of(model string) (float64, bool) {
	v, ok := c.pi[model]
	return v, ok
}

// Floor is the least load among the fleet's models the selector allows: what
// a pod with it pays nothing for.
func (c *Scarcity) Floor(sel *ModelSelector) float64 {
	lo := math.Inf(1)
	for _, m := range c.fleet.models {
		if sel.Empty() || sel.Matches(m.model, m.fold) {
			lo = min(lo, c.pi[m.model])
		}
	}
	return lo
}
