package gpu

import (
	"fmt"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// sharePod is a bound shared-GPU pod; assignment may be "".
func sharePod(name string, milli int, assignment string) *v1.Pod {
	ann := map[string]string{AnnotationMilli: fmt.Sprint(milli)}
	if assignment != "" {
		ann[AnnotationAssignment] = assignment
	}
	return gpuPod(name, types.UID("uid-"+name), 0, ann)
}

func wholePod(name string, gpus int64, assignment string) *v1.Pod {
	var ann map[string]string
	if assignment != "" {
		ann = map[string]string{AnnotationAssignment: assignment}
	}
	return gpuPod(name, types.UID("uid-"+name), gpus, ann)
}

func permutations(n int) [][]int {
	if n == 0 {
		return [][]int{{}}
	}
	var out [][]int
	for _, p := range permutations(n - 1) {
		for i := 0; i <= len(p); i++ {
			q := append(append(append([]int{}, p[:i]...), n-1), p[i:]...)
			out = append(out, q)
		}
	}
	return out
}

// Pods without an assignment (bound by another scheduler) are laid down the
// same way whatever order the node's pods come in: same free devices, same
// verdict. Greedy placement in pod order overcommitted the node for some
// orders (400, 500 on one device, then 600 and 500 fit nowhere).
func TestAccountingOrderIndependent(t *testing.T) {
	cases := map[string][]*v1.Pod{
		"shares on two devices": {sharePod("a", 600, ""), sharePod("b", 500, ""), sharePod("c", 400, ""), sharePod("d", 500, "")},
		"shares and whole GPUs": {sharePod("a", 300, ""), wholePod("w", 1, ""), sharePod("b", 700, ""), sharePod("c", 200, ""), sharePod("d", 800, "")},
		"with assigned pods":    {sharePod("x", 500, "n1:0=500"), sharePod("a", 500, ""), sharePod("b", 300, ""), sharePod("c", 700, "")},
	}
	for name, pods := range cases {
		t.Run(name, func(t *testing.T) {
			n := node("n1", int64(len(pods)+1)/2, int64(len(pods)+1)/2, nil)
			if name == "shares on two devices" {
				n = node("n1", 2, 2, nil)
			}
			var first *NodeState
			for _, perm := range permutations(len(pods)) {
				ordered := make([]*v1.Pod, len(pods))
				for i, j := range perm {
					ordered[i] = pods[j]
				}
				st := NewTracker(DefaultNodeOptions).Compute(n, ordered, 0, 0, "", false)
				if first == nil {
					first = st
					continue
				}
				if st.Free != first.Free || st.Overcommitted != first.Overcommitted {
					t.Fatalf("order %v: free %v overcommitted %v; first order: free %v overcommitted %v",
						perm, st.Free[:st.Count], st.Overcommitted, first.Free[:first.Count], first.Overcommitted)
				}
			}
			if name == "shares on two devices" && (first.Overcommitted || first.Idle() != 0) {
				t.Errorf("600+400 and 500+500 fill two devices exactly: free %v, overcommitted %v", first.Free[:2], first.Overcommitted)
			}
		})
	}
}

// The default scheduler cannot see shares (they request no resource), so it
// binds a 4-GPU pod onto a 4-GPU node that holds our shares. The node is then
// overcommitted: it must take no more GPU pods of ours, and say why.
func TestAccountingCoexistence(t *testing.T) {
	n := node("n1", 4, 4, nil)
	pods := []*v1.Pod{
		sharePod("s0", 300, "n1:0=300"), sharePod("s1", 300, "n1:1=300"),
		sharePod("s2", 300, "n1:2=300"), sharePod("s3", 300, "n1:3=300"),
	}
	tr := NewTracker(DefaultNodeOptions)
	share := Request{Milli: 500}
	if out, _, _ := tr.Compute(n, pods, 0, 0, "", false).Fit(&share); out != Fits {
		t.Fatalf("before: want fits, got %v", out)
	}
	pods = append(pods, wholePod("other", 4, ""))
	st := tr.Compute(n, pods, 0, 0, "", false)
	if !st.Overcommitted {
		t.Fatalf("a 4-GPU pod over four shared devices must overcommit the node: free %v", st.Free[:4])
	}
	for _, r := range []Request{{Milli: 100}, {Count: 1}, {MemoryMiB: 1}} {
		if out, _, _ := st.Fit(&r); out != Overcommitted && out != MemoryUnknown {
			t.Errorf("%+v on an overcommitted node: want Overcommitted, got %v", r, out)
		}
	}
	if out, _, _ := st.Fit(&Request{CPU: 1000}); out != Fits {
		t.Errorf("CPU-only pods still fit: got %v", out)
	}
	if Overcommitted.Unresolvable() {
		t.Errorf("evicting pods can resolve an overcommit")
	}
	hs, _ := tr.Explain(n, pods)
	var bad []string
	for _, h := range hs {
		if !h.Fits {
			bad = append(bad, h.Name)
		}
	}
	if strings.Join(bad, ",") != "other" {
		t.Errorf("explain: want the 4-GPU pod as the one that does not fit, got %v (%+v)", bad, hs)
	}
	// Once it is gone, the node takes shares again.
	if st := tr.Compute(n, pods[:4], 0, 0, "", false); st.Overcommitted {
		t.Errorf("still overcommitted after the pod left")
	}
}

// An annotation is a record of our decision, not a source of capacity: what
// counts is the pod's request. A forged assignment on a CPU pod blocks
// nothing; a share that rewrites its own assignment neither frees nor
// inflates what it holds.
func TestAccountingForgedAssignments(t *testing.T) {
	n := node("n1", 2, 2, nil)
	cases := map[string]struct {
		pod      *v1.Pod
		wantIdle int64
		wantOver bool
	}{
		"cpu pod claiming a device":     {wholePod("cpu", 0, "n1:0=1000"), 2000, false},
		"cpu pod claiming both":         {wholePod("cpu", 0, "n1:0=1000,1=1000"), 2000, false},
		"share rewritten to 1 milli":    {sharePod("s", 500, "n1:0=1"), 1500, false},
		"share rewritten to whole":      {sharePod("s", 500, "n1:0=1000"), 1500, false},
		"share on two devices":          {sharePod("s", 500, "n1:0=500,1=500"), 1500, false},
		"share assignment removed":      {sharePod("s", 500, ""), 1500, false},
		"share on a device not present": {sharePod("s", 500, "n1:7=500"), 1500, false},
		"share for another node":        {sharePod("s", 500, "n2:0=500"), 1500, false},
		"whole GPU claiming half":       {wholePod("w", 1, "n1:0=500"), 1000, false},
		"two GPUs claiming one":         {wholePod("w", 2, "n1:0=1000"), 0, false},
		"corrupt annotation":            {wholePod("w", 1, "n1:zero"), 1000, false},
		"honest share":                  {sharePod("s", 500, "n1:1=500"), 1500, false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			st := NewTracker(DefaultNodeOptions).Compute(n, []*v1.Pod{tc.pod}, 0, 0, "", false)
			if st.Idle() != tc.wantIdle || st.Overcommitted != tc.wantOver {
				t.Errorf("idle %d overcommitted %v (free %v), want idle %d overcommitted %v",
					st.Idle(), st.Overcommitted, st.Free[:2], tc.wantIdle, tc.wantOver)
			}
		})
	}
	// An honest assignment says which device: the next share goes beside it.
	st := NewTracker(DefaultNodeOptions).Compute(n, []*v1.Pod{sharePod("s", 500, "n1:1=500")}, 0, 0, "", false)
	if st.Free[0] != 1000 || st.Free[1] != 500 {
		t.Errorf("an agreeing assignment must be taken as written: %v", st.Free[:2])
	}
	// A memory share agrees only at the milli it converts to on this node.
	mem := gpuPod("m", "m", 0, map[string]string{AnnotationMemory: "8192", AnnotationAssignment: "n1:0=500"})
	n16 := node("n1", 2, 2, map[string]string{LabelGPUMemory: "16384"})
	if st := NewTracker(DefaultNodeOptions).Compute(n16, []*v1.Pod{mem}, 0, 0, "", false); st.Free[0] != 500 {
		t.Errorf("memory share: %v", st.Free[:2])
	}
	mem.Annotations[AnnotationAssignment] = "n1:0=100"
	if st := NewTracker(DefaultNodeOptions).Compute(n16, []*v1.Pod{mem}, 0, 0, "", false); st.Idle() != 1500 {
		t.Errorf("memory share with a forged milli must hold its 500: %v", st.Free[:2])
	}
	// Unknown GPU memory: a memory share is held as a whole device.
	if st := NewTracker(DefaultNodeOptions).Compute(n, []*v1.Pod{mem}, 0, 0, "", false); st.Idle() != 1000 {
		t.Errorf("unsizable share must hold a device: %v", st.Free[:2])
	}
}

// When allocatable shrinks (a device marked unhealthy) under running pods,
// an assignment to a device index the node no longer has is laid down on
// what is left; if nothing is, the node is overcommitted, not silently
// emptied.
func TestAccountingAllocatableShrinks(t *testing.T) {
	pods := []*v1.Pod{
		wholePod("a", 1, "n1:0=1000"), wholePod("b", 1, "n1:1=1000"),
		wholePod("c", 1, "n1:2=1000"), wholePod("d", 1, "n1:3=1000"),
	}
	tr := NewTracker(DefaultNodeOptions)
	if st := tr.Compute(node("n1", 4, 4, nil), pods, 0, 0, "", false); st.Idle() != 0 || st.Overcommitted {
		t.Fatalf("before: %v", st.Free[:4])
	}
	st := tr.Compute(node("n1", 3, 4, nil), pods, 0, 0, "", false)
	if !st.Overcommitted || st.Idle() != 0 {
		t.Errorf("four GPU pods on three devices: want overcommitted, got free %v overcommitted %v", st.Free[:3], st.Overcommitted)
	}
	if out, _, _ := st.Fit(&Request{Milli: 100}); out != Overcommitted {
		t.Errorf("want no share placed, got %v", out)
	}
	// Two pods, one on the device that went away: it is counted on a free one.
	st = tr.Compute(node("n1", 3, 4, nil), []*v1.Pod{pods[0], pods[3]}, 0, 0, "", false)
	if st.Overcommitted || st.Idle() != 1000 || st.FullyFree() != 1 {
		t.Errorf("want one free device of three, got free %v overcommitted %v", st.Free[:3], st.Overcommitted)
	}
	// The same for shares of a device beyond the new count.
	st = tr.Compute(node("n1", 1, 2, nil), []*v1.Pod{sharePod("s", 600, "n1:1=600"), sharePod("t", 600, "n1:0=600")}, 0, 0, "", false)
	if !st.Overcommitted {
		t.Errorf("two 600m shares on one device: want overcommitted, got %v", st.Free[:1])
	}
}

// A node that reports more devices than we track is refused for GPU pods
// with its own reason, never cut to the first MaxDevices.
func TestTooManyDevices(t *testing.T) {
	st := NewTracker(DefaultNodeOptions).Compute(node("n1", MaxDevices+1, MaxDevices+1, nil), nil, 0, 0, "", false)
	if out, _, _ := st.Fit(&Request{Count: 1}); out != TooManyDevices || !out.Unresolvable() {
		t.Errorf("want TooManyDevices (unresolvable), got %v", out)
	}
	if out, _, _ := st.Fit(&Request{CPU: 1}); out != Fits {
		t.Errorf("CPU pods still fit, got %v", out)
	}
	st = NewTracker(DefaultNodeOptions).Compute(node("n1", 56, 56, nil), []*v1.Pod{wholePod("a", 1, "n1:55=1000")}, 0, 0, "", false)
	if st.Count != 56 || st.Free[55] != 0 || st.FullyFree() != 55 {
		t.Errorf("MIG 8x7: want 56 devices with the last taken, got %d free %d", st.Count, st.FullyFree())
	}
	c, _, ok := DefaultScoring.Evaluate(st, &Request{Count: 55}, nil)
	if !ok || popcount(c.Mask) != 55 || c.Mask&(1<<55) != 0 {
		t.Errorf("55 GPUs on the free ones: %v %b", ok, c.Mask)
	}
	if a := NewAssignment("n1", c); len(a.Shares) != 55 {
		t.Errorf("assignment: %v", a)
	} else if b, err := ParseAssignment(a.String()); err != nil || len(b.Shares) != 55 {
		t.Errorf("round trip: %v", err)
	}
}

// A release decided about an earlier reservation never drops the pod's newer
// one.
func TestUnreserveIf(t *testing.T) {
	tr := NewTracker(DefaultNodeOptions)
	first := tr.Reserve("n1", "p", Reservation{Choice: Choice{Mask: 1, Milli: 500}})
	second := tr.Reserve("n1", "p", Reservation{Choice: Choice{Mask: 2, Milli: 500}})
	if tr.UnreserveIf("p", first) {
		t.Fatal("dropped the newer reservation")
	}
	if _, r, ok := tr.Reserved("p"); !ok || r.Seq != second {
		t.Fatalf("want the second reservation kept, got %+v %v", r, ok)
	}
	if !tr.UnreserveIf("p", second) {
		t.Fatal("did not drop its own reservation")
	}
	if _, _, ok := tr.Reserved("p"); ok || len(tr.Reservations()) != 0 {
		t.Fatal("reservation left behind")
	}
}

// A flood of distinct model strings (tenants write them) does not grow the
// learner without bound, and the common kinds survive it.
func TestLearnerBounded(t *testing.T) {
	l := NewLearner(0.95, 0)
	common := Request{Milli: 500, CPU: 1000}
	for i := 0; i < 2000; i++ {
		l.Observe(fmt.Sprintf("c%d", i), &common)
	}
	long := strings.Repeat("x", 10000)
	for i := 0; i < 50000; i++ {
		r := Request{Milli: 300, CPU: 1000, Models: ModelSelector{Exact: []string{fmt.Sprintf("model-%d", i)}}}
		if i%100 == 0 {
			r.Models.Exact = []string{long + fmt.Sprint(i)}
		}
		l.Observe(fmt.Sprintf("f%d", i), &r)
		if k := l.Kinds(); k > maxLearnerKeys {
			t.Fatalf("after %d distinct models the learner counts %d kinds (bound %d)", i+1, k, maxLearnerKeys)
		}
	}
	found := false
	for _, tk := range l.Workload().Tasks() {
		if tk.Milli == 500 && tk.Models.Empty() {
			found = true
		}
		if len(tk.Models.String()) > maxLearnedModels {
			t.Errorf("a learned task keeps a %d-byte model selector", len(tk.Models.String()))
		}
	}
	if !found {
		t.Errorf("the common kind was pruned: %+v", l.Workload().Tasks())
	}
	if l.bucketed {
		t.Errorf("kinds that differ by their models must not have their CPU grouped")
	}
}

// Shares without an assignment that fit the node only in some arrangement
// are not an overcommit: best fit alone lays 500, 400, 300, 300, 250, 250 on
// two devices as 500+400 | 300+300+250 and finds no room for the last 250,
// while 500+250+250 | 400+300+300 fits exactly.
func TestLayDownFindsPacking(t *testing.T) {
	var pods []*v1.Pod
	for i, m := range []int{500, 400, 300, 300, 250, 250} {
		pods = append(pods, sharePod(fmt.Sprint("s", i), m, ""))
	}
	st := NewTracker(DefaultNodeOptions).Compute(node("n1", 2, 2, nil), pods, 0, 0, "", false)
	if st.Overcommitted || st.Idle() != 0 {
		t.Errorf("want a full node, not overcommitted: free %v overcommitted %v", st.Free[:2], st.Overcommitted)
	}
	// Our share placed in what the layout showed free stays consistent once
	// its assignment is written: the node does not turn overcommitted.
	others := []*v1.Pod{sharePod("a", 800, ""), sharePod("b", 700, ""), sharePod("c", 200, ""), sharePod("d", 200, "")}
	tr := NewTracker(DefaultNodeOptions)
	n := node("n1", 2, 2, nil)
	st = tr.Compute(n, others, 0, 0, "", false)
	req := Request{Milli: 100}
	c, _, ok := DefaultScoring.Evaluate(st, &req, nil)
	if !ok {
		t.Fatalf("100 milli are free (%v) but do not fit", st.Free[:2])
	}
	ours := sharePod("ours", 100, NewAssignment("n1", c).String())
	if st := tr.Compute(n, append(others, ours), 0, 0, "", false); st.Overcommitted || st.Idle() != 0 {
		t.Errorf("our placement overcommitted the node: free %v", st.Free[:2])
	}
	// A hopeless instance ends within the search bound, overcommitted.
	var many []*v1.Pod
	for i := 0; i < 40; i++ {
		many = append(many, sharePod(fmt.Sprint("m", i), 130+i, ""))
	}
	st = NewTracker(DefaultNodeOptions).Compute(node("n1", 4, 4, nil), many, 0, 0, "", false)
	if !st.Overcommitted || st.Idle() < 0 {
		t.Errorf("40 shares of 130-169 milli on 4 devices: want overcommitted, got %v", st.Free[:4])
	}
}

// BenchmarkLayDownAwkward is the bounded worst case a tenant can cause: a
// node full of assignment-less shares of awkward sizes that do not pack, so
// every rebuild runs the search to its bound.
func BenchmarkLayDownAwkward(b *testing.B) {
	for _, devices := range []int64{8, 64} {
		b.Run(fmt.Sprint(devices, "-devices"), func(b *testing.B) {
			// 2.5 shares of 380-420 per device: they fit by the total,
			// and no arrangement fits them.
			var pods []*v1.Pod
			for i := int64(0); i < devices*5/2; i++ {
				pods = append(pods, sharePod(fmt.Sprint("m", i), 380+int(i%5)*10, ""))
			}
			n := node("n1", devices, devices, nil)
			tr := NewTracker(DefaultNodeOptions)
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if st := tr.Compute(n, pods, 0, 0, "", false); !st.Overcommitted {
					b.Fatal("packed")
				}
			}
		})
	}
}

// A CPU-only pod ranks a refused node (more devices than we track) the same
// whether scored from the node's accounting alone or from its device state:
// it is a GPU node either way.
func TestCPUOnlyOnRefusedNode(t *testing.T) {
	sc := Scoring{Policy: Fragmentation, NodePriority: true}
	wl, err := NewWorkload([]Task{{CPU: 1000, Milli: 500, Count: 1, Weight: 1}})
	if err != nil {
		t.Fatal(err)
	}
	r := Request{CPU: 1000}
	for _, n := range []int64{0, 8, MaxDevices + 16} {
		st := NewTracker(DefaultNodeOptions).Compute(node("n1", n, n, nil), nil, 64000, 1<<20, "", false)
		_, full, _ := sc.Evaluate(st, &r, wl)
		quick, ok := sc.CPUOnlyQuick(n > 0, "n1", 64000, 1<<20, &r, wl)
		if !ok || quick != full {
			t.Errorf("%d devices: quick %d (ok %v), from the device state %d", n, quick, ok, full)
		}
	}
}
