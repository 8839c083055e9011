package gpu

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func node(name string, alloc, capacity int64, labels map[string]string) *v1.Node {
	return &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Status: v1.NodeStatus{
			Allocatable: v1.ResourceList{ResourceNvidiaGPU: *resource.NewQuantity(alloc, resource.DecimalSI)},
			Capacity:    v1.ResourceList{ResourceNvidiaGPU: *resource.NewQuantity(capacity, resource.DecimalSI)},
		},
	}
}

func TestReadInventory(t *testing.T) {
	tests := map[string]struct {
		node *v1.Node
		want Inventory
	}{
		"gfd labels": {node(
			"n", 8, 8, map[string]string{LabelGPUProduct: "NVIDIA-A100-SXM4-80GB", LabelGPUMemory: "81920"}),
			Inventory{Count: 8, Reported: 8, Model: "NVIDIA-A100-SXM4-80GB", ModelFold: "NVIDIA-A100-SXM4-80GB", MemoryMiB: 81920}},
		"unhealthy devices":  {node("n", 6, 8, nil), Inventory{Count: 6, Reported: 6, Unhealthy: 2}},
		"memory in bytes":    {node("n", 1, 1, map[string]string{LabelGPUMemory: "85899345920"}), Inventory{Count: 1, Reported: 1, MemoryMiB: 81920}},
		"memory not numeric": {node("n", 1, 1, map[string]string{LabelGPUMemory: "80G"}), Inventory{Count: 1, Reported: 1}},
		"memory absurd":      {node("n", 1, 1, map[string]string{LabelGPUMemory: "9223372036854775807"}), Inventory{Count: 1, Reported: 1}},
		"no gpu":             {&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cpu"}}, Inventory{}},
		"mig single, 8x7":    {node("n", 56, 56, nil), Inventory{Count: 56, Reported: 56}},
		// More than we track: refused, never cut to the first 64.
		"too many": {node("n", 100, 100, nil), Inventory{Reported: 100}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, ReadInventory(tc.node, DefaultNodeOptions)); diff != "" {
				t.Errorf("(-want,+got):\n%s", diff)
			}
		})
	}
}

func TestAssignmentRoundTrip(t *testing.T) {
	a := NewAssignment("gpu-node-3", Choice{Mask: 0b1010, Milli: 1000})
	if got := a.String(); got != "gpu-node-3:1=1000,3=1000" {
		t.Fatalf("String: %q", got)
	}
	b, err := ParseAssignment(a.String())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(a, b); diff != "" {
		t.Errorf("(-want,+got):\n%s", diff)
	}
	for _, bad := range []string{"", "node", "node:", ":0=10", "n:0", "n:a=10", "n:0=0", "n:0=1001", "n:0=10,0=10", "n:-1=10", "n:01=10", "n:0=+5", "n:64=1"} {
		if _, err := ParseAssignment(bad); err == nil {
			t.Errorf("ParseAssignment(%q): want error", bad)
		}
	}
}

func FuzzParseAssignment(f *testing.F) {
	for _, s := range []string{"n:0=1000", "gpu-node-3:1=500,2=250", "a.b.c:7=1", "x:0=10,0=10", "::", "n:1=1000,"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := ParseAssignment(s)
		if err != nil {
			var inv *InvalidError
			if !errors.As(err, &inv) || inv.Key != AnnotationAssignment {
				t.Fatalf("error is not keyed: %v", err)
			}
			return
		}
		// Whatever parses renders back to itself: no half-read annotations.
		if a.String() != s {
			t.Fatalf("round trip: %q -> %q", s, a.String())
		}
		for _, sh := range a.Shares {
			if sh.Milli < 1 || sh.Milli > MilliPerGPU || sh.Index < 0 {
				t.Fatalf("out of range share %+v", sh)
			}
		}
	})
}

func state(free ...int32) *NodeState {
	s := NewNodeState("n", Inventory{Count: int32(len(free))}, 64000)
	copy(s.Free[:], free)
	return s
}

func TestFit(t *testing.T) {
	tests := map[string]struct {
		st           *NodeState
		req          Request
		want         Outcome
		unresolvable bool
	}{
		"cpu only anywhere":      {state(), Request{CPU: 1}, Fits, false},
		"no gpu":                 {state(), Request{Count: 1}, NoGPU, true},
		"share fits one device":  {state(1000, 400), Request{Milli: 500}, Fits, false},
		"share needs one device": {state(400, 400), Request{Milli: 500}, NoDeviceWithShare, false},
		"share exact":            {state(0, 500), Request{Milli: 500}, Fits, false},
		"two whole free":         {state(1000, 0, 1000), Request{Count: 2}, Fits, false},
		"two whole, one free":    {state(1000, 999, 0), Request{Count: 2}, TooFewFreeDevices, false},
		"one whole, partly used": {state(999), Request{Count: 1}, TooFewFreeDevices, false},
		"more than the node":     {state(1000, 1000), Request{Count: 4}, TooFewDevices, true},
		"model mismatch": {&NodeState{Inventory: Inventory{Count: 1, Model: "T4", ModelFold: "T4"}, Free: [MaxDevices]int32{1000}},
			Request{Count: 1, Models: ModelSelector{Exact: []string{"A100"}}}, ModelNotAllowed, true},
		"memory unknown":   {state(1000), Request{MemoryMiB: 1024}, MemoryUnknown, true},
		"memory too large": {&NodeState{Inventory: Inventory{Count: 1, MemoryMiB: 16384}, Free: [MaxDevices]int32{1000}}, Request{MemoryMiB: 20000}, ShareTooLarge, true},
		"memory fits": {&NodeState{Inventory: Inventory{Count: 2, MemoryMiB: 16384}, Free: [MaxDevices]int32{100, 600}},
			Request{MemoryMiB: 8192}, Fits, false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, _, _ := tc.st.Fit(&tc.req)
			if got != tc.want {
				t.Errorf("want %v, got %v", tc.want, got)
			}
			if got.Unresolvable() != tc.unresolvable {
				t.Errorf("unresolvable: want %v", tc.unresolvable)
			}
		})
	}
}

func gpuPod(name string, uid types.UID, gpus int64, ann map[string]string) *v1.Pod {
	p := pod(ann, gpus, "")
	p.Name, p.UID = name, uid
	return p
}

func TestTrackerBuild(t *testing.T) {
	n := node("n1", 4, 4, nil)
	tr := NewTracker(DefaultNodeOptions)
	pods := []*v1.Pod{
		// Annotated: devices 0 and 1, whole.
		gpuPod("a", "a", 2, map[string]string{AnnotationAssignment: "n1:0=1000,1=1000"}),
		// Shared, annotated on device 2.
		gpuPod("b", "b", 0, map[string]string{AnnotationMilli: "300", AnnotationAssignment: "n1:2=300"}),
		// An annotation for another node is stale (a failed bind elsewhere) and is
		// ignored; the pod is then unknown: one whole GPU from the top.
		gpuPod("c", "c", 1, map[string]string{AnnotationAssignment: "n9:0=1000"}),
	}
	st := tr.Build(n, 7, pods, 1000, 1<<20)
	want := [MaxDevices]int32{0, 0, 700, 0}
	if st.Free != want {
		t.Fatalf("free: want %v, got %v", want[:4], st.Free[:4])
	}
	if got := tr.Lookup("n1", 7); got != st {
		t.Errorf("lookup at the same generation must hit")
	}
	if got := tr.Lookup("n1", 8); got != nil {
		t.Errorf("lookup at a new generation must miss")
	}

	// A reservation for a pod not yet in the node's view counts; a change of
	// reservations invalidates the cache.
	tr.Reserve("n1", "d", Reservation{Name: "d", Choice: Choice{Mask: 1 << 2, Milli: 500}})
	if tr.Lookup("n1", 7) != nil {
		t.Fatalf("reserve must invalidate")
	}
	st = tr.Build(n, 7, pods, 1000, 1<<20)
	if st.Free[2] != 200 {
		t.Errorf("reservation not counted: %v", st.Free[:4])
	}
	// Once the pod shows up with its annotation, the annotation counts and the
	// reservation is dropped (never both).
	d := gpuPod("d", "d", 0, map[string]string{AnnotationMilli: "500", AnnotationAssignment: "n1:2=500"})
	st = tr.Build(n, 9, append(pods, d), 1000, 1<<20)
	if st.Free[2] != 200 {
		t.Errorf("double counted or lost: %v", st.Free[:4])
	}
	if _, _, ok := tr.Reserved("d"); ok {
		t.Errorf("reservation should be dropped once the annotation is seen")
	}
	if tr.Unreserve("d") {
		t.Errorf("second unreserve must be a no-op")
	}
}

func TestTrackerOvercommit(t *testing.T) {
	n := node("n1", 1, 1, nil)
	tr := NewTracker(DefaultNodeOptions)
	st := tr.Build(n, 1, []*v1.Pod{
		gpuPod("a", "a", 0, map[string]string{AnnotationMilli: "700", AnnotationAssignment: "n1:0=700"}),
		gpuPod("b", "b", 0, map[string]string{AnnotationMilli: "700", AnnotationAssignment: "n1:0=700"}),
	}, 0, 0)
	if !st.Overcommitted || st.Free[0] != 0 {
		t.Errorf("want overcommitted with nothing free, got %+v", st.Free[:1])
	}
}

// Reserve and Unreserve from many goroutines while states are built: every
// built state must equal the devices minus exactly the reservations present.
func TestTrackerConcurrent(t *testing.T) {
	n := node("n1", 8, 8, nil)
	tr := NewTracker(DefaultNodeOptions)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			uid := types.UID(fmt.Sprintf("pod-%d", g))
			for i := 0; i < 500; i++ {
				tr.Reserve("n1", uid, Reservation{Choice: Choice{Mask: 1 << uint(g), Milli: 100}})
				tr.Reserve("n1", uid, Reservation{Choice: Choice{Mask: 1 << uint(g), Milli: 100}}) // idempotent
				if i%3 == 0 {
					tr.Unreserve(uid)
					tr.Unreserve(uid)
				}
			}
		}(g)
	}
	stop := make(chan struct{})
	errs := make(chan string, 1)
	go func() {
		for gen := int64(0); ; gen++ {
			select {
			case <-stop:
				return
			default:
			}
			st := tr.Build(n, gen, nil, 0, 1<<20)
			for i := 0; i < 8; i++ {
				if st.Free[i] != 1000 && st.Free[i] != 900 {
					select {
					case errs <- fmt.Sprintf("device %d free %d", i, st.Free[i]):
					default:
					}
				}
			}
		}
	}()
	wg.Wait()
	close(stop)
	select {
	case e := <-errs:
		t.Fatal(e)
	default:
	}
	st := tr.Build(n, -1, nil, 0, 1<<20)
	res := tr.Reservations()
	if got := int64(8000) - st.Idle(); got != int64(len(res))*100 {
		t.Errorf("used %d milli, but %d reservations", got, len(res))
	}
	for _, r := range res {
		tr.Unreserve(r.UID)
	}
	if st := tr.Build(n, -2, nil, 0, 1<<20); st.Idle() != 8000 || len(tr.Reservations()) != 0 {
		t.Errorf("leftover after unreserving all: idle %d", st.Idle())
	}
}

func TestFragHandWorked(t *testing.T) {
	wl, err := NewWorkload([]Task{
		{CPU: 1000, Milli: 500, Count: 1, Weight: 2},
		{CPU: 0, Milli: 0, Count: 0, Weight: 1},
		{CPU: 1000, Milli: 1000, Count: 1, Weight: 1},
	})
	if err != nil {
		t.Fatal(err)
	}
	s := state(1000, 300)
	// L = 1300. The 500-task and the whole task fit and see 300 (device 1) as
	// fragment; the CPU-only task sees all 1300. 0.5*300+0.25*1300+0.25*300.
	if got := wl.Frag(s); got != 550 {
		t.Errorf("F: want 550, got %v", got)
	}
	s2 := state(1000, 300)
	s2.CPUFree = 500 // neither GPU task fits any more: everything is fragment
	if got := wl.Frag(s2); got != 1300 {
		t.Errorf("F with no CPU: want 1300, got %v", got)
	}
	typed, _ := NewWorkload([]Task{{Milli: 1000, Count: 1, Weight: 1, Models: ModelSelector{Exact: []string{"A100"}}}})
	s3 := &NodeState{Inventory: Inventory{Count: 2, Model: "T4", ModelFold: "T4"}, Free: [MaxDevices]int32{1000, 1000}, CPUFree: 1}
	if got := typed.Frag(s3); got != 2000 {
		t.Errorf("F for a model the task cannot use: want 2000, got %v", got)
	}
}

// The allocation-free frag must agree with the definition on random nodes.
func TestFragMatchesDefinition(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	var tasks []Task
	for i := 0; i < 40; i++ {
		m := int32(rng.Intn(1001))
		c := int32(1)
		if m == MilliPerGPU {
			c = int32(1 << uint(rng.Intn(4)))
		}
		if m == 0 {
			c = 0
		}
		tasks = append(tasks, Task{CPU: int64(rng.Intn(16000)), Milli: m, Count: c, Weight: rng.Float64()})
	}
	wl, err := NewWorkload(tasks)
	if err != nil {
		t.Fatal(err)
	}
	for trial := 0; trial < 500; trial++ {
		n := 1 + rng.Intn(8)
		s := NewNodeState("n", Inventory{Count: int32(n)}, int64(rng.Intn(20000)))
		for i := 0; i < n; i++ {
			s.Free[i] = int32(rng.Intn(1001))
		}
		var want, idle float64
		for i := 0; i < n; i++ {
			idle += float64(s.Free[i])
		}
		for _, tk := range wl.Tasks() {
			if tk.Milli == 0 {
				want += tk.Weight * idle
				continue
			}
			var ge int32
			var small float64
			for i := 0; i < n; i++ {
				if s.Free[i] >= tk.Milli {
					ge++
				} else {
					small += float64(s.Free[i])
				}
			}
			if ge >= tk.Count && s.CPUFree >= tk.CPU {
				want += tk.Weight * small
			} else {
				want += tk.Weight * idle
			}
		}
		if idle == 0 {
			want = 0
		}
		if got := wl.Frag(s); abs(got-want) > 1e-6 {
			t.Fatalf("trial %d: free %v cpu %d: want %v, got %v", trial, s.Free[:n], s.CPUFree, want, got)
		}
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

func TestEvaluateDeviceChoice(t *testing.T) {
	wl, _ := NewWorkload([]Task{{Milli: 500, Count: 1, Weight: 1}})
	tests := map[string]struct {
		policy Policy
		free   []int32
		req    Request
		want   Choice
	}{
		"whole takes lowest free": {BestFit, []int32{300, 1000, 1000, 1000}, Request{Count: 2}, Choice{Mask: 0b0110, Milli: 1000}},
		"best fit tightest":       {BestFit, []int32{1000, 600, 450, 800}, Request{Milli: 400}, Choice{Mask: 0b0100, Milli: 400}},
		"packing tightest":        {Packing, []int32{1000, 600, 450}, Request{Milli: 400}, Choice{Mask: 0b0100, Milli: 400}},
		"spread most free":        {Spread, []int32{600, 1000, 450}, Request{Milli: 400}, Choice{Mask: 0b0010, Milli: 400}},
		"spread tie lowest":       {Spread, []int32{1000, 1000}, Request{Milli: 400}, Choice{Mask: 0b0001, Milli: 400}},
		// Typical task wants 500. Putting 300 on the 800 device leaves 500 for
		// it (no new fragment); on the 1000 device it would leave 700 and 800,
		// also fine; on the 600 device it strands 300. Bucketed, the first of
		// the equal devices wins (FGD's choice); exact, the tighter one.
		"fragmentation":               {Fragmentation, []int32{1000, 600, 800}, Request{Milli: 300}, Choice{Mask: 0b0001, Milli: 300}},
		"fragmentation exact":         {"exact", []int32{1000, 600, 800}, Request{Milli: 300}, Choice{Mask: 0b0100, Milli: 300}},
		"fragmentation strands least": {Fragmentation, []int32{600, 1000}, Request{Milli: 300}, Choice{Mask: 0b0010, Milli: 300}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			sc := DefaultScoring
			sc.Policy = tc.policy
			if tc.policy == "exact" {
				sc.Policy, sc.Exact = Fragmentation, true
			}
			got, _, ok := sc.Evaluate(state(tc.free...), &tc.req, wl)
			if !ok {
				t.Fatal("does not fit")
			}
			if got != tc.want {
				t.Errorf("want %b/%d, got %b/%d", tc.want.Mask, tc.want.Milli, got.Mask, got.Milli)
			}
		})
	}
}

func TestEvaluateNodeOrder(t *testing.T) {
	wl, _ := NewWorkload([]Task{{Milli: 1000, Count: 2, Weight: 1}, {Milli: 500, Count: 1, Weight: 1}})
	score := func(p Policy, r Request, free ...int32) int64 {
		_, s, ok := Evaluate(p, state(free...), &r, wl)
		if !ok {
			t.Fatalf("%v %v does not fit %v", p, r, free)
		}
		return s
	}
	share := Request{Milli: 500}
	// Fragmentation: a 500 share on a half-used device leaves the other two
	// devices for the 2-GPU task; on an idle node it breaks a pair.
	if a, b := score(Fragmentation, share, 500, 1000, 1000), score(Fragmentation, share, 1000, 1000); a <= b {
		t.Errorf("fragmentation should prefer completing a used device: %d <= %d", a, b)
	}
	// Packing prefers a used GPU, then a used node, then the smallest idle node.
	if a, b := score(Packing, share, 600), score(Packing, share, 1000, 0); a <= b {
		t.Errorf("packing: used GPU first")
	}
	if a, b := score(Packing, share, 1000, 0), score(Packing, share, 1000); a <= b {
		t.Errorf("packing: used node before idle node")
	}
	if a, b := score(Packing, share, 1000), score(Packing, share, 1000, 1000, 1000, 1000); a <= b {
		t.Errorf("packing: smaller idle node first")
	}
	// Spread prefers the emptier node.
	if a, b := score(Spread, share, 1000, 1000), score(Spread, share, 1000, 200); a <= b {
		t.Errorf("spread: emptier node first")
	}
	// Best fit prefers the node that leaves less behind.
	if a, b := score(BestFit, share, 500), score(BestFit, share, 1000); a <= b {
		t.Errorf("best fit: tighter node first")
	}
	// CPU-only pods: a node without GPUs beats any GPU node; GPU nodes are
	// ranked by the fragmentation the CPU use adds, or by their idle GPU.
	for _, p := range Policies {
		cpu := Request{CPU: 1000}
		none, busy, idle := score(p, cpu), score(p, cpu, 0, 100), score(p, cpu, 1000, 1000)
		if !(none > busy && none > idle) {
			t.Errorf("%s: cpu-only pods must prefer nodes without GPUs: none %d busy %d idle %d", p, none, busy, idle)
		}
		if p != Fragmentation && busy <= idle {
			t.Errorf("%s: less idle GPU first: busy %d idle %d", p, busy, idle)
		}
	}
	// Fragmentation counts the CPU a CPU-only pod takes from typical GPU pods.
	cpuHungry, _ := NewWorkload([]Task{{CPU: 60000, Milli: 1000, Count: 1, Weight: 1}})
	roomy := state(1000)
	tight := state(1000)
	tight.CPUFree = 60500 // after 1000 more, the typical pod no longer fits
	_, a, _ := Evaluate(Fragmentation, roomy, &Request{CPU: 1000}, cpuHungry)
	_, b, _ := Evaluate(Fragmentation, tight, &Request{CPU: 1000}, cpuHungry)
	if a <= b {
		t.Errorf("a CPU-only pod must avoid stranding a GPU: %d <= %d", a, b)
	}
}

// The stranded-GPU term: the target's typical pod takes a GPU and 8 CPUs, so
// a node of 8 GPUs and 64 CPUs is balanced. Both nodes leave every typical
// pod room (F does not move, so without the term the node order decides);
// the term sends a CPU-heavy pod to the node with CPU to spare, where it
// strands nothing, and a CPU-light one to the node short of CPU, where it
// uses GPUs that would be stranded. Memory strands the same way.
func TestStrandedGPU(t *testing.T) {
	wl, err := NewWorkload([]Task{{CPU: 8000, Memory: 32768, Milli: 1000, Count: 1, Weight: 1}})
	if err != nil {
		t.Fatal(err)
	}
	node := func(name string, cpu, mem int64) *NodeState {
		s := NewNodeState(name, Inventory{Count: 8}, cpu)
		s.MemFree = mem
		for d := range 8 {
			s.Free[d] = MilliPerGPU
		}
		return s
	}
	const mem = 8 * 32768
	tests := map[string]struct {
		pod        Request
		rich, poor *NodeState
		want       string // the node the pod should go to
	}{
		"cpu-heavy pod to spare CPU": {Request{Count: 1, CPU: 32000, Memory: 32768},
			node("rich", 128000, mem), node("poor", 64000, mem), "rich"},
		"cpu-light pod to the node short of CPU": {Request{Count: 1, CPU: 1000, Memory: 32768},
			node("rich", 128000, mem), node("poor", 48000, mem), "poor"},
		"memory-heavy pod to spare memory": {Request{Count: 1, CPU: 8000, Memory: 4 * 32768},
			node("rich", 64000, 2*mem), node("poor", 64000, mem), "rich"},
		"share, cpu-heavy": {Request{Milli: 500, CPU: 32000, Memory: 32768},
			node("rich", 128000, mem), node("poor", 64000, mem), "rich"},
		"two GPUs, cpu-light": {Request{Count: 2, CPU: 2000, Memory: 65536},
			node("rich", 128000, mem), node("poor", 48000, mem), "poor"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			for _, names := range [][2]string{{"node-a", "node-b"}, {"node-b", "node-a"}} {
				tc.rich.Name, tc.poor.Name = names[0], names[1]
				tc.rich.Prio, tc.poor.Prio = nodePrio(names[0]), nodePrio(names[1])
				_, rich, ok1 := DefaultScoring.Evaluate(tc.rich, &tc.pod, wl)
				_, poor, ok2 := DefaultScoring.Evaluate(tc.poor, &tc.pod, wl)
				if !ok1 || !ok2 {
					t.Fatal("does not fit")
				}
				if got := map[bool]string{true: "rich", false: "poor"}[rich > poor]; got != tc.want {
					t.Errorf("%s: rich node scores %d, poor %d: want %s", names, rich, poor, tc.want)
				}
				// Without the term F ties them: the node order decides.
				off := DefaultScoring
				off.Strand = 0
				_, r0, _ := off.Evaluate(tc.rich, &tc.pod, wl)
				_, p0, _ := off.Evaluate(tc.poor, &tc.pod, wl)
				if (r0 > p0) != (tc.rich.Prio > tc.poor.Prio) {
					t.Errorf("%s: without the term the node order decides: rich %d, poor %d", names, r0, p0)
				}
			}
		})
	}
}

// Without memory in the fit, memory strands nothing: the node order decides.
func TestStrandedGPUMemoryUnaware(t *testing.T) {
	wl, _ := NewWorkload([]Task{{CPU: 8000, Memory: 32768, Milli: 1000, Count: 1, Weight: 1}})
	sc := DefaultScoring
	sc.MemoryAware = false
	pod := Request{Count: 1, CPU: 8000, Memory: 4 * 32768}
	for _, names := range [][2]string{{"node-a", "node-b"}, {"node-b", "node-a"}} {
		rich, poor := NewNodeState(names[0], Inventory{Count: 8}, 64000), NewNodeState(names[1], Inventory{Count: 8}, 64000)
		rich.MemFree, poor.MemFree = 16*32768, 8*32768
		for d := range 8 {
			rich.Free[d], poor.Free[d] = MilliPerGPU, MilliPerGPU
		}
		rich.Prio, poor.Prio = nodePrio(names[0]), nodePrio(names[1])
		_, r, _ := sc.Evaluate(rich, &pod, wl)
		_, p, _ := sc.Evaluate(poor, &pod, wl)
		if (r > p) != (rich.Prio > poor.Prio) {
			t.Errorf("%s: memory-unaware, rich %d, poor %d: want the node order", names, r, p)
		}
	}
}

// The term is one value for the node: it must not change which device a
// share takes there (added before the bucketing, a large one would put
// every device in the same bucket and hand the share to the first).
func TestStrandedGPUKeepsTheDevice(t *testing.T) {
	wl, _ := NewWorkload([]Task{{CPU: 2000, Milli: 500, Count: 1, Weight: 1}})
	s := state(600, 1000)
	s.CPUFree = 12000
	pod := Request{Milli: 300, CPU: 10000}
	heavy, off := DefaultScoring, DefaultScoring
	heavy.Strand, off.Strand = 10, 0
	c0, s0, _ := off.Evaluate(s, &pod, wl)
	c1, s1, _ := heavy.Evaluate(s, &pod, wl)
	if c0 != c1 || c0.Mask != 0b10 {
		t.Errorf("device %b without the term, %b with it: want 10 both times (the 600 device would strand 300)", c0.Mask, c1.Mask)
	}
	if s1 >= s0 {
		t.Errorf("the pod strands GPU: score %d with the term, %d without", s1, s0)
	}
}

func TestStranded(t *testing.T) {
	const noMem = math.MaxInt64
	for _, tc := range []struct {
		idle, cpu, mem int64
		cpuPer, memPer float64
		want           float64
	}{
		{8000, 64000, noMem, 8, 0, 0},         // balanced
		{8000, 32000, noMem, 8, 0, 4000},      // CPU for 4 of 8 GPUs
		{8000, -1000, noMem, 8, 0, 8000},      // overcommitted: no CPU
		{8000, 32000, noMem, 0, 0, 0},         // the target asks no CPU
		{8000, 64000, 65536, 8, 16.384, 4000}, // memory for 4 GPUs
		{8000, 32000, 32768, 8, 16.384, 6000}, // the scarcer of the two
		{0, 0, 0, 8, 16.384, 0},               // no idle GPU
	} {
		if got := stranded(tc.idle, tc.cpu, tc.mem, tc.cpuPer, tc.memPer); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("stranded(%d, %d, %d, %v, %v) = %v, want %v", tc.idle, tc.cpu, tc.mem, tc.cpuPer, tc.memPer, got, tc.want)
		}
	}
	// The ratio is over the tasks the node's model can run.
	wl, _ := NewWorkload([]Task{
		{CPU: 8000, Memory: 1024, Milli: 1000, Count: 1, Weight: 1, Models: ModelSelector{Exact: []string{"A100"}}},
		{CPU: 2000, Memory: 1024, Milli: 1000, Count: 2, Weight: 1},
		{CPU: 50000, Weight: 5}, // CPU-only pods do not count
	})
	a100, t4 := state(1000), state(1000)
	a100.Model, a100.ModelFold, t4.Model, t4.ModelFold = "A100", "A100", "T4", "T4"
	if c := wl.cache(a100, true); math.Abs(c.cpuPer-10000.0/3000) > 1e-9 {
		t.Errorf("A100 node: %v CPU per milli-GPU, want %v", c.cpuPer, 10000.0/3000)
	}
	if c := wl.cache(t4, true); math.Abs(c.cpuPer-1) > 1e-9 {
		t.Errorf("T4 node: %v CPU per milli-GPU, want 1", c.cpuPer)
	}
}

// The stable node order breaks ties, and only ties.
func TestNodePriorityTieBreak(t *testing.T) {
	a, b := state(1000, 1000), state(1000, 1000)
	a.Name, b.Name = "node-a", "node-b"
	a.Prio, b.Prio = nodePrio(a.Name), nodePrio(b.Name)
	r := Request{Count: 1}
	_, sa, _ := Evaluate(BestFit, a, &r, nil)
	_, sb, _ := Evaluate(BestFit, b, &r, nil)
	if sa == sb || (sa > sb) != (a.Prio > b.Prio) {
		t.Errorf("equal nodes must be ordered by priority: %d %d (prio %d %d)", sa, sb, a.Prio, b.Prio)
	}
	c := state(1000)
	c.Name, c.Prio = "node-c", 0xffff
	_, sc, _ := Evaluate(BestFit, c, &r, nil)
	if sc < sa || sc < sb {
		t.Errorf("a better node must win whatever its priority")
	}
}

func TestLearner(t *testing.T) {
	l := NewLearner(0.95, 0)
	if l.Workload() != nil {
		t.Fatal("no workload before any pod")
	}
	share := Request{Milli: 500, CPU: 1000}
	whole := Request{Count: 1, CPU: 2000}
	for i := 0; i < 90; i++ {
		l.Observe(fmt.Sprintf("s%d", i), &share)
	}
	for i := 0; i < 10; i++ {
		l.Observe(fmt.Sprintf("w%d", i), &whole)
		l.Observe(fmt.Sprintf("w%d", i), &whole) // a retry is not a new pod
	}
	l.Observe("m", &Request{MemoryMiB: 100}) // no node-independent size: ignored
	tasks := l.Workload().Tasks()
	if len(tasks) != 2 {
		t.Fatalf("want 2 tasks, got %+v", tasks)
	}
	got := map[int32]float64{}
	for _, tk := range tasks {
		got[tk.Milli] = tk.Weight
	}
	if abs(got[500]-0.9) > 1e-9 || abs(got[1000]-0.1) > 1e-9 {
		t.Errorf("weights: %v", got)
	}

	// With decay, a new mix takes over.
	d := NewLearner(0.95, 100)
	for i := 0; i < 1000; i++ {
		d.Observe(fmt.Sprintf("a%d", i), &share)
	}
	for i := 0; i < 1000; i++ {
		d.Observe(fmt.Sprintf("b%d", i), &whole)
	}
	for _, tk := range d.Workload().Tasks() {
		if tk.Milli == 500 {
			t.Errorf("old task should have decayed out: %+v", d.Workload().Tasks())
		}
	}
}

// Kinds are told apart by their exact CPU; grouped by bucket, finely varied
// CPU requests fold into a bounded set of tasks whose CPU is the mean of
// their members, and the task count stays capped.
func TestLearnerBucketsAndCap(t *testing.T) {
	cpus := []int64{11300, 11400, 11908, 12000}
	x := NewLearner(0.95, 0)
	for i, cpu := range cpus {
		x.Observe(fmt.Sprintf("a%d", i), &Request{Count: 1, CPU: cpu})
	}
	var got []int64
	for _, tk := range x.Workload().Tasks() {
		got = append(got, tk.CPU)
	}
	slices.Sort(got)
	if !slices.Equal(got, cpus) {
		t.Errorf("exact CPU: want four tasks of %v millicores, got %v", cpus, got)
	}
	l := NewLearner(0.95, 0).BucketCPU()
	for i, cpu := range cpus {
		l.Observe(fmt.Sprintf("a%d", i), &Request{Count: 1, CPU: cpu})
	}
	tasks := l.Workload().Tasks()
	if len(tasks) != 1 || tasks[0].CPU != 11652 {
		t.Fatalf("want one task with the mean CPU 11652, got %+v", tasks)
	}
	for _, tc := range []struct{ in, want int64 }{{0, 0}, {8, 8}, {9, 9}, {1000, 1024}, {3152, 3328}, {4096, 4096}, {12000, 12288}} {
		if got := cpuBucket(tc.in); got != tc.want {
			t.Errorf("cpuBucket(%d) = %d, want %d", tc.in, got, tc.want)
		}
	}
	m := NewLearner(0.95, 0)
	for i := 0; i < 500; i++ { // 500 kinds of shared pod, one each
		m.Observe(fmt.Sprintf("m%d", i), &Request{Milli: int32(1 + i), CPU: 1000})
	}
	if n := len(m.Workload().Tasks()); n != MaxLearnedTasks {
		t.Errorf("learned tasks: %d, want the cap %d", n, MaxLearnedTasks)
	}
	many := make([]Task, MaxTasks+1)
	for i := range many {
		many[i] = Task{Milli: 1000, Count: 1, Weight: 1}
	}
	if _, err := NewWorkload(many); err == nil || !strings.Contains(err.Error(), "at most 128 tasks") {
		t.Errorf("want the task limit, got %v", err)
	}
}

// A kind whose pods all ask the same takes exactly that, however the decay
// has weighted them: a weighted mean in floats lands a millicore or a MiB
// off, and a task a millicore over its pods calls a node that fits them all
// too small.
func TestLearnerKindIsItsRequest(t *testing.T) {
	cpus := []int64{2000, 4000, 6000, 8000, 10000, 12000, 16000, 32000}
	for _, bucketed := range []bool{false, true} {
		l := NewLearner(0.95, 10000)
		if bucketed {
			l.BucketCPU() // each of these is alone in its bucket
		}
		for i := 0; i < 20000; i++ {
			l.Observe(fmt.Sprint(i), &Request{Count: 1, CPU: cpus[i%len(cpus)], Memory: 65536 + int64(i%len(cpus))})
		}
		for _, tk := range l.Workload().Tasks() {
			j := slices.Index(cpus, tk.CPU)
			if j < 0 || tk.Memory != 65536+int64(j) {
				t.Errorf("bucketed %v: task of %d millicores and %d MiB is no pod's request", bucketed, tk.CPU, tk.Memory)
			}
		}
	}
}

// Requests so finely varied that the most common exact kinds describe too
// little of the mix are regrouped by bucket, their weight kept, rather than
// cut down to the heaviest few; kinds that differ by more than CPU are not.
func TestLearnerCoarsens(t *testing.T) {
	l := NewLearner(0.95, 0)
	n := 600
	for i := 0; i < n; i++ { // one pod each of 600 CPU sizes, 4000-4599
		l.Observe(fmt.Sprint(i), &Request{Count: 1, CPU: 4000 + int64(i)})
	}
	if k := l.Kinds(); !l.bucketed || k >= MaxLearnedTasks {
		t.Errorf("after %d sizes of CPU: %d kinds, grouped %v; want a few buckets", n, k, l.bucketed)
	}
	var w float64
	for _, tk := range l.Workload().Tasks() {
		w += tk.Weight
		if tk.CPU < 4000 || tk.CPU >= 4000+int64(n) {
			t.Errorf("task CPU %d is outside its members' range", tk.CPU)
		}
	}
	if abs(w-1) > 1e-9 {
		t.Errorf("task weights sum to %v", w)
	}
	var counted float64
	for _, e := range l.counts {
		counted += e.weight
	}
	if abs(counted-l.total) > 1e-6 || abs(l.total-float64(n)) > 1e-6 {
		t.Errorf("grouping lost weight: %v counted of %v, %d observed", counted, l.total, n)
	}

	// A dominant kind keeps the most common 64 covering the mix, so it is
	// the bound on kinds that has the tail grouped, into existing buckets too.
	d := NewLearner(0.95, 0)
	for i := 0; i < 20000; i++ {
		d.Observe(fmt.Sprint("d", i), &Request{Milli: 500, CPU: 1000})
	}
	tail := maxLearnerKeys + 50
	for i := 0; i < tail; i++ {
		d.Observe(fmt.Sprint("t", i), &Request{Count: 1, CPU: 4000 + int64(i)})
	}
	if k := d.Kinds(); !d.bucketed || k >= MaxLearnedTasks {
		t.Errorf("past %d kinds: %d kinds, grouped %v; want a few buckets", maxLearnerKeys, k, d.bucketed)
	}
	counted = 0
	for _, e := range d.counts {
		counted += e.weight
	}
	if abs(counted-float64(20000+tail)) > 1e-6 {
		t.Errorf("grouping at the bound lost weight: %v counted, %d observed", counted, 20000+tail)
	}

	// 600 sizes of share: grouping CPU would not help, so CPU stays exact.
	s := NewLearner(0.95, 0)
	for i := 0; i < n; i++ {
		s.Observe(fmt.Sprint(i), &Request{Milli: int32(1 + i), CPU: 4000 + int64(i)})
	}
	if s.bucketed {
		t.Errorf("kinds that differ by their share must not have their CPU grouped")
	}
}

func TestTypicalTasks(t *testing.T) {
	var reqs []Request
	add := func(n int, r Request) {
		for i := 0; i < n; i++ {
			reqs = append(reqs, r)
		}
	}
	add(50, Request{Milli: 500, CPU: 1})
	add(30, Request{Count: 1, CPU: 2})
	add(16, Request{CPU: 3})
	add(2, Request{Count: 8, CPU: 4})
	add(2, Request{Count: 4, CPU: 5})
	tasks := TypicalTasks(reqs, 0.95)
	// 50+30+16 = 96% >= 95%: three keys.
	if len(tasks) != 3 || tasks[0].Milli != 500 || tasks[2].Milli != 0 {
		t.Errorf("got %+v", tasks)
	}
	// Equal counts: the larger key first.
	tasks = TypicalTasks([]Request{{CPU: 1, Count: 1}, {CPU: 2, Count: 1}}, 0.5)
	if len(tasks) != 1 || tasks[0].CPU != 2 {
		t.Errorf("tie order: %+v", tasks)
	}
	if !strings.Contains(fmt.Sprint(tasks), "2") {
		t.Fail()
	}
}

// CPU-only pods that must go to GPU nodes pile onto the same ones, in the
// stable node order, so that the others keep their CPU for GPU pods (the
// openb replays lose 4-9 points of allocation when they spread). That order
// only breaks ties: a node where the pod would leave too little memory for
// the typical GPU pod loses, whatever its rank.
func TestCPUOnlyPodsOnGPUNodes(t *testing.T) {
	node := func(name string, memFree int64) *NodeState {
		s := NewNodeState(name, Inventory{Count: 4}, 16000)
		s.MemFree = memFree
		return s
	}
	r := Request{CPU: 4000, Memory: 16384}
	wl, err := NewWorkload([]Task{{CPU: 4000, Memory: 16384, Milli: 1000, Count: 1, Weight: 1}})
	if err != nil {
		t.Fatal(err)
	}
	for _, names := range [][2]string{{"node-a", "node-b"}, {"node-b", "node-a"}} {
		roomy, tight := node(names[0], 45875), node(names[1], 19660) // 30% and 70% of 64Gi used
		_, sRoomy, _ := Evaluate(Fragmentation, roomy, &r, wl)
		_, sTight, _ := Evaluate(Fragmentation, tight, &r, wl)
		if sRoomy <= sTight {
			t.Errorf("roomy %s scores %d, tight %s %d: want roomy first", roomy.Name, sRoomy, tight.Name, sTight)
		}
	}
	for _, p := range []Policy{Fragmentation, BestFit, Packing, Spread} {
		a, b := node("node-a", 45875), node("node-b", 45875)
		if a.Prio == b.Prio {
			t.Fatal("the test needs two priorities")
		}
		_, sa, _ := Evaluate(p, a, &r, wl)
		_, sb, _ := Evaluate(p, b, &r, wl)
		if (sa > sb) != (a.Prio > b.Prio) || sa == sb {
			t.Errorf("%s: equivalent nodes score %d (prio %d) and %d (prio %d): want the node order", p, sa, a.Prio, sb, b.Prio)
		}
	}
}

// Among GPU nodes the CPU-only pod leaves equally fragmented, it goes to the
// one with the least idle GPU, whatever the node order; without
// CPUOnlyLeastIdle, the node order decides.
func TestCPUOnlyPodsLeastIdle(t *testing.T) {
	r := Request{CPU: 2000, Memory: 4096}
	wl, err := NewWorkload([]Task{{CPU: 4000, Memory: 8192, Milli: 1000, Count: 1, Weight: 1}})
	if err != nil {
		t.Fatal(err)
	}
	node := func(name string, idle int32) *NodeState {
		s := NewNodeState(name, Inventory{Count: 4}, 32000)
		s.MemFree = 65536
		for d := int32(0); d < 4; d++ {
			s.Free[d] = min(max(idle-d*MilliPerGPU, 0), MilliPerGPU)
		}
		return s
	}
	order := DefaultScoring
	order.CPUOnlyLeastIdle = false
	for _, names := range [][2]string{{"node-a", "node-b"}, {"node-b", "node-a"}} {
		busy, idle := node(names[0], 500), node(names[1], 3000)
		_, sBusy, _ := DefaultScoring.Evaluate(busy, &r, wl)
		_, sIdle, _ := DefaultScoring.Evaluate(idle, &r, wl)
		if sBusy <= sIdle {
			t.Errorf("busy %s scores %d, idle %s %d: want the least idle first", busy.Name, sBusy, idle.Name, sIdle)
		}
		_, oBusy, _ := order.Evaluate(busy, &r, wl)
		_, oIdle, _ := order.Evaluate(idle, &r, wl)
		if (oBusy > oIdle) != (busy.Prio > idle.Prio) {
			t.Errorf("without CPUOnlyLeastIdle: %s scores %d (prio %d), %s %d (prio %d): want the node order",
				busy.Name, oBusy, busy.Prio, idle.Name, oIdle, idle.Prio)
		}
	}
}

// The node index stays complete while nodes are added one by one (read-only
// map plus batched merges), and forgets deleted nodes wherever they are.
func TestTrackerNodeIndex(t *testing.T) {
	tr := NewTracker(DefaultNodeOptions)
	states := map[string]*NodeState{}
	for i := 0; i < 1000; i++ {
		name := fmt.Sprintf("n%04d", i)
		states[name] = tr.Build(node(name, 2, 2, nil), 1, nil, 1000, 1<<20)
		if i%97 == 0 { // every node so far is still found
			for n, st := range states {
				if tr.Lookup(n, 1) != st {
					t.Fatalf("after %d nodes, %s is not found", i+1, n)
				}
			}
		}
	}
	tr.ForgetNode("n0000") // merged long ago
	tr.ForgetNode("n0999") // among the latest
	for n, st := range states {
		got := tr.Lookup(n, 1)
		if gone := n == "n0000" || n == "n0999"; gone && got != nil || !gone && got != st {
			t.Errorf("%s: got %v", n, got)
		}
	}
}

// The shortcut for CPU-only pods (every GPU task still fits by CPU and
// memory) gives the score the full fragmentation computation gives, and so
// does the quick score from the node's accounting alone, when it answers.
func TestCPUOnlyShortcutMatchesFragmentation(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	wl, err := NewWorkload([]Task{
		{CPU: 8000, Memory: 32768, Milli: 1000, Count: 2, Weight: 3},
		{CPU: 4000, Memory: 8192, Milli: 500, Count: 1, Weight: 2},
		{CPU: 2000, Weight: 1},
	})
	if err != nil {
		t.Fatal(err)
	}
	shortcuts, quick := 0, 0
	for i := 0; i < 2000; i++ {
		s := NewNodeState(fmt.Sprintf("n%d", i), Inventory{Count: int32(rng.Intn(9))}, rng.Int63n(20000))
		s.MemFree = rng.Int63n(65536)
		for d := int32(0); d < s.Count; d++ {
			s.Free[d] = int32(rng.Intn(11)) * 100
		}
		r := Request{CPU: rng.Int63n(12000), Memory: rng.Int63n(16384)}
		for _, sc := range []Scoring{DefaultScoring, {Policy: Fragmentation, NodePriority: true, MemoryAware: true}, {Policy: BestFit, NodePriority: true}} {
			_, got, _ := sc.Evaluate(s, &r, wl)
			if q, ok := sc.CPUOnlyQuick(s.Count > 0, s.Name, s.CPUFree, s.MemFree, &r, wl); ok {
				quick++
				if q != got {
					t.Fatalf("%s: quick score %d, Evaluate %d for %+v on %+v", sc.Policy, q, got, r, s)
				}
			}
			if s.Count == 0 || sc.Policy != Fragmentation {
				continue
			}
			var match [maskWords]uint64
			wl.matchMask(s, &match)
			before := wl.frag(&s.Free, s.Count, s.CPUFree, sc.memFree(s, 0), &match)
			after := wl.frag(&s.Free, s.Count, s.CPUFree-r.CPU, sc.memFree(s, r.Memory), &match)
			k := sc
			k.LeastIdle = sc.CPUOnlyLeastIdle
			if want := k.key(sc.fragPrimary(after-before)-cpuNodeTop, s.Idle(), s.Prio); got != want {
				t.Fatalf("%+v on %+v: score %d, fragmentation says %d", r, s, got, want)
			}
			if s.CPUFree-r.CPU >= wl.maxCPU && sc.memFree(s, r.Memory) >= wl.maxMem {
				shortcuts++
			}
		}
	}
	if shortcuts == 0 || quick == 0 || quick == 6000 {
		t.Fatalf("shortcut %d, quick %d of 6000 cases: the test covers only one path", shortcuts, quick)
	}
}

func TestFitOn(t *testing.T) {
	tests := map[string]struct {
		st   *NodeState
		req  Request
		on   uint64
		want Outcome
	}{
		"whole on its free device":          {state(1000, 1000), Request{Count: 1}, 0b10, Fits},
		"whole on a used device":            {state(1000, 600), Request{Count: 1}, 0b10, TooFewFreeDevices},
		"two whole, one pinned device free": {state(1000, 1000, 0), Request{Count: 2}, 0b101, TooFewFreeDevices},
		"two whole on two free":             {state(1000, 0, 1000), Request{Count: 2}, 0b101, Fits},
		"share where it has room":           {state(100, 600), Request{Milli: 500}, 0b10, Fits},
		"share pinned where it has none":    {state(600, 100), Request{Milli: 500}, 0b10, NoDeviceWithShare},
		// Whatever the pin, what never fits says why.
		"more than the node": {state(1000), Request{Count: 2}, 0b1, TooFewDevices},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := tc.st.FitOn(&tc.req, tc.on); got != tc.want {
				t.Errorf("want %v, got %v", tc.want, got)
			}
		})
	}
}

// A nominee's hold is read when a state is computed: a change of it retires
// the node's cached state, and forgetting a nomination that was never made
// retires nothing.
func TestNominationRetiresCachedState(t *testing.T) {
	n := node("n1", 2, 2, nil)
	tr := NewTracker(DefaultNodeOptions)
	nominee := gpuPod("p", "p", 1, nil)
	nominee.Spec.NodeName = ""
	pods := []*v1.Pod{nominee}
	tr.Nominate("p", "n1", Choice{Mask: 0b01, Milli: MilliPerGPU})
	if st := tr.Build(n, 1, pods, 1000, 1<<20); st.Free[0] != 0 || st.Free[1] != MilliPerGPU {
		t.Fatalf("nominee holds device 0: %v", st.Free[:2])
	}
	tr.Nominate("p", "n1", Choice{Mask: 0b10, Milli: MilliPerGPU})
	if tr.Lookup("n1", 1) != nil {
		t.Fatal("a moved hold must retire the cached state")
	}
	if st := tr.Build(n, 1, pods, 1000, 1<<20); st.Free[0] != MilliPerGPU || st.Free[1] != 0 {
		t.Errorf("nominee holds device 1: %v", st.Free[:2])
	}
	tr.Nominate("p", "n1", Choice{Mask: 0b10, Milli: MilliPerGPU})
	if tr.Lookup("n1", 1) == nil {
		t.Error("the same hold again must keep the cached state")
	}
	tr.Denominate("q")
	if tr.Lookup("n1", 1) == nil {
		t.Error("forgetting no nomination must keep the cached state")
	}
	tr.Denominate("p")
	if tr.Lookup("n1", 1) != nil {
		t.Error("a forgotten hold must retire the cached state")
	}
}

// A pod listed twice (a preemption's dry run adds an assumed pod that the
// nominator lists too) holds its devices once, reserved or nominated.
func TestPodListedTwiceHoldsOnce(t *testing.T) {
	n := node("n1", 2, 2, nil)
	tr := NewTracker(DefaultNodeOptions)
	p := gpuPod("p", "p", 1, nil)
	p.Spec.NodeName = ""
	tr.Reserve("n1", "p", Reservation{Name: "p", Choice: Choice{Mask: 0b01, Milli: MilliPerGPU}})
	if st := tr.Compute(n, []*v1.Pod{p, p}, 0, 0, "", false); st.Free[0] != 0 || st.Free[1] != MilliPerGPU || st.Overcommitted {
		t.Errorf("reserved pod listed twice: free %v, overcommitted %v", st.Free[:2], st.Overcommitted)
	}
	tr.Unreserve("p")
	tr.Nominate("p", "n1", Choice{Mask: 0b10, Milli: MilliPerGPU})
	if st := tr.Compute(n, []*v1.Pod{p, p}, 0, 0, "", false); st.Free[0] != MilliPerGPU || st.Free[1] != 0 {
		t.Errorf("nominee listed twice: free %v", st.Free[:2])
	}
}

// A learner that resumes from another's export goes on as that one does:
// the same pods after give the same target, exact or grouped by CPU, with
// decay, with kinds near the coverage cut, from any number of pods before
// (between the exporter's rebuilds too), after the lease's JSON; exporting
// changes nothing. Exports without what the target was learned from, or
// with kinds no learner would count, are refused.
func TestLearnerResume(t *testing.T) {
	var rng *rand.Rand
	// Two kinds weigh three quarters; a thin tail of kinds the rest.
	tailed := func() Request {
		switch x := rng.Float64(); {
		case x < 0.5:
			return Request{Milli: 500, CPU: 1000}
		case x < 0.75:
			return Request{Count: 1, CPU: 4000}
		default:
			return Request{Milli: int32(100 * (1 + rng.Intn(9))), CPU: int64(1001 + rng.Intn(3))}
		}
	}
	// About 30 kinds of nearly even weight.
	mixed := func() Request {
		switch rng.Intn(4) {
		case 0:
			return Request{Count: int32(1 + rng.Intn(2)), CPU: 4000, Memory: 8192}
		case 1:
			return Request{Count: 1, CPU: 2000, Models: ModelSelector{Exact: []string{"L4"}}}
		default:
			return Request{Milli: int32(100 * (1 + rng.Intn(9))), CPU: int64(1000 + 10*rng.Intn(3)), Memory: int64(rng.Intn(4096))}
		}
	}
	for _, tc := range []struct {
		name     string
		coverage float64
		halfLife int
		grouped  bool
		draw     func() Request
	}{{"exact", 1, 0, false, mixed}, {"decaying", 1, 50, false, mixed}, {"grouped", 1, 50, true, mixed},
		{"the cut among even kinds", 0.8, 500, false, mixed}, {"a thin tail", 0.6, 50, false, tailed}} {
		for _, before := range []int{150, 199, 201, 237} {
			t.Run(fmt.Sprintf("%s/%d", tc.name, before), func(t *testing.T) {
				rng = rand.New(rand.NewSource(int64(before)))
				a := NewLearner(tc.coverage, tc.halfLife)
				if tc.grouped {
					a.BucketCPU()
				}
				for i := 0; i < before; i++ {
					r := tc.draw()
					a.Observe(fmt.Sprint("p", i), &r)
				}
				current := a.Workload()
				_, e := a.Export(time.Now())
				if e.GroupedCPU != tc.grouped || e.SeenPods <= 0 || len(e.Kinds) == 0 || len(e.Recent) != min(before, maxExportedRecent) ||
					e.Recent[len(e.Recent)-1] != fmt.Sprint("p", before-1) {
					t.Fatalf("export %+v", e)
				}
				if a.Workload() != current {
					t.Fatal("Export rebuilt the target")
				}
				raw, err := json.Marshal(e)
				if err != nil {
					t.Fatal(err)
				}
				var back ExportedWorkload
				if err := json.Unmarshal(raw, &back); err != nil {
					t.Fatal(err)
				}
				b := NewLearner(tc.coverage, tc.halfLife)
				// Seen before, then forgotten: the export stands for what came
				// before it, and what comes after is learned again.
				b.Observe(fmt.Sprint("p", before), &Request{Count: 3, CPU: 1})
				if err := b.Resume(back); err != nil {
					t.Fatal(err)
				}
				for i := before; i < before+60; i++ {
					r := tc.draw()
					a.Observe(fmt.Sprint("p", i), &r)
					b.Observe(fmt.Sprint("p", i), &r)
					// In one order: tasks that weigh the same may come in
					// either.
					ta, tb := slices.Clone(a.Workload().Tasks()), slices.Clone(b.Workload().Tasks())
					for _, ts := range [][]Task{ta, tb} {
						slices.SortFunc(ts, cmpTasks)
					}
					if len(ta) != len(tb) {
						t.Fatalf("after pod %d: %d tasks, want %d", i, len(tb), len(ta))
					}
					for j := range ta {
						x, y := ta[j], tb[j]
						// A group's CPU is its members' mean, which the
						// export rounds up, and a kind's memory its
						// members' mean, rounded down: within 2
						// millicores and 1 MiB.
						if abs(float64(x.CPU-y.CPU)) > 2 || (!tc.grouped && x.CPU != y.CPU) || x.Milli != y.Milli || x.Count != y.Count ||
							x.Models.String() != y.Models.String() || abs(x.Weight-y.Weight) > 1e-9 || abs(float64(x.Memory-y.Memory)) > 1 {
							t.Fatalf("after pod %d, task %d: %+v, want %+v", i, j, y, x)
						}
					}
				}
			})
		}
	}
	l := NewLearner(1, 0)
	r := Request{Count: 1, CPU: 1000}
	l.Observe("x", &r)
	_, good := l.Export(time.Now())
	for name, edit := range map[string]func(*ExportedWorkload){
		"nothing to go on (a scheduler from before)": func(e *ExportedWorkload) { e.SeenPods, e.Kinds = 0, nil },
		"no kinds":           func(e *ExportedWorkload) { e.Kinds = nil },
		"a negative pending": func(e *ExportedWorkload) { e.PendingPods = -1 },
		"pending over seen":  func(e *ExportedWorkload) { e.PendingPods = 2 },
		"an absurd total":    func(e *ExportedWorkload) { e.SeenPods = 1e300 },
		"no time":            func(e *ExportedWorkload) { e.At = time.Time{} },
		"a negative kind": func(e *ExportedWorkload) {
			e.Kinds = []ExportedTask{{CPUMilli: 1, GPUCount: 1, GPUMilli: 1000, Weight: -1}}
		},
		"a kind over the total": func(e *ExportedWorkload) {
			e.Kinds = []ExportedTask{{CPUMilli: 1, GPUCount: 1, GPUMilli: 1000, Weight: 2}}
		},
		"a share on two devices": func(e *ExportedWorkload) {
			e.Kinds = []ExportedTask{{CPUMilli: 1, GPUCount: 2, GPUMilli: 500, Weight: 1}}
		},
	} {
		e := good
		edit(&e)
		if err := NewLearner(1, 0).Resume(e); err == nil {
			t.Errorf("%s: resumed", name)
		}
	}
	// A pod the export stands for, marked seen, is not counted again.
	m := NewLearner(1, 0)
	if err := m.Resume(good); err != nil {
		t.Fatal(err)
	}
	m.MarkSeen("x")
	m.Observe("x", &r)
	if _, e := m.Export(time.Now()); e.SeenPods != good.SeenPods {
		t.Errorf("a pod marked seen counted again: %v pods, want %v", e.SeenPods, good.SeenPods)
	}
	m.Observe("y", &r)
	if _, e := m.Export(time.Now()); e.SeenPods != good.SeenPods+1 {
		t.Errorf("a new pod: %v pods, want %v", e.SeenPods, good.SeenPods+1)
	}
}

// cmpTasks orders tasks by kind, for comparing two workloads' tasks.
func cmpTasks(x, y Task) int {
	k := func(t Task) taskKey {
		return taskKey{cpu: cpuBucket(t.CPU), milli: t.Milli, count: t.Count, models: t.Models.String()}
	}
	kx, ky := k(x), k(y)
	switch {
	case keyLess(kx, ky):
		return -1
	case keyLess(ky, kx):
		return 1
	}
	return int(x.CPU - y.CPU)
}

// An export is trimmed to a budget: the pods named but the newest 32 first,
// then the lightest kinds that are none of the tasks', then the rest of the
// pods named; the tasks and their kinds stay, over the budget if they must.
// Similar tasks are the same kinds within a hundredth of weight.
func TestExportTrimAndSimilar(t *testing.T) {
	uid := func(i int) string { return fmt.Sprintf("%08d-0000-4000-8000-000000000000", i) }
	export := func(model string) ExportedWorkload {
		l := NewLearner(0.5, 0)
		for i := 0; i < 2000; i++ {
			r := Request{Count: 1, CPU: int64(1000 + i%300), Models: ModelSelector{Exact: []string{fmt.Sprint(model, i%300)}}}
			l.Observe(uid(i), &r)
		}
		_, e := l.Export(time.Now())
		return e
	}
	gfd := export("NVIDIA-A100-SXM4-80GB-")
	full, _ := json.Marshal(gfd)
	t.Logf("an export of %d kinds named as GFD does, %d tasks, %d pods named: %d bytes", len(gfd.Kinds), len(gfd.Tasks), len(gfd.Recent), len(full))
	taskKind := func(e ExportedWorkload, k ExportedTask) bool {
		return slices.ContainsFunc(e.Tasks, func(t ExportedTask) bool { t.Weight, t.MemoryMiB = k.Weight, k.MemoryMiB; return sameTask(t, k) })
	}
	for _, tc := range []struct {
		name   string
		model  string
		budget int
		// What is left: the pods named, and whether any kind past the
		// tasks' is; fits: within the budget.
		recent    int
		pastTasks bool
		fits      bool
	}{
		{"the whole export fits", "NVIDIA-A100-SXM4-80GB-", len(full), maxExportedRecent, true, true},
		{"a few bytes over", "NVIDIA-A100-SXM4-80GB-", len(full) - 100, 64, true, true},
		{"the pods named trimmed", "NVIDIA-A100-SXM4-80GB-", len(full) - 3500, minTrimmedRecent, true, true},
		{"kinds trimmed", "NVIDIA-A100-SXM4-80GB-", len(full) - 6000, minTrimmedRecent, true, true},
		{"all but the tasks' kinds", "NVIDIA-A100-SXM4-80GB-", len(full) - 12000, 0, false, false},
		{"the longest models learned", strings.Repeat("x", 200), 16 << 10, 0, false, false},
	} {
		e := export(tc.model)
		before := slices.Clone(e.Kinds)
		tasks := slices.Clone(e.Tasks)
		e.Trim(tc.budget)
		b, _ := json.Marshal(e)
		past := slices.ContainsFunc(e.Kinds, func(k ExportedTask) bool { return !taskKind(e, k) })
		if (len(b) <= tc.budget) != tc.fits || len(e.Recent) != tc.recent || past != tc.pastTasks || !slices.EqualFunc(e.Tasks, tasks, sameTask) ||
			e.Trimmed != (tc.budget < len(full)) {
			t.Errorf("%s: trimmed to %d bytes of %d, %d pods named, %d kinds for %d tasks (past them: %v), trimmed %v",
				tc.name, len(b), tc.budget, len(e.Recent), len(e.Kinds), len(e.Tasks), past, e.Trimmed)
		}
		// The newest pods named, the tasks' kinds and the heaviest others.
		if len(e.Recent) > 0 && e.Recent[len(e.Recent)-1] != uid(1999) {
			t.Errorf("%s: the newest pod named dropped: %v", tc.name, e.Recent[len(e.Recent)-1])
		}
		var want []ExportedTask
		for _, k := range before {
			if taskKind(e, k) {
				want = append(want, k)
			}
		}
		for _, k := range before {
			if !taskKind(e, k) && len(want) < len(e.Kinds) {
				want = append(want, k)
			}
		}
		got := slices.Clone(e.Kinds)
		slices.SortFunc(got, func(a, b ExportedTask) int { return int(a.CPUMilli - b.CPUMilli) })
		slices.SortFunc(want, func(a, b ExportedTask) int { return int(a.CPUMilli - b.CPUMilli) })
		if !slices.EqualFunc(got, want, sameTask) {
			t.Errorf("%s: kept kinds other than the tasks' and the heaviest", tc.name)
		}
	}
	small := ExportedWorkload{Tasks: []ExportedTask{{CPUMilli: 1, GPUMilli: 1000, GPUCount: 1, Weight: 1}},
		Kinds:  []ExportedTask{{CPUMilli: 1, GPUMilli: 1000, GPUCount: 1, Weight: 2}, {CPUMilli: 2, GPUMilli: 1000, GPUCount: 1, Weight: 1}},
		Recent: []string{"a", "b"}}
	small.Trim(16 << 10)
	if len(small.Recent) != 2 || len(small.Kinds) != 2 || small.Trimmed {
		t.Error("an export under the budget trimmed")
	}

	a := ExportedWorkload{Tasks: []ExportedTask{{CPUMilli: 1000, GPUMilli: 1000, GPUCount: 1, Weight: 0.6}, {CPUMilli: 1000, GPUMilli: 500, GPUCount: 1, Weight: 0.4}}}
	b2 := ExportedWorkload{Tasks: slices.Clone(a.Tasks)}
	b2.Tasks[0].Weight, b2.Tasks[1].Weight = 0.605, 0.395
	if !a.SimilarTasks(b2) || a.SameTasks(b2) {
		t.Error("weights within a hundredth: similar, not the same")
	}
	b2.Tasks[0].Weight, b2.Tasks[1].Weight = 0.62, 0.38
	if a.SimilarTasks(b2) {
		t.Error("weights two hundredths apart: similar")
	}
	b2.Tasks = b2.Tasks[:1]
	if a.SimilarTasks(b2) {
		t.Error("another set of kinds: similar")
	}
}
