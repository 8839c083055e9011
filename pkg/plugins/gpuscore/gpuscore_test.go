package gpuscore_test

import (
	"context"
	"fmt"
	"math"
	"math/rand"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/defaultbinder"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/queuesort"
	st "k8s.io/kubernetes/pkg/scheduler/testing"
	tf "k8s.io/kubernetes/pkg/scheduler/testing/framework"
	"k8s.io/kubernetes/test/utils/ktesting"
	"k8s.io/utils/ptr"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config/scheme"
	configv1 "github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config/v1"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu/gputest"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/offline"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/plugins/gpufit"
	. "github.com/gpu-scheduler/gpu-scheduler/pkg/plugins/gpuscore"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/plugins/internal/shared"
)

const gpuRes = v1.ResourceName(gpu.ResourceNvidiaGPU)

func gpuNode(name, gpus string) *v1.Node {
	return st.MakeNode().Name(name).Capacity(map[v1.ResourceName]string{v1.ResourceCPU: "64", v1.ResourceMemory: "256Gi", gpuRes: gpus}).Obj()
}

func bound(name, node, assignment string) *v1.Pod {
	return gputest.BoundPod("default", name, node, assignment)
}

func sharedPod(name, milli string) *v1.Pod {
	return st.MakePod().Name(name).Namespace("default").UID(name).Req(map[v1.ResourceName]string{v1.ResourceCPU: "1"}).Annotation(gpu.AnnotationMilli, milli).Obj()
}

func whole(name, n string) *v1.Pod {
	return st.MakePod().Name(name).Namespace("default").UID(name).Req(map[v1.ResourceName]string{v1.ResourceCPU: "1", gpuRes: n}).Obj()
}

func staticArgs(policy gpu.Policy, tasks ...config.WorkloadTask) *config.GPUScoreArgs {
	a := scheme.DefaultGPUScoreArgs()
	a.Policy = string(policy)
	if len(tasks) > 0 {
		a.TargetWorkload.Mode = config.WorkloadStatic
		a.TargetWorkload.Tasks = tasks
	}
	return a
}

// newProfile runs GPUFit and GPUScore (weight 1) in a framework over the
// given cluster, scheduling with the offline driver.
func newProfile(t *testing.T, args *config.GPUScoreArgs, nodes []*v1.Node, pods []*v1.Pod) (framework.Framework, *offline.Cluster) {
	t.Helper()
	tCtx := ktesting.Init(t)
	cluster, err := offline.NewCluster(nodes, pods)
	if err != nil {
		t.Fatal(err)
	}
	fh, err := tf.NewFramework(tCtx, []tf.RegisterPluginFunc{
		tf.RegisterQueueSortPlugin(queuesort.Name, queuesort.New),
		tf.RegisterBindPlugin(defaultbinder.Name, defaultbinder.New),
		tf.RegisterPluginAsExtensions(gpufit.Name, func(ctx ctxT, _ runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
			// The scores are measured on accounting alone (no device agent).
			fit := scheme.DefaultGPUFitArgs()
			fit.AccountingOnlySharing = true
			return gpufit.New(ctx, fit, h)
		}, "PreFilter", "Filter", "Reserve", "PreBind"),
		tf.RegisterPluginAsExtensions(Name, func(ctx ctxT, _ runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
			return New(ctx, args, h)
		}, "PreScore", "Score"),
	}, "gpu-scheduler", frameworkOptions(cluster)...)
	if err != nil {
		t.Fatal(err)
	}
	return fh, cluster
}

func TestPolicies(t *testing.T) {
	nodes := []*v1.Node{
		st.MakeNode().Name("cpu").Capacity(map[v1.ResourceName]string{v1.ResourceCPU: "64"}).Obj(),
		gpuNode("idle8", "8"),
		gpuNode("half", "2"),
		gpuNode("busy", "4"),
	}
	pods := []*v1.Pod{
		bound("h0", "half", "half:0=500"),
		bound("b0", "busy", "busy:0=1000,1=1000,2=1000"),
		bound("b3", "busy", "busy:3=700"),
	}
	// An 8-GPU task makes breaking a whole 8-GPU node costly.
	wl := []config.WorkloadTask{{CPUMilli: 1000, GPUMilli: 300, GPUCount: 1, Weight: 1}, {CPUMilli: 1000, GPUMilli: 1000, GPUCount: 1, Weight: 1},
		{CPUMilli: 1000, GPUMilli: 1000, GPUCount: 8, Weight: 1}}
	tests := map[string]struct {
		args     *config.GPUScoreArgs
		pod      *v1.Pod
		wantNode string
	}{
		// The 300 share exactly fills busy's last device: no idle GPU left
		// there for typical tasks to miss.
		"fragmentation share":  {staticArgs(gpu.Fragmentation, wl...), sharedPod("p", "300"), "busy"},
		"packing share":        {staticArgs(gpu.Packing), sharedPod("p", "300"), "busy"},
		"best fit share":       {staticArgs(gpu.BestFit), sharedPod("p", "300"), "busy"},
		"spread share":         {staticArgs(gpu.Spread), sharedPod("p", "300"), "idle8"},
		"fragmentation whole":  {staticArgs(gpu.Fragmentation, wl...), whole("p", "1"), "half"},
		"packing whole":        {staticArgs(gpu.Packing), whole("p", "1"), "half"},
		"spread whole":         {staticArgs(gpu.Spread), whole("p", "1"), "idle8"},
		"cpu only, any policy": {staticArgs(gpu.Spread), st.MakePod().Name("c").UID("c").Req(map[v1.ResourceName]string{v1.ResourceCPU: "1"}).Obj(), "cpu"},
		"cpu only, fragmentation": {staticArgs(gpu.Fragmentation, wl...),
			st.MakePod().Name("c").UID("c").Req(map[v1.ResourceName]string{v1.ResourceCPU: "1"}).Obj(), "cpu"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tCtx := ktesting.Init(t)
			fh, cluster := newProfile(t, tc.args, nodes, pods)
			res := offline.Schedule(tCtx, fh, cluster, tc.pod)
			if res.Err != nil {
				t.Fatal(res.Err)
			}
			if res.Node != tc.wantNode {
				t.Errorf("want %s, got %s (scores %v)", tc.wantNode, res.Node, res.Scores)
			}
			best := 0
			for _, s := range res.Scores {
				if s.TotalScore < 0 || s.TotalScore > fwk.MaxNodeScore {
					t.Errorf("%s: score %d out of range", s.Name, s.TotalScore)
				}
				if s.TotalScore == fwk.MaxNodeScore {
					best++
				}
			}
			if best != 1 {
				t.Errorf("want one node at 100, got %v", res.Scores)
			}
		})
	}
}

func TestNormalizeByRank(t *testing.T) {
	scores := fwk.NodeScoreList{{Name: "a", Score: -5}, {Name: "b", Score: 1 << 40}, {Name: "c", Score: -5}, {Name: "d", Score: 7}}
	NormalizeByRank(scores)
	want := map[string]int64{"a": 98, "b": 100, "c": 98, "d": 99}
	for _, s := range scores {
		if s.Score != want[s.Name] {
			t.Errorf("%s: want %d, got %d", s.Name, want[s.Name], s.Score)
		}
	}
	var many fwk.NodeScoreList
	for i := 0; i < 300; i++ {
		many = append(many, fwk.NodeScore{Name: fmt.Sprint(i), Score: int64(i)})
	}
	NormalizeByRank(many)
	if many[0].Score != 0 || many[299].Score != 100 || many[200].Score != 1 {
		t.Errorf("rank floor: %v %v %v", many[0], many[200], many[299])
	}
}

// The device reserved is the device the score assumed: for shared pods under
// Fragmentation, one of the devices whose fragmentation growth is minimal,
// computed here by brute force from the definition.
func TestReserveTakesTheScoredDevice(t *testing.T) {
	tCtx := ktesting.Init(t)
	rng := rand.New(rand.NewSource(7))
	var nodes []*v1.Node
	for i := 0; i < 12; i++ {
		nodes = append(nodes, gpuNode(fmt.Sprintf("n%02d", i), fmt.Sprint(1+rng.Intn(8))))
	}
	tasks := []config.WorkloadTask{
		{CPUMilli: 2000, GPUMilli: 250, GPUCount: 1, Weight: 3},
		{CPUMilli: 4000, GPUMilli: 500, GPUCount: 1, Weight: 2},
		{CPUMilli: 8000, GPUMilli: 1000, GPUCount: 2, Weight: 1},
		{CPUMilli: 1000, Weight: 1},
	}
	args := staticArgs(gpu.Fragmentation, tasks...)
	wl, err := StaticWorkload(tasks)
	if err != nil {
		t.Fatal(err)
	}
	fh, cluster := newProfile(t, args, nodes, nil)
	client := fh.ClientSet()
	trk := sharedTracker(fh)
	checked := 0
	for i := 0; i < 120; i++ {
		var pod *v1.Pod
		if rng.Intn(3) > 0 {
			pod = sharedPod(fmt.Sprintf("p%d", i), fmt.Sprint(50*(1+rng.Intn(19))))
		} else {
			pod = whole(fmt.Sprintf("p%d", i), fmt.Sprint(1+rng.Intn(2)))
		}
		createPod(t, client, pod)
		res := offline.Schedule(tCtx, fh, cluster, pod)
		if res.Node == "" {
			continue
		}
		ni, _ := cluster.NodeInfos().Get(res.Node)
		before := sharedStateOf(fh, ni)
		req, _ := gpu.ParseRequest(pod, gpu.DefaultRequestOptions)
		if _, err := offline.Commit(tCtx, fh, cluster, pod, res, prebound(t, client)); err != nil {
			t.Fatal(err)
		}
		_, r, ok := trk.Reserved(pod.UID)
		if !ok {
			t.Fatalf("%s: no reservation", pod.Name)
		}
		if req.Shared() {
			bestDelta := math.Inf(1)
			deltas := map[int]float64{}
			for d := 0; d < int(before.Count); d++ {
				if before.Free[d] < req.Milli {
					continue
				}
				after := before.Clone()
				after.Free[d] -= req.Milli
				after.CPUFree -= req.CPU
				deltas[d] = wl.Frag(after) - wl.Frag(before.Clone())
				bestDelta = math.Min(bestDelta, deltas[d])
			}
			got := r.Choice.Devices()[0]
			if deltas[got] > bestDelta+1.0/64 {
				t.Fatalf("%s on %s: reserved device %d (ΔF %.2f) but device with ΔF %.2f exists (free %v)",
					pod.Name, res.Node, got, deltas[got], bestDelta, before.Free[:before.Count])
			}
			checked++
		}
		// No device is ever over-booked.
		after := sharedStateOf(fh, ni)
		if after.Overcommitted {
			t.Fatalf("%s overcommitted: %v", res.Node, after.Free[:after.Count])
		}
	}
	if checked < 30 {
		t.Errorf("only %d shared placements checked", checked)
	}
}

func TestNewValidatesArgs(t *testing.T) {
	tCtx := ktesting.Init(t)
	fh, _ := newProfile(t, scheme.DefaultGPUScoreArgs(), nil, nil)
	bad := scheme.DefaultGPUScoreArgs()
	bad.Policy = "Random"
	bad.TargetWorkload.Tasks = []config.WorkloadTask{{GPUMilli: 300, GPUCount: 2, Weight: 1}}
	_, err := New(tCtx, bad, fh)
	if err == nil {
		t.Fatal("want an error")
	}
	for _, want := range []string{`args.policy: Unsupported value: "Random"`, "args.targetWorkload.tasks: Forbidden: tasks are only used when mode is Static"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not contain %q", err, want)
		}
	}
	bad = scheme.DefaultGPUScoreArgs()
	bad.TargetWorkload.PublishTo = "gpu-scheduler"
	if _, err := New(tCtx, bad, fh); err == nil || !strings.Contains(err.Error(), "publishTo: Invalid value") {
		t.Errorf("publishTo without a namespace: %v", err)
	}
	for _, p := range []int32{-1, 1001} {
		bad = scheme.DefaultGPUScoreArgs()
		bad.Scoring.StrandedGPUWeightPercent = p
		if _, err := New(tCtx, bad, fh); err == nil || !strings.Contains(err.Error(), "strandedGPUWeightPercent: Invalid value") {
			t.Errorf("strandedGPUWeightPercent %d: %v", p, err)
		}
		bad = scheme.DefaultGPUScoreArgs()
		bad.Scoring.ModelScarcityWeightPercent = p
		if _, err := New(tCtx, bad, fh); err == nil || !strings.Contains(err.Error(), "modelScarcityWeightPercent: Invalid value") {
			t.Errorf("modelScarcityWeightPercent %d: %v", p, err)
		}
	}
	bad = staticArgs(gpu.Fragmentation, config.WorkloadTask{GPUMilli: 500, GPUCount: 1, Weight: 1})
	bad.TargetWorkload.PublishTo = "kube-system/gpu-scheduler"
	if _, err := New(tCtx, bad, fh); err == nil || !strings.Contains(err.Error(), "only a learned target is published") {
		t.Errorf("publishTo with a static target: %v", err)
	}
	bad = staticArgs(gpu.Fragmentation, config.WorkloadTask{GPUMilli: 300, GPUCount: 2, Weight: 1})
	if _, err := New(tCtx, bad, fh); err == nil || !strings.Contains(err.Error(), "must be 1 for a shared GPU task") {
		t.Errorf("got %v", err)
	}
	// The reference arithmetic (the simulator's only) is the published FGD's.
	task := config.WorkloadTask{GPUMilli: 500, GPUCount: 1, Weight: 1}
	for _, tc := range []struct {
		name string
		edit func(*config.GPUScoreArgs)
		want string
	}{
		{"ok", func(*config.GPUScoreArgs) {}, ""},
		{"no pod count", func(a *config.GPUScoreArgs) { a.TargetWorkload.ReferenceTracePods = 0 }, "needs a static target workload"},
		{"learned", func(a *config.GPUScoreArgs) {
			a.TargetWorkload = scheme.DefaultGPUScoreArgs().TargetWorkload
			a.TargetWorkload.ReferenceTracePods = 10
		}, "needs a static target workload"},
		{"memory-aware", func(a *config.GPUScoreArgs) { a.Scoring.MemoryAware = true }, "without memoryAware"},
		{"exact device", func(a *config.GPUScoreArgs) { a.Scoring.ExactDeviceChoice = true }, "without memoryAware"},
		{"best fit", func(a *config.GPUScoreArgs) { a.Policy = string(gpu.BestFit) }, "without memoryAware"},
		{"stranded GPU", func(a *config.GPUScoreArgs) { a.Scoring.StrandedGPUWeightPercent = 100 }, "strandedGPUWeightPercent"},
		{"model scarcity", func(a *config.GPUScoreArgs) { a.Scoring.ModelScarcityWeightPercent = 100 }, "modelScarcityWeightPercent"},
	} {
		a := staticArgs(gpu.Fragmentation, task)
		a.Scoring.MemoryAware = false
		a.Scoring.StrandedGPUWeightPercent = 0
		a.Scoring.ModelScarcityWeightPercent = 0
		a.Scoring.ReferenceArithmetic = true
		a.TargetWorkload.ReferenceTracePods = 10
		tc.edit(a)
		_, err := New(tCtx, a, fh)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: got %v, want %q", tc.name, err, tc.want)
		}
	}
}

// The versioned args reach the ranking: the defaults are gpu.DefaultScoring
// (the stranded-GPU and model-scarcity terms included), and each weight is
// kept as given, 0 included, through defaulting and conversion both ways.
func TestScoringWeightArgs(t *testing.T) {
	tCtx := ktesting.Init(t)
	fh, _ := newProfile(t, scheme.DefaultGPUScoreArgs(), nil, nil)
	build := func(args *config.GPUScoreArgs) gpu.Scoring {
		t.Helper()
		p, err := New(tCtx, args, fh)
		if err != nil {
			t.Fatal(err)
		}
		return ScoringOf(p.(*GPUScore))
	}
	if got := build(scheme.DefaultGPUScoreArgs()); got != gpu.DefaultScoring {
		t.Errorf("defaults give %+v, want gpu.DefaultScoring %+v", got, gpu.DefaultScoring)
	}
	for _, w := range []struct {
		name    string
		set     func(*configv1.ScoringOptions) **int32
		scoring func(gpu.Scoring) float64
	}{
		{"strandedGPUWeightPercent", func(o *configv1.ScoringOptions) **int32 { return &o.StrandedGPUWeightPercent },
			func(sc gpu.Scoring) float64 { return sc.Strand }},
		{"modelScarcityWeightPercent", func(o *configv1.ScoringOptions) **int32 { return &o.ModelScarcityWeightPercent },
			func(sc gpu.Scoring) float64 { return sc.Scarce }},
	} {
		for _, tc := range []struct {
			set  *int32
			want float64
		}{{nil, 1}, {ptr.To[int32](0), 0}, {ptr.To[int32](50), 0.5}, {ptr.To[int32](1000), 10}} {
			in := &configv1.GPUScoreArgs{Scoring: &configv1.ScoringOptions{}}
			*w.set(in.Scoring) = tc.set
			configv1.SetDefaults_GPUScoreArgs(in)
			var out config.GPUScoreArgs
			configv1.Convert_v1_GPUScoreArgs_To_config_GPUScoreArgs(in, &out)
			if got := w.scoring(build(&out)); got != tc.want {
				t.Errorf("%s %v: weight %v, want %v", w.name, ptr.Deref(tc.set, -1), got, tc.want)
			}
			var back configv1.GPUScoreArgs
			configv1.Convert_config_GPUScoreArgs_To_v1_GPUScoreArgs(&out, &back)
			cp := back.DeepCopyObject().(*configv1.GPUScoreArgs)
			**w.set(back.Scoring) = -7 // the copy must not share it
			if got := **w.set(cp.Scoring); float64(got) != tc.want*100 {
				t.Errorf("%s %v: %d after the round trip", w.name, ptr.Deref(tc.set, -1), got)
			}
		}
	}
}

// The model-scarcity term through the plugin: the fleet has 6 A GPUs (a
// full node among them) and 2 B GPUs, and as many of the target's pods may
// run only on A as only on B, so F ties the free A node and the B node. A
// pod that may run anywhere goes to A, whichever node name holds which
// model; without the term the node order decides, the same name both
// times.
func TestModelScarcity(t *testing.T) {
	tasks := []config.WorkloadTask{{CPUMilli: 1000, GPUMilli: 1000, GPUCount: 1, Weight: 2},
		{CPUMilli: 1000, GPUMilli: 1000, GPUCount: 1, Models: []string{"A"}, Weight: 1},
		{CPUMilli: 1000, GPUMilli: 1000, GPUCount: 1, Models: []string{"B"}, Weight: 1}}
	node := func(name, model, gpus string) *v1.Node {
		n := gpuNode(name, gpus)
		n.Labels = map[string]string{gpu.LabelGPUProduct: model}
		return n
	}
	full := bound("x", "full", "full:0=1000,1=1000,2=1000,3=1000")
	for _, weight := range []int32{100, 0} {
		chosen := map[string]string{} // model of node-1 -> node
		for _, models := range [][2]string{{"A", "B"}, {"B", "A"}} {
			nodes := []*v1.Node{node("node-1", models[0], "2"), node("node-2", models[1], "2"), node("full", "A", "4")}
			modelOf := map[string]string{"node-1": models[0], "node-2": models[1]}
			args := staticArgs(gpu.Fragmentation, tasks...)
			args.Scoring.ModelScarcityWeightPercent = weight
			tCtx := ktesting.Init(t)
			fh, cluster := newProfile(t, args, nodes, []*v1.Pod{full})
			res := offline.Schedule(tCtx, fh, cluster, whole("p", "1"))
			if res.Err != nil {
				t.Fatal(res.Err)
			}
			chosen[models[0]] = res.Node
			if weight > 0 && modelOf[res.Node] != "A" {
				t.Errorf("node-1 %s: an unrestricted pod went to %s (%s): %v", models[0], res.Node, modelOf[res.Node], res.Scores)
			}
		}
		if weight == 0 && chosen["A"] != chosen["B"] {
			t.Errorf("without the term: %v, want the node order (the same node both times)", chosen)
		}
	}
}

// A node's score does not depend on which other nodes the cycle scores:
// opportunistic batching runs PreScore over a cycle's cached candidates
// and one node to score again, and ranks that score against the cached
// ones. The pod's floor is the load of the least loaded model it allows
// (A), whichever nodes PreScore sees: with or without the A node that has
// room, and once the A nodes are full.
func TestModelScarcityScoreIndependentOfTheCycle(t *testing.T) {
	tasks := []config.WorkloadTask{{CPUMilli: 1000, GPUMilli: 1000, GPUCount: 1, Weight: 2},
		{CPUMilli: 1000, GPUMilli: 1000, GPUCount: 2, Models: []string{"B", "C"}, Weight: 1}}
	node := func(name, model, gpus string) *v1.Node {
		n := gpuNode(name, gpus)
		n.Labels = map[string]string{gpu.LabelGPUProduct: model}
		return n
	}
	nodes := []*v1.Node{node("full", "A", "8"), node("a", "A", "2"), node("b", "B", "2"), node("c", "C", "2")}
	pods := []*v1.Pod{bound("x", "full", "full:0=1000,1=1000,2=1000,3=1000,4=1000,5=1000,6=1000,7=1000"),
		bound("y", "b", "b:0=1000")}
	args := staticArgs(gpu.Fragmentation, tasks...)
	tCtx := ktesting.Init(t)
	fh, cluster := newProfile(t, args, nodes, pods)
	pl, err := New(tCtx, args, fh)
	if err != nil {
		t.Fatal(err)
	}
	sp := pl.(fwk.ScorePlugin)
	pod := whole("p", "1")
	var feasible []fwk.NodeInfo
	for _, ni := range cluster.Nodes() {
		if ni.Node().Name != "full" {
			feasible = append(feasible, ni)
		}
	}
	score := func(cycle []fwk.NodeInfo, ni fwk.NodeInfo) int64 {
		cs := framework.NewCycleState()
		if s := pl.(fwk.PreScorePlugin).PreScore(tCtx, cs, pod, cycle); !s.IsSuccess() {
			t.Fatal(s)
		}
		v, s := sp.Score(tCtx, cs, pod, ni)
		if !s.IsSuccess() {
			t.Fatal(s)
		}
		return v
	}
	for _, ni := range feasible {
		if ni.Node().Name == "a" {
			continue
		}
		all, alone := score(feasible, ni), score([]fwk.NodeInfo{ni}, ni)
		if all != alone {
			t.Errorf("%s: %d scored with every feasible node, %d alone", ni.Node().Name, all, alone)
		}
		off := staticArgs(gpu.Fragmentation, tasks...)
		off.Scoring.ModelScarcityWeightPercent = 0
		plOff, _ := New(tCtx, off, fh)
		cs := framework.NewCycleState()
		plOff.(fwk.PreScorePlugin).PreScore(tCtx, cs, pod, feasible)
		base, _ := plOff.(fwk.ScorePlugin).Score(tCtx, cs, pod, ni)
		if all >= base {
			t.Errorf("%s: a model more loaded than A costs nothing (%d with the term, %d without)", ni.Node().Name, all, base)
		}
	}
}

// The shared state of a profile goes with its framework's context: gpu-sim
// builds a framework per replay and must not keep them all.
func TestSharedStateReleased(t *testing.T) {
	tCtx := ktesting.Init(t)
	fh, _ := newProfile(t, scheme.DefaultGPUScoreArgs(), nil, nil)
	ctx, cancel := context.WithCancel(tCtx)
	if _, err := New(ctx, scheme.DefaultGPUScoreArgs(), fh); err != nil {
		t.Fatal(err)
	}
	before := sharedTracker(fh)
	if sharedTracker(fh) != before {
		t.Fatal("the state must persist while the context lives")
	}
	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for sharedTracker(fh) == before {
		if time.Now().After(deadline) {
			t.Fatal("the shared state outlived its framework's context")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// CPU-only pods are mostly scored from the node's accounting without its
// device state; the raw scores must be the ones the device state gives.
func TestCPUOnlyScoreWithoutDeviceState(t *testing.T) {
	nodes := []*v1.Node{
		st.MakeNode().Name("cpu").Capacity(map[v1.ResourceName]string{v1.ResourceCPU: "64", v1.ResourceMemory: "256Gi"}).Obj(),
		gpuNode("roomy", "8"),
		gpuNode("cpu-tight", "4"),
		gpuNode("mem-tight", "4"),
		gpuNode("busy", "4"),
	}
	filler := func(name, node, cpu, mem string) *v1.Pod {
		return st.MakePod().Name(name).Namespace("default").UID(name).Node(node).
			Req(map[v1.ResourceName]string{v1.ResourceCPU: cpu, v1.ResourceMemory: mem}).Obj()
	}
	pods := []*v1.Pod{
		filler("f1", "cpu-tight", "55", "1Gi"),  // 9 CPUs left: the pod leaves 7, too few for the GPU task
		filler("f2", "mem-tight", "1", "238Gi"), // 18Gi left: the pod leaves 14Gi, too little
		bound("b0", "busy", "busy:0=1000,1=1000"),
	}
	wl := []config.WorkloadTask{{CPUMilli: 8000, MemoryMiB: 16384, GPUMilli: 1000, GPUCount: 1, Weight: 1}, {CPUMilli: 1000, Weight: 1}}
	cpuPod := st.MakePod().Name("c").Namespace("default").UID("c").Req(map[v1.ResourceName]string{v1.ResourceCPU: "2", v1.ResourceMemory: "4Gi"}).Obj()
	nodeOrder := staticArgs(gpu.Fragmentation, wl...) // the quick path on GPU nodes
	nodeOrder.Scoring.CPUOnlyLeastIdleTieBreak = false
	for name, args := range map[string]*config.GPUScoreArgs{
		"fragmentation": staticArgs(gpu.Fragmentation, wl...),
		"node order":    nodeOrder,
		"learned":       staticArgs(gpu.Fragmentation),
		"best fit":      staticArgs(gpu.BestFit),
	} {
		t.Run(name, func(t *testing.T) {
			tCtx := ktesting.Init(t)
			fh, cluster := newProfile(t, args, nodes, pods)
			cs := framework.NewCycleState()
			if _, s, _ := fh.RunPreFilterPlugins(tCtx, cs, cpuPod); !s.IsSuccess() && !s.IsSkip() {
				t.Fatal(s)
			}
			if s := fh.RunPreScorePlugins(tCtx, cs, cpuPod, cluster.Nodes()); !s.IsSuccess() {
				t.Fatal(s)
			}
			r, _ := gpu.ParseRequest(cpuPod, gpu.DefaultRequestOptions)
			raw := map[string]int64{}
			for _, ni := range cluster.Nodes() {
				scores, s := fh.RunRawScorePlugins(tCtx, cs, cpuPod, ni)
				if !s.IsSuccess() || len(scores) != 1 {
					t.Fatal(s, scores)
				}
				_, want, _ := sharedScoring(fh).Evaluate(sharedStateOf(fh, ni), &r, sharedWorkload(fh))
				if got := scores[0].Score; got != want {
					t.Errorf("%s: score %d, from the device state %d", ni.Node().Name, got, want)
				}
				raw[ni.Node().Name] = scores[0].Score
			}
			// busy has 2 GPUs idle, roomy 8: both have CPU to spare.
			if args.Scoring.CPUOnlyLeastIdleTieBreak && raw["busy"] <= raw["roomy"] {
				t.Errorf("busy scores %d, roomy %d: want the least idle GPU node first", raw["busy"], raw["roomy"])
			}
		})
	}
}

// PreScore scores a CPU-only pod on all the cycle's nodes at once; each
// node's score must be the one Score computes for that node alone, and a
// NodeInfo changed since (a new generation) is scored again.
func TestCPUOnlyScoresMatchEachNode(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	var nodes []*v1.Node
	var pods []*v1.Pod
	for i := 0; i < 60; i++ {
		name := fmt.Sprintf("n%02d", i)
		switch i % 4 {
		case 0: // no GPUs
			nodes = append(nodes, st.MakeNode().Name(name).Capacity(map[v1.ResourceName]string{v1.ResourceCPU: "64", v1.ResourceMemory: "256Gi"}).Obj())
		default:
			nodes = append(nodes, gpuNode(name, "4"))
		}
		for j := 0; j < rng.Intn(4); j++ {
			pod := fmt.Sprintf("%s-%d", name, j)
			switch x := rng.Intn(3); {
			case x == 0 || i%4 == 0:
				pods = append(pods, st.MakePod().Name(pod).Namespace("default").UID(pod).Node(name).
					Req(map[v1.ResourceName]string{v1.ResourceCPU: fmt.Sprint(1 + rng.Intn(40)), v1.ResourceMemory: fmt.Sprintf("%dGi", 1+rng.Intn(200))}).Obj())
			case x == 1:
				pods = append(pods, bound(pod, name, fmt.Sprintf("%s:%d=1000", name, j)))
			default:
				pods = append(pods, bound(pod, name, fmt.Sprintf("%s:%d=%d", name, j, 100*(1+rng.Intn(9)))))
			}
		}
	}
	wl := []config.WorkloadTask{{CPUMilli: 8000, MemoryMiB: 16384, GPUMilli: 1000, GPUCount: 1, Weight: 1}, {CPUMilli: 4000, MemoryMiB: 8192, GPUMilli: 500, GPUCount: 1, Weight: 1}}
	cpuPod := st.MakePod().Name("c").Namespace("default").UID("c").Req(map[v1.ResourceName]string{v1.ResourceCPU: "6", v1.ResourceMemory: "20Gi"}).Obj()
	nodeOrder := staticArgs(gpu.Fragmentation, wl...)
	nodeOrder.Scoring.CPUOnlyLeastIdleTieBreak = false
	for name, args := range map[string]*config.GPUScoreArgs{
		"fragmentation": staticArgs(gpu.Fragmentation, wl...),
		"node order":    nodeOrder,
		"learned":       staticArgs(gpu.Fragmentation),
		"best fit":      staticArgs(gpu.BestFit),
		"spread":        staticArgs(gpu.Spread),
	} {
		t.Run(name, func(t *testing.T) {
			tCtx := ktesting.Init(t)
			fh, cluster := newProfile(t, args, nodes, pods)
			pre := func(nodes []fwk.NodeInfo) fwk.CycleState {
				cs := framework.NewCycleState()
				if _, s, _ := fh.RunPreFilterPlugins(tCtx, cs, cpuPod); !s.IsSuccess() && !s.IsSkip() {
					t.Fatal(s)
				}
				if s := fh.RunPreScorePlugins(tCtx, cs, cpuPod, nodes); !s.IsSuccess() {
					t.Fatal(s)
				}
				return cs
			}
			score := func(cs fwk.CycleState, ni fwk.NodeInfo) int64 {
				scores, s := fh.RunRawScorePlugins(tCtx, cs, cpuPod, ni)
				if !s.IsSuccess() || len(scores) != 1 {
					t.Fatal(s, scores)
				}
				return scores[0].Score
			}
			// Scored alone first: the states are then cached, and the
			// batch reads them through the NodeInfos' keys.
			each := pre(nil)
			want := map[string]int64{}
			for _, ni := range cluster.Nodes() {
				want[ni.Node().Name] = score(each, ni)
			}
			batch := pre(cluster.Nodes())
			distinct := map[int64]bool{}
			for _, ni := range cluster.Nodes() {
				if got, want := score(batch, ni), want[ni.Node().Name]; got != want {
					t.Errorf("%s: %d scored with the cycle's nodes, %d alone", ni.Node().Name, got, want)
				}
				distinct[want[ni.Node().Name]] = true
			}
			if len(distinct) < 3 {
				t.Errorf("only %d distinct scores over %d nodes: the cluster does not exercise the score", len(distinct), len(cluster.Nodes()))
			}
			// The cycle's lookups find every GPU node's state (and only the
			// node's), for its own NodeInfo only.
			sc, wl := sharedScoring(fh), sharedWorkload(fh)
			states := shared.For(fh).CPUOnlyStates(sc, cluster.Nodes(), wl)
			if !sc.CPUOnlyNeedsState(wl) {
				if states != nil {
					t.Error("states looked up for a policy that scores CPU-only pods without them")
				}
			} else {
				for _, ni := range cluster.Nodes() {
					hasGPU := len(ni.GetAllocatable().GetScalarResources()) > 0
					if got := states.Get(ni); (got == nil && hasGPU) || (got != nil && got != sharedStateOf(fh, ni)) {
						t.Errorf("%s: the cycle's state %p, the node's %p", ni.Node().Name, got, sharedStateOf(fh, ni))
					}
				}
				if other := framework.NewNodeInfo(); states.Get(other) != nil {
					t.Error("a NodeInfo not in the cycle got a state")
				}
			}
			// A NodeInfo that changed after PreScore is scored as it is now.
			ni := cluster.Nodes()[1]
			before := score(batch, ni)
			fill, err := framework.NewPodInfo(st.MakePod().Name("fill").Namespace("default").UID("fill").Node(ni.Node().Name).
				Req(map[v1.ResourceName]string{v1.ResourceCPU: "60"}).Obj())
			if err != nil {
				t.Fatal(err)
			}
			ni.(*framework.NodeInfo).AddPodInfo(fill)
			if states.Get(ni) != nil {
				t.Error("a NodeInfo changed after the lookups got the state found before")
			}
			if got, want := score(batch, ni), score(pre(nil), ni); got != want || (name == "fragmentation" && got == before) {
				t.Errorf("after the node changed: %d, alone %d (before the change %d)", got, want, before)
			}
		})
	}
}

// Score reads a CPU-only pod's score from PreScore's, without allocating.
func TestCPUOnlyScoreReadsTheCycles(t *testing.T) {
	tCtx := ktesting.Init(t)
	var nodes []*v1.Node
	for i := 0; i < 50; i++ {
		nodes = append(nodes, gpuNode(fmt.Sprintf("n%02d", i), "8"))
	}
	args := staticArgs(gpu.Fragmentation, config.WorkloadTask{CPUMilli: 8000, MemoryMiB: 16384, GPUMilli: 1000, GPUCount: 1, Weight: 1})
	fh, cluster := newProfile(t, args, nodes, nil)
	p, err := New(tCtx, args, fh)
	if err != nil {
		t.Fatal(err)
	}
	pl := p.(*GPUScore)
	pod := st.MakePod().Name("c").Namespace("default").UID("c").Req(map[v1.ResourceName]string{v1.ResourceCPU: "1"}).Obj()
	cs := framework.NewCycleState()
	if s := pl.PreScore(tCtx, cs, pod, cluster.Nodes()); !s.IsSuccess() {
		t.Fatal(s)
	}
	ni := cluster.Nodes()[3]
	want, _ := pl.Score(tCtx, cs, pod, ni)
	if allocs := testing.AllocsPerRun(100, func() {
		if got, s := pl.Score(tCtx, cs, pod, ni); got != want || !s.IsSuccess() {
			t.Fatal(got, s)
		}
	}); allocs != 0 {
		t.Errorf("%.1f allocations per Score, want 0", allocs)
	}
	// The framework's opportunistic batching runs PreScore over every cached
	// candidate and scores one node again: no lookups for the others (they
	// would allocate the cycle's table).
	rescore := func(nodes []fwk.NodeInfo) float64 {
		return testing.AllocsPerRun(20, func() {
			cs := framework.NewCycleState()
			pl.PreScore(tCtx, cs, pod, nodes)
			pl.Score(tCtx, cs, pod, ni)
		})
	}
	if raceEnabled {
		return
	}
	if with, without := rescore(cluster.Nodes()), rescore(nil); with != without {
		t.Errorf("PreScore over %d nodes and one Score: %.1f allocations, %.1f with no nodes given", len(cluster.Nodes()), with, without)
	}
}
