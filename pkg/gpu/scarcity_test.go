package gpu

import (
	"fmt"
	"math"
	"testing"
)

func modelNode(name, model string, gpus int32, cpu int64) *NodeState {
	s := NewNodeState(name, Inventory{Count: gpus, Model: model, ModelFold: model}, cpu)
	s.MemFree = 1 << 30
	for d := range gpus {
		s.Free[d] = MilliPerGPU
	}
	return s
}

func fleetOf(nodes ...*NodeState) *Fleet {
	var b FleetBuilder
	for _, n := range nodes {
		b.Add(n)
	}
	return b.Fleet(nil)
}

func only(models ...string) ModelSelector { return ModelSelector{Exact: models} }

// A fleet of 6 A GPUs and 2 B GPUs; half the target's GPU demand may run
// anywhere, half only on B. Spread over what each may use, A carries 500/8000
// per milli-GPU and B 500/8000 + 500/2000; relative to all the demand spread
// over all 8 GPUs (1000/8000): A 0.5, B 2.5.
func TestScarcity(t *testing.T) {
	f := fleetOf(modelNode("a1", "A", 4, 0), modelNode("a2", "A", 2, 0), modelNode("b", "B", 2, 0), modelNode("cpu", "", 0, 0))
	wl, err := NewWorkload([]Task{
		{CPU: 1000, Milli: 1000, Count: 1, Weight: 1},
		{CPU: 1000, Milli: 1000, Count: 1, Weight: 1, Models: only("B")},
		{CPU: 50000, Weight: 8}, // CPU-only tasks take no GPU
	})
	if err != nil {
		t.Fatal(err)
	}
	c := wl.Scarcity(f)
	if c == nil {
		t.Fatal("no scarcity with a task restricted to B")
	}
	for model, want := range map[string]float64{"A": 0.5, "B": 2.5} {
		if got, ok := c.Of(model); !ok || math.Abs(got-want) > 1e-9 {
			t.Errorf("load on %s: %v (%v), want %v", model, got, ok, want)
		}
	}
	if _, ok := c.Of("C"); ok {
		t.Error("a model the fleet does not have has a load")
	}
	for _, tc := range []struct {
		sel  ModelSelector
		want float64
	}{
		{ModelSelector{}, 0.5},
		{only("B"), 2.5},
		{only("A", "B"), 0.5},
		{ModelSelector{Include: []string{"B"}}, 2.5},
		{ModelSelector{Exclude: []string{"A"}}, 2.5},
		{only("C"), math.Inf(1)}, // no GPU here: nothing to price
	} {
		if got := c.Floor(&tc.sel); got != tc.want {
			t.Errorf("floor of %s: %v, want %v", tc.sel.String(), got, tc.want)
		}
	}
	if wl.Scarcity(f) != c {
		t.Error("the same fleet computed the loads again")
	}
	// A fleet with more B: B's restricted demand weighs less on each GPU.
	f2 := fleetOf(modelNode("a", "A", 6, 0), modelNode("b", "B", 6, 0))
	c2 := wl.Scarcity(f2)
	if b, _ := c2.Of("B"); c2 == c || math.Abs(b-(500.0/12000+500.0/6000)/(1000.0/12000)) > 1e-9 {
		t.Errorf("second fleet: load on B %v", b)
	}

	for name, tasks := range map[string][]Task{
		"no restriction":             {{Milli: 1000, Count: 1, Weight: 1}, {Milli: 500, Count: 1, Weight: 1}},
		"restricted to every model":  {{Milli: 1000, Count: 1, Weight: 1, Models: only("A", "B")}},
		"restricted to absent model": {{Milli: 1000, Count: 1, Weight: 1}, {Milli: 1000, Count: 1, Weight: 1, Models: only("C")}},
		"only CPU tasks restricted":  {{Milli: 1000, Count: 1, Weight: 1}, {CPU: 1000, Weight: 1, Models: only("B")}},
	} {
		w, err := NewWorkload(tasks)
		if err != nil {
			t.Fatal(err)
		}
		if c := w.Scarcity(f); c != nil {
			t.Errorf("%s: loads %v, want none (every model alike)", name, c.pi)
		}
	}
	if wl.Scarcity(nil) != nil || wl.Scarcity(fleetOf()) != nil {
		t.Error("an empty fleet prices a model")
	}
}

// The same content gives the same fleet, so that what is memoised against
// it stays valid; any change gives a new one.
func TestFleetBuilder(t *testing.T) {
	a, b := modelNode("a", "A", 4, 0), modelNode("b", "B", 2, 0)
	f := fleetOf(a, b)
	var same FleetBuilder
	same.Add(b)
	same.Add(a)
	same.Add(modelNode("cpu", "", 0, 0))
	if same.Fleet(f) != f {
		t.Error("the same GPUs per model in another order gave another fleet")
	}
	for name, nodes := range map[string][]*NodeState{
		"a GPU more":    {a, b, modelNode("b2", "B", 1, 0)},
		"another model": {a, modelNode("c", "C", 2, 0)},
		"a node gone":   {a},
	} {
		var bl FleetBuilder
		for _, n := range nodes {
			bl.Add(n)
		}
		if bl.Fleet(f) == f {
			t.Errorf("%s: the old fleet kept", name)
		}
	}
}

// With the term, a pod that may run anywhere goes to the model that the
// restricted demand needs least, whichever comes first in the node order.
// F alone ties the two nodes: as many tasks can run only on A as only on B,
// but B has a third of A's GPUs. Without the term (weight 0, or without the
// pod's view) the node order decides. A pod that may run only on B pays
// nothing there. A share's device is the one fragmentation chooses either way.
func TestScarceScoring(t *testing.T) {
	wl, _ := NewWorkload([]Task{
		{CPU: 1000, Milli: 1000, Count: 1, Weight: 2},
		{CPU: 1000, Milli: 1000, Count: 1, Weight: 1, Models: only("A")},
		{CPU: 1000, Milli: 1000, Count: 1, Weight: 1, Models: only("B")},
	})
	view := func(r Request) Scoring { return DefaultScoring.ForPod(wl.Scarcity(f6a2b), &r) }
	for _, names := range [][2]string{{"node-a", "node-b"}, {"node-b", "node-a"}} {
		a, b := modelNode(names[0], "A", 2, 64000), modelNode(names[1], "B", 2, 64000)
		order := a.Prio > b.Prio // A first by the node order
		for name, tc := range map[string]struct {
			pod   Request
			sc    func(Request) Scoring
			wantA bool
		}{
			"any model":        {Request{Count: 1, CPU: 1000}, view, true},
			"any model, share": {Request{Milli: 300, CPU: 1000}, view, true},
			"A or B":           {Request{Count: 2, CPU: 1000, Models: only("A", "B")}, view, true},
			"weight 0": {Request{Count: 1, CPU: 1000}, func(r Request) Scoring {
				sc := DefaultScoring
				sc.Scarce = 0
				return sc.ForPod(wl.Scarcity(f6a2b), &r)
			}, order},
			"no view of the fleet": {Request{Count: 1, CPU: 1000}, func(Request) Scoring { return DefaultScoring }, order},
		} {
			sc := tc.sc(tc.pod)
			ca, ra, ok1 := sc.Evaluate(a, &tc.pod, wl)
			cb, rb, ok2 := sc.Evaluate(b, &tc.pod, wl)
			if !ok1 || !ok2 {
				t.Fatalf("%s: does not fit", name)
			}
			if got := ra > rb; got != tc.wantA {
				t.Errorf("%s, %v: A scores %d, B %d: want A first %v", name, names, ra, rb, tc.wantA)
			}
			off := sc
			off.scarcity = nil
			oa, _, _ := off.Evaluate(a, &tc.pod, wl)
			ob, _, _ := off.Evaluate(b, &tc.pod, wl)
			if oa != ca || ob != cb {
				t.Errorf("%s: the term changed the device: %v/%v against %v/%v", name, ca, cb, oa, ob)
			}
		}
		pod := Request{Count: 1, CPU: 1000, Models: only("B")}
		sc := view(pod)
		_, with, _ := sc.Evaluate(b, &pod, wl)
		_, without, _ := DefaultScoring.Evaluate(b, &pod, wl)
		if with != without || sc.scarceCost(b, MilliPerGPU) != 0 {
			t.Errorf("only B: scores %d with the term, %d without", with, without)
		}
	}
}

// f6a2b: 6 A GPUs, 2 B GPUs.
var f6a2b = fleetOf(modelNode("a", "A", 2, 0), modelNode("a2", "A", 4, 0), modelNode("b", "B", 2, 0))

// The term is one value for the node: a share's device is still the one
// fragmentation chooses, here the 600 device of a node whose devices differ
// (the 1000 one would leave a whole GPU that B-only tasks need broken).
func TestScarceKeepsTheDevice(t *testing.T) {
	wl, _ := NewWorkload([]Task{
		{CPU: 1000, Milli: 500, Count: 1, Weight: 2},
		{CPU: 1000, Milli: 1000, Count: 1, Weight: 1, Models: only("B")},
	})
	b := modelNode("b", "B", 3, 64000)
	b.Free[0], b.Free[1], b.Free[2] = 1000, 600, 1000
	pod := Request{Milli: 500, CPU: 1000}
	for _, weight := range []float64{1, 10, 1000} {
		sc := DefaultScoring
		sc.Scarce = weight
		sc = sc.ForPod(wl.Scarcity(fleetOf(modelNode("a", "A", 8, 0), b)), &pod)
		off := sc
		off.scarcity = nil
		c1, s1, _ := sc.Evaluate(b, &pod, wl)
		c0, s0, _ := off.Evaluate(b, &pod, wl)
		if c0 != c1 || c0.Mask != 0b10 {
			t.Errorf("weight %v: device %b with the term, %b without: want 10 both times", weight, c1.Mask, c0.Mask)
		}
		if s1 >= s0 {
			t.Errorf("weight %v: B is scarce for a pod that may run on A: score %d with the term, %d without", weight, s1, s0)
		}
	}
}

// Under exact resolution a huge term must not wrap the score around: the
// most loaded model ranks last, not first.
func TestScarceExactNoOverflow(t *testing.T) {
	nodes := []*NodeState{modelNode("r", "R", 8, 64000)}
	for i := range 999 {
		nodes = append(nodes, modelNode(fmt.Sprint("a", i), "A", 8, 64000))
	}
	wl, _ := NewWorkload([]Task{
		{CPU: 1000, Milli: 1000, Count: 8, Weight: 1},
		{CPU: 1000, Milli: 1000, Count: 8, Weight: 1, Models: only("R")},
	})
	f := fleetOf(nodes...)
	for _, n := range []int32{1, 2, 4, 8} {
		pod := Request{Count: n, CPU: 1000}
		for _, weight := range []float64{0.01, 0.1, 0.5, 1, 2, 5, 10} {
			sc := DefaultScoring
			sc.Exact, sc.Scarce = true, weight
			sc = sc.ForPod(wl.Scarcity(f), &pod)
			_, r, _ := sc.Evaluate(nodes[0], &pod, wl)
			_, a, _ := sc.Evaluate(nodes[1], &pod, wl)
			if r >= a {
				t.Errorf("%d GPUs, weight %v: the scarce model scores %d, the common one %d", n, weight, r, a)
			}
		}
	}
}

// Selectors by substring (HAMi's use-gputype) count like exact ones.
func TestScarcityIncludeSelector(t *testing.T) {
	f := fleetOf(modelNode("a", "NVIDIA-A100", 6, 0), modelNode("b", "NVIDIA-T4", 2, 0))
	f.models[0].fold, f.models[1].fold = "NVIDIA-A100", "NVIDIA-T4"
	wl, _ := NewWorkload([]Task{
		{Milli: 1000, Count: 1, Weight: 1},
		{Milli: 1000, Count: 1, Weight: 1, Models: ModelSelector{Include: []string{"T4"}}},
	})
	c := wl.Scarcity(f)
	if c == nil {
		t.Fatal("no scarcity")
	}
	a, _ := c.Of("NVIDIA-A100")
	b, _ := c.Of("NVIDIA-T4")
	if math.Abs(a-0.5) > 1e-9 || math.Abs(b-2.5) > 1e-9 {
		t.Errorf("loads %v and %v, want 0.5 and 2.5", a, b)
	}
}
