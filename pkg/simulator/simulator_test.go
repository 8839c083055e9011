package simulator

import (
	"context"
	"encoding/csv"
	"fmt"
	"math"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
)

// Worked by hand: capacity 4000 milli (4 GPUs).
//
//	event  arrived  allocated  arrive%=round(100A/C)  alloc%=round(100U/C,2)
//	  1      1000      1000          25                  25.00
//	  2      1000      1000          25   (CPU pod)      25.00
//	  3      2000      1500          50                  37.50
//	  4      2020      1500          50 (50.5 rounds to even 50)  37.50
//	  5      2060      2060          52 (51.5 rounds to even 52)  51.50
//
// Column 25: mean(25, 25) = 25. Column 50: mean(37.5, 37.5) = 37.5. Column
// 51 has no event: events with arrive% in 50..52 → mean(37.5,37.5,51.5) =
// 42.17 (42.1666…). Column 52: 51.5. Column 24: events 23..25 → 25. Column 0:
// nothing in -1..1 → NaN.
func TestDiscretizeHandWorked(t *testing.T) {
	events := []Event{{1000, 1000}, {1000, 1000}, {2000, 1500}, {2020, 1500}, {2060, 2060}}
	c := Discretize(events, 4000)
	want := map[int]float64{24: 25, 25: 25, 26: 25, 50: 37.5, 51: 42.17, 52: 51.5, 53: 51.5}
	for k, v := range want {
		if c[k] != v {
			t.Errorf("column %d: want %v, got %v", k, v, c[k])
		}
	}
	for _, k := range []int{0, 1, 30, 130} {
		if !math.IsNaN(c[k]) {
			t.Errorf("column %d: want NaN, got %v", k, c[k])
		}
	}
}

func TestRound2(t *testing.T) {
	for in, want := range map[float64]float64{95.29456: 95.29, 95.295: 95.3, 0.125: 0.12, 0.135: 0.14, 42.166666: 42.17, 100: 100, 2.675: 2.67} {
		// 95.295 is 95.2950000000000017… in binary: rounds up; 0.125 is an
		// exact tie: to even; 2.675 is 2.67499999999999982….
		if got := round2(in); got != want {
			t.Errorf("round2(%v) = %v, want %v", in, got, want)
		}
	}
	// numpy scales first: 2.675 × 100 is 267.5, a tie, to even.
	for in, want := range map[float64]float64{2.675: 2.68, 0.125: 0.12, 42.166666: 42.17} {
		if got := npRound2(in); got != want {
			t.Errorf("npRound2(%v) = %v, want %v", in, got, want)
		}
	}
}

// TestDiscretizeRoundsAsTheAnalysis: each event is rounded by Python's
// round, from the float's exact value (0.025 is 0.0250000000000000013…:
// 0.03), the column's mean by numpy's, which scales first (0.015 × 100 is
// 1.5, a tie, to even: 0.02, where Python's round gives 0.01).
func TestDiscretizeRoundsAsTheAnalysis(t *testing.T) {
	// 4 GPUs: an event's percentage is its milli / 40.
	if c := Discretize([]Event{{Arrived: 1, Allocated: 1}}, 4000); c[0] != 0.03 {
		t.Errorf("one event at 0.025%%: column 0 = %v, want 0.03 (Python's round of the event)", c[0])
	}
	if c := Discretize([]Event{{Arrived: 1, Allocated: 0}, {Arrived: 1, Allocated: 1}}, 4000); c[0] != 0.02 {
		t.Errorf("events at 0 and 0.03: column 0 = %v, want 0.02 (numpy's round of the mean 0.015)", c[0])
	}
}

func TestMeanSD(t *testing.T) {
	s := MeanSD([]float64{1, 2, 3, 4, math.NaN()})
	if s.Mean != 2.5 || math.Abs(s.SD-1.2909944) > 1e-6 || s.N != 4 {
		t.Errorf("%+v", s)
	}
}

// smallTrace writes a generated trace in the openb format.
func smallTrace(t *testing.T, nodes, pods int, seed int64) string {
	t.Helper()
	dir := t.TempDir()
	rng := rand.New(rand.NewSource(seed))
	var b strings.Builder
	b.WriteString("sn,cpu_milli,memory_mib,gpu,model\n")
	for i := 0; i < nodes; i++ {
		g := []int{1, 2, 4, 8}[rng.Intn(4)]
		model := []string{"T4", "V100M16", "G2"}[rng.Intn(3)]
		fmt.Fprintf(&b, "node-%03d,%d,%d,%d,%s\n", i, 32000+rng.Intn(64000), 262144, g, model)
	}
	os.WriteFile(filepath.Join(dir, NodeFile), []byte(b.String()), 0o644)
	b.Reset()
	b.WriteString("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n")
	for i := 0; i < pods; i++ {
		var k, m int
		spec := ""
		switch x := rng.Intn(10); {
		case x < 2: // CPU-only
		case x < 6:
			k, m = 1, []int{200, 250, 500, 810}[rng.Intn(4)]
		case x < 9:
			k, m = 1, 1000
		default:
			k, m = []int{2, 4}[rng.Intn(2)], 1000
		}
		if k > 0 && rng.Intn(8) == 0 {
			spec = "T4|G2"
		}
		fmt.Fprintf(&b, "pod-%04d,%d,%d,%d,%d,%s,LS,Running,0,0,0\n", i, 1000+rng.Intn(8000), 4096, k, m, spec)
	}
	os.WriteFile(filepath.Join(dir, PodFile("small")), []byte(b.String()), 0o644)
	return dir
}

func TestLoadAndConvert(t *testing.T) {
	dir := smallTrace(t, 10, 50, 1)
	tr, err := Load(dir, "small")
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Nodes) != 10 || len(tr.Pods) != 50 {
		t.Fatalf("loaded %d nodes, %d pods", len(tr.Nodes), len(tr.Pods))
	}
	for i, p := range tr.Pods {
		obj := PodObject(p, i, gpu.SchedulerName)
		r, err := gpu.ParseRequest(obj, gpu.DefaultRequestOptions)
		if err != nil {
			t.Fatalf("%s: our API refuses the converted pod: %v", p.Name, err)
		}
		if got := r.TotalMilli(); got != p.GPURequest() {
			t.Errorf("%s: request %d milli, trace %d", p.Name, got, p.GPURequest())
		}
		if len(p.Models) > 0 && strings.Join(r.Models.Exact, "|") != "T4|G2" {
			t.Errorf("%s: models %v", p.Name, r.Models)
		}
		v := VanillaPodObject(p, i)
		if vr, _ := gpu.ParseRequest(v, gpu.DefaultRequestOptions); p.NumGPU > 0 && vr.Count != int32(p.NumGPU) {
			t.Errorf("%s: vanilla pod asks %d whole GPUs, want %d", p.Name, vr.Count, p.NumGPU)
		}
	}
	n := NodeObject(tr.Nodes[0])
	inv := gpu.ReadInventory(n, gpu.DefaultNodeOptions)
	if int(inv.Count) != tr.Nodes[0].GPUs || inv.Model != tr.Nodes[0].Model {
		t.Errorf("node inventory %+v from %+v", inv, tr.Nodes[0])
	}
}

func TestArrival(t *testing.T) {
	dir := smallTrace(t, 20, 60, 2)
	tr, _ := Load(dir, "small")
	if r := tr.Capacity(); totalRequest(tr) >= r {
		t.Fatalf("the generated trace must ask for less than its capacity to tune up")
	}
	a, err := NewArrival(tr, 42, 1.3)
	if err != nil {
		t.Fatal(err)
	}
	if a.Requested > a.Target {
		t.Errorf("tuned up past the target: %d > %d", a.Requested, a.Target)
	}
	// The last clone that did not fit stopped the loop: another per-device
	// share would pass the target.
	if a.Originals != 60 || len(a.Pods) <= 60 {
		t.Fatalf("tune up: %d originals of %d pods", a.Originals, len(a.Pods))
	}
	for _, p := range a.Pods[60:] {
		if !strings.Contains(p.Name, "-tuned-") {
			t.Fatalf("clones come after the originals: %s", p.Name)
		}
	}
	b, _ := NewArrival(tr, 42, 1.3)
	if diff := cmp.Diff(a, b); diff != "" {
		t.Errorf("same seed, different arrival:\n%s", diff)
	}
	c, _ := NewArrival(tr, 43, 1.3)
	if cmp.Equal(a.Pods, c.Pods) {
		t.Errorf("different seeds, same arrival")
	}
	// Tune down below the trace's own request.
	d, _ := NewArrival(tr, 42, 0.3)
	if d.Requested > d.Target || len(d.Pods) >= 60 || d.Originals != len(d.Pods) {
		t.Errorf("tune down: %d pods, %d/%d", len(d.Pods), d.Requested, d.Target)
	}
}

func totalRequest(tr *Trace) int64 {
	var s int64
	for i := range tr.Pods {
		s += tr.Pods[i].GPURequest()
	}
	return s
}

// A replay is deterministic for a seed, and its metric is consistent with
// the pods it bound: the final allocation is what bound pods asked for.
func TestReplayDeterministic(t *testing.T) {
	dir := smallTrace(t, 12, 120, 3)
	tr, _ := Load(dir, "small")
	ctx := context.Background()
	for _, p := range []Policy{Learned, FGD, Vanilla, DRAFirstFit, DRABestFit} {
		r1, err := Run(ctx, Experiment{Trace: tr, Policy: p, Seed: 42, Tune: 1.3})
		if err != nil {
			t.Fatal(err)
		}
		r2, err := Run(ctx, Experiment{Trace: tr, Policy: p, Seed: 42, Tune: 1.3})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(r1.Curve, r2.Curve, cmpopts.EquateNaNs()); diff != "" {
			t.Errorf("%s: not deterministic:\n%s", p, diff)
		}
		if r1.Bound+r1.Failed != r1.Pods || r1.Failed == 0 {
			t.Errorf("%s: %d bound + %d failed of %d pods (130%% must overflow)", p, r1.Bound, r1.Failed, r1.Pods)
		}
		last := r1.Events[len(r1.Events)-1]
		if last.Allocated > r1.Capacity || last.Allocated != r1.FinalAllocated {
			t.Errorf("%s: allocated %d of %d", p, last.Allocated, r1.Capacity)
		}
		if math.IsNaN(r1.Curve[100]) || r1.Curve[100] > 100 {
			t.Errorf("%s: @100 = %v", p, r1.Curve[100])
		}
	}
}

// The DRA-modelled fleet: each pod's devices are the allocator's first fit,
// in the slices' order (the lowest device with room) or in ours (the one
// with room and the least free: best fit); whole GPUs the lowest free ones.
// Checked placement by placement against the devices' free milli, replayed.
func TestDRAAllocators(t *testing.T) {
	// One 4-GPU node and shares that can leave a lower device freer than
	// a higher one (200, then 810 on the next): there the two part.
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, NodeFile), []byte("sn,cpu_milli,memory_mib,gpu,model\nnode-0,96000,262144,4,T4\n"), 0o644)
	var b strings.Builder
	b.WriteString("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n")
	for i := 0; i < 40; i++ {
		fmt.Fprintf(&b, "pod-%04d,1000,1024,1,%d,,LS,Running,0,0,0\n", i, []int{200, 810, 150, 500, 300}[i%5])
	}
	os.WriteFile(filepath.Join(dir, PodFile("small")), []byte(b.String()), 0o644)
	tr, err := Load(dir, "small")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	parted := 0
	for seed := int64(42); seed < 62; seed++ {
		chosen := map[Policy][]string{}
		for _, p := range []Policy{DRAFirstFit, DRABestFit} {
			r, err := Run(ctx, Experiment{Trace: tr, Policy: p, Seed: seed, Tune: 1.3, KeepPlacements: true})
			if err != nil {
				t.Fatal(err)
			}
			free := []int{1000, 1000, 1000, 1000}
			slices.SortFunc(r.Placements, func(a, b Placement) int { return a.Arrival - b.Arrival })
			for _, pl := range r.Placements {
				best := -1
				for i, v := range free {
					if v < pl.Milli {
						continue
					}
					if best < 0 || p == DRABestFit && v < free[best] {
						best = i
					}
					if p == DRAFirstFit {
						break
					}
				}
				if !slices.Equal(pl.Devices, []int{best}) {
					t.Fatalf("%s seed %d: %s (%dm) on devices %v, free %v: want [%d]", p, seed, pl.Pod, pl.Milli, pl.Devices, free, best)
				}
				free[best] -= pl.Milli
				chosen[p] = append(chosen[p], fmt.Sprint(pl.Pod, pl.Devices))
			}
		}
		if !slices.Equal(chosen[DRAFirstFit], chosen[DRABestFit]) {
			parted++
		}
	}
	if parted == 0 {
		t.Error("first fit in the slices' order and in ours placed every pod alike on every seed")
	}
	t.Logf("the two parted on %d of 20 seeds", parted)
}

// The trace ships with the repository, compressed, and loads as the
// published experiments use it: 1213 GPU nodes with 6212 GPUs, the 17
// workloads of the grid, and the published curves.
func TestShippedTrace(t *testing.T) {
	dir := filepath.Join("..", "..", DefaultTraceDir)
	tr, err := Load(dir, "default")
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Nodes) != 1213 || tr.Capacity() != 6212000 || len(tr.Pods) != 8152 {
		t.Errorf("default: %d nodes, %d milli-GPU, %d pods", len(tr.Nodes), tr.Capacity(), len(tr.Pods))
	}
	ws, err := Workloads(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range PaperGrid {
		if !slices.Contains(ws, w) {
			t.Errorf("workload %s is missing", w)
		}
	}
	pub, err := LoadPublished(filepath.Join(dir, PublishedFile))
	if err != nil || len(pub["default"]["FGD"]) == 0 {
		t.Errorf("published results: %v", err)
	}
}

// The arrival is the original simulator's, draw for draw. The figures are
// from its own log, built and run here at its commit 8f3d641 (default, tune
// 1.3, seed 42, FGD): the first pods it creates, and nodes it names as
// renamed ("pod(...) is scheduled to node(0037-openb-node-1080)"). Without
// the ten draws of its informers the pods agree and every rank differs.
func TestArrivalMatchesOriginal(t *testing.T) {
	tr, err := Load(filepath.Join("..", "..", DefaultTraceDir), "default")
	if err != nil {
		t.Fatal(err)
	}
	a, err := NewArrival(tr, 42, 1.3)
	if err != nil {
		t.Fatal(err)
	}
	wantPods := []string{"openb-pod-0255", "openb-pod-1685", "openb-pod-6784", "openb-pod-4463", "openb-pod-0602",
		"openb-pod-1564", "openb-pod-3882", "openb-pod-7257", "openb-pod-6545", "openb-pod-1541"}
	var gotPods []string
	for _, p := range a.Pods[:len(wantPods)] {
		gotPods = append(gotPods, p.Name)
	}
	if diff := cmp.Diff(wantPods, gotPods); diff != "" {
		t.Errorf("first pods (-original +ours):\n%s", diff)
	}
	if len(a.Pods) != 10866 {
		t.Errorf("%d pods, the original creates 10866", len(a.Pods))
	}
	// Rank → node, as the original renamed them.
	wantNodes := map[int]string{0: "openb-node-0260", 1: "openb-node-0858", 2: "openb-node-0619", 37: "openb-node-1080",
		45: "openb-node-0141", 100: "openb-node-0980", 200: "openb-node-0330", 300: "openb-node-0576",
		400: "openb-node-1107", 500: "openb-node-1124", 600: "openb-node-1162", 700: "openb-node-0116",
		848: "openb-node-0767", 1140: "openb-node-1140"}
	for rank, name := range wantNodes {
		if got, want := a.Nodes[rank].Name, fmt.Sprintf("%04d-%s", rank, name); got != want {
			t.Errorf("rank %d: %s, the original's is %s", rank, got, want)
		}
	}
}

// The published means are numpy sums: ten 0.1s make 1 there (eight partial
// sums, then the rest), 0.9999999999999999 added in order.
func TestPairwiseSumIsNumpys(t *testing.T) {
	a := make([]float64, 10)
	for i := range a {
		a[i] = 0.1
	}
	var seq float64
	for _, v := range a {
		seq += v
	}
	if got := pairwiseSum(a); got != 1 || seq == 1 {
		t.Errorf("pairwise %v, in order %v", got, seq)
	}
	// Eight values take the block path: ((B+64)+(64+64)) + ((64+64)+(64+64))
	// keeps 256 of the seven 64s next to B = 2^60 (whose ulp is 256), in
	// order they are all lost.
	const big = 1 << 60
	eight := []float64{big, 64, 64, 64, 64, 64, 64, 64}
	if got := pairwiseSum(eight); got != big+256 {
		t.Errorf("eight values: %v, want 2^60+256", got)
	}
	// Past 128 the halves split at a multiple of 8: 136 values split at 64,
	// so the four 64s at 64..67 meet −B at 68 in the second half's partial
	// sums and survive (256); split at 68 they would be added to B and lost.
	long := make([]float64, 136)
	long[0], long[68] = big, -big
	for i := 64; i < 68; i++ {
		long[i] = 64
	}
	if got := pairwiseSum(long); got != 256 {
		t.Errorf("136 values: %v, want 256", got)
	}
}

// The original's arithmetic scores what its own replay scored. The two
// nodes are from the original built here and instrumented (default, seed
// 42, the 3,975th pod, openb-pod-3051, CPU only, 15.4 CPUs): both keep F
// unchanged, yet it scored 0305-openb-node-0484 49 and 0306-openb-node-0793
// 50, because moving the CPU-only tasks from "satisfied" to "lack CPU"
// changes its float sum of F; so it placed the pod on the second. The
// shipped arithmetic scores both 50.
func TestReferenceArithmeticMatchesOriginal(t *testing.T) {
	tr, err := Load(filepath.Join("..", "..", DefaultTraceDir), "default")
	if err != nil {
		t.Fatal(err)
	}
	var tasks []gpu.Task
	for _, tk := range TraceTasks(tr, 0.95) {
		tasks = append(tasks, gpu.Task{CPU: tk.CPUMilli, Memory: tk.MemoryMiB, Milli: tk.GPUMilli, Count: tk.GPUCount,
			Models: gpu.ModelSelector{Exact: tk.Models}, Weight: float64(tk.Weight)})
	}
	ref, err := gpu.NewReferenceWorkload(tasks, int64(len(tr.Pods)))
	if err != nil {
		t.Fatal(err)
	}
	node := func(model string, cpuFree int64, free ...int32) *gpu.NodeState {
		s := gpu.NewNodeState("n", gpu.Inventory{Count: int32(len(free)), Model: model, ModelFold: strings.ToUpper(model)}, cpuFree)
		copy(s.Free[:], free)
		return s
	}
	pod := &gpu.Request{CPU: 15400}
	sc := gpu.Scoring{Policy: gpu.Fragmentation, NodePriority: true, ReferenceOrder: true}
	for _, c := range []struct {
		name       string
		s          *gpu.NodeState
		original   int64
		arithmetic bool
	}{
		{"0305 as the original", node("G2", 24992, 190, 0, 190, 0, 0, 0, 190, 190), 49, true},
		{"0306 as the original", node("G2", 19930, 60, 0, 0, 0, 0, 0, 190, 0), 50, true},
		{"0305 as shipped", node("G2", 24992, 190, 0, 190, 0, 0, 0, 190, 190), 50, false},
		// The other nodes it scored for the same pod, F growing.
		{"0237", node("V100M16", 19848, 160, 1000, 1000, 1000), 16, true},
		{"0146", node("V100M16", 24900, 0, 0, 0, 1000, 1000, 1000, 1000, 1000), 8, true},
		{"0002", node("G2", 24848, 0, 190, 1000, 1000, 1000, 1000, 1000, 1000), 5, true},
		{"0144", node("G2", 18876, 0, 0, 0, 60, 0, 1000, 1000, 1000), 12, true},
		{"0312", node("T4", 82190, 0, 0), 50, true},
		{"0314", node("T4", 78700, 0, 70), 50, true},
		{"0308", node("T4", 40000, 60, 0), 50, true},
	} {
		sc.ReferenceArithmetic = c.arithmetic
		_, key, ok := sc.Evaluate(c.s, pod, ref)
		// The key is (score − the CPU-only offset) << 37 plus the node order.
		if got := key>>37 + 1<<24; !ok || got != c.original {
			t.Errorf("%s: score %d, want %d", c.name, got, c.original)
		}
	}
}

// TestFGDPureReproducesPublished replays default, seed 42, with fgd-pure and
// the original's tie order, and compares the whole curve with the published
// 06-FGD row (to 2 decimals, as published). About 20 s.
func TestFGDPureReproducesPublished(t *testing.T) {
	if testing.Short() {
		t.Skip("a whole replay of the shipped trace")
	}
	dir := filepath.Join("..", "..", DefaultTraceDir)
	f, err := Open(filepath.Join(dir, PublishedFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, r := range recs[1:] {
		if r[0] == "openb_pod_list_default" && r[1] == "06-FGD" && r[2] == "1.3" && r[3] == "42" {
			want = r[5:]
		}
	}
	if len(want) != Columns {
		t.Fatalf("published row: %d columns, want %d", len(want), Columns)
	}
	tr, err := Load(dir, "default")
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(context.Background(), Experiment{Trace: tr, Policy: FGDPure, Seed: 42, Tune: 1.3, Parallelism: 2, TieOrder: TieReference})
	if err != nil {
		t.Fatal(err)
	}
	differ := 0
	for k, w := range want {
		got := strconv.FormatFloat(res.Curve[k], 'f', 2, 64)
		if v, err := strconv.ParseFloat(w, 64); err != nil || strconv.FormatFloat(v, 'f', 2, 64) != got {
			if differ++; differ <= 5 {
				t.Errorf("column %d: %s, published %s", k, got, w)
			}
		}
	}
	if differ > 0 {
		t.Errorf("%d of %d columns differ from the published row", differ, Columns)
	}
}

// TestProfileLearnedAblations: each ablation of learned differs from it in
// its one setting alone.
func TestProfileLearnedAblations(t *testing.T) {
	tr, err := Load(smallTrace(t, 10, 50, 1), "small")
	if err != nil {
		t.Fatal(err)
	}
	scoreArgs := func(p Policy) config.GPUScoreArgs {
		prof, err := Profile(p, tr, TieHash)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		for _, pc := range prof.PluginConfig {
			if a, ok := pc.Args.(*config.GPUScoreArgs); ok {
				return *a
			}
		}
		t.Fatalf("%s: no GPUScore args", p)
		return config.GPUScoreArgs{}
	}
	learned := scoreArgs(Learned)
	for p, undo := range map[Policy]func(*config.GPUScoreArgs) bool{
		LearnedIdle: func(a *config.GPUScoreArgs) bool {
			was := a.Scoring.LeastIdleTieBreak && !learned.Scoring.LeastIdleTieBreak
			a.Scoring.LeastIdleTieBreak = learned.Scoring.LeastIdleTieBreak
			return was
		},
		LearnedNoDecay: func(a *config.GPUScoreArgs) bool {
			was := a.TargetWorkload.HalfLifePods == 0 && learned.TargetWorkload.HalfLifePods > 0
			a.TargetWorkload.HalfLifePods = learned.TargetWorkload.HalfLifePods
			return was
		},
		LearnedBucketCPU: func(a *config.GPUScoreArgs) bool {
			was := a.TargetWorkload.BucketCPU && !learned.TargetWorkload.BucketCPU
			a.TargetWorkload.BucketCPU = learned.TargetWorkload.BucketCPU
			return was
		},
		LearnedNoStrand: func(a *config.GPUScoreArgs) bool {
			was := a.Scoring.StrandedGPUWeightPercent == 0 && learned.Scoring.StrandedGPUWeightPercent > 0
			a.Scoring.StrandedGPUWeightPercent = learned.Scoring.StrandedGPUWeightPercent
			return was
		},
		LearnedNoScarce: func(a *config.GPUScoreArgs) bool {
			was := a.Scoring.ModelScarcityWeightPercent == 0 && learned.Scoring.ModelScarcityWeightPercent > 0
			a.Scoring.ModelScarcityWeightPercent = learned.Scoring.ModelScarcityWeightPercent
			return was
		},
	} {
		got := scoreArgs(p)
		if !undo(&got) {
			t.Errorf("%s: its setting is not changed from learned's", p)
		}
		if d := cmp.Diff(learned, got); d != "" {
			t.Errorf("%s differs from learned beyond its setting (-learned +%s):\n%s", p, p, d)
		}
	}
}

// TestProfileReferenceArithmetic: only fgd-pure with the original's tie order
// computes in the original's arithmetic, with the trace's pod count.
func TestProfileReferenceArithmetic(t *testing.T) {
	tr, err := Load(smallTrace(t, 10, 50, 1), "small")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		p    Policy
		tie  string
		want bool
	}{
		{FGDPure, TieReference, true}, {FGDPure, TieHash, false}, {FGDPure, "", false},
		{FGD, TieReference, false}, {FGDPaper, TieReference, false}, {Learned, TieReference, false}, {LearnedXDev, TieReference, false},
	} {
		prof, err := Profile(tc.p, tr, tc.tie)
		if err != nil {
			t.Fatalf("%s/%s: %v", tc.p, tc.tie, err)
		}
		var args *config.GPUScoreArgs
		for _, pc := range prof.PluginConfig {
			if a, ok := pc.Args.(*config.GPUScoreArgs); ok {
				args = a
			}
		}
		if args == nil {
			t.Fatalf("%s/%s: no GPUScore args", tc.p, tc.tie)
		}
		if got := args.Scoring.ReferenceArithmetic; got != tc.want {
			t.Errorf("%s/%s: ReferenceArithmetic %v, want %v", tc.p, tc.tie, got, tc.want)
		}
		if wantPods := map[bool]int64{true: int64(len(tr.Pods))}[tc.want]; args.TargetWorkload.ReferenceTracePods != wantPods {
			t.Errorf("%s/%s: ReferenceTracePods %d, want %d", tc.p, tc.tie, args.TargetWorkload.ReferenceTracePods, wantPods)
		}
	}
}
