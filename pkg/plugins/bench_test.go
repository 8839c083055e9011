package plugins_test

import (
	"context"
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	plfeature "k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/noderesources"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	"k8s.io/kubernetes/pkg/scheduler/metrics"
	st "k8s.io/kubernetes/pkg/scheduler/testing"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config/scheme"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/plugins/gpufit"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/plugins/gpuscore"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/plugins/leastrequested"
)

// A node with 8 GPUs whose devices are all at different levels, so that a
// shared pod has 8 candidate devices to weigh (the worst case for the
// fragmentation score), and a target workload as large as openb's (35 kinds).
func benchNode() (*v1.Node, []*v1.Pod) {
	node := st.MakeNode().Name("gpu-8").Capacity(map[v1.ResourceName]string{
		v1.ResourceCPU: "96", v1.ResourceMemory: "384Gi", gpu.ResourceNvidiaGPU: "8"}).
		Label(gpu.LabelGPUProduct, "G2").Obj()
	var pods []*v1.Pod
	for d, used := range []int{0, 100, 230, 320, 470, 650, 810, 900} {
		if used == 0 {
			continue
		}
		p := st.MakePod().Name(fmt.Sprintf("used-%d", d)).UID(fmt.Sprintf("used-%d", d)).Namespace("default").Node("gpu-8").
			Req(map[v1.ResourceName]string{v1.ResourceCPU: "2", v1.ResourceMemory: "8Gi"}).
			Annotation(gpu.AnnotationMilli, fmt.Sprint(used)).
			Annotation(gpu.AnnotationAssignment, fmt.Sprintf("gpu-8:%d=%d", d, used)).Obj()
		pods = append(pods, p)
	}
	return node, pods
}

func benchWorkload() []config.WorkloadTask {
	var tasks []config.WorkloadTask
	millis := []int32{810, 470, 320, 650, 230, 500, 100, 900, 250, 750}
	for i := 0; i < 35; i++ {
		t := config.WorkloadTask{CPUMilli: int64(1000 * (1 + i%16)), Weight: int64(35 - i)}
		switch {
		case i%7 == 0:
			// CPU-only.
		case i%3 == 0:
			t.GPUMilli, t.GPUCount = 1000, int32(1<<(i%4))
		default:
			t.GPUMilli, t.GPUCount = millis[i%len(millis)], 1
		}
		tasks = append(tasks, t)
	}
	return tasks
}

var benchPods = map[string]*v1.Pod{
	"shared": st.MakePod().Name("p").UID("p").Namespace("default").Req(map[v1.ResourceName]string{v1.ResourceCPU: "4", v1.ResourceMemory: "16Gi"}).
		Annotation(gpu.AnnotationMilli, "200").Obj(),
	"whole": st.MakePod().Name("p").UID("p").Namespace("default").Req(map[v1.ResourceName]string{v1.ResourceCPU: "4", v1.ResourceMemory: "16Gi", gpu.ResourceNvidiaGPU: "1"}).Obj(),
	"cpu":   st.MakePod().Name("p").UID("p").Namespace("default").Req(map[v1.ResourceName]string{v1.ResourceCPU: "4", v1.ResourceMemory: "16Gi"}).Obj(),
}

type benchEnv struct {
	fit    fwk.FilterPlugin
	score  fwk.ScorePlugin
	least  fwk.ScorePlugin
	ni     fwk.NodeInfo
	handle fwk.Handle
	pre    func(context.Context, fwk.CycleState, *v1.Pod)
}

func newBenchEnv(b testing.TB, policy gpu.Policy) *benchEnv {
	node, pods := benchNode()
	return newEnvOn(b, policy, node, pods)
}

// handleOver is a framework handle over a snapshot, with a fake client.
func handleOver(b testing.TB, ctx context.Context, snapshot *cache.Snapshot) fwk.Handle {
	client := fake.NewClientset()
	fh, err := frameworkruntime.NewFramework(ctx, nil, nil,
		frameworkruntime.WithSnapshotSharedLister(snapshot),
		frameworkruntime.WithClientSet(client),
		frameworkruntime.WithInformerFactory(informers.NewSharedInformerFactory(client, 0)))
	if err != nil {
		b.Fatal(err)
	}
	return fh
}

// newEnvOn is newBenchEnv on a node and pods of the caller's.
func newEnvOn(b testing.TB, policy gpu.Policy, node *v1.Node, pods []*v1.Pod) *benchEnv {
	return newEnvWith(b, policy, node, pods, nil, benchWorkload(), nil)
}

// newEnvWith is newEnvOn with other nodes in the snapshot, a target
// workload of the caller's, and an edit of GPUScore's args.
func newEnvWith(b testing.TB, policy gpu.Policy, node *v1.Node, pods []*v1.Pod, others []*v1.Node, tasks []config.WorkloadTask, edit func(*config.GPUScoreArgs)) *benchEnv {
	metrics.Register()
	ctx := klog.NewContext(context.Background(), klog.Background())
	snapshot := cache.NewSnapshot(pods, append([]*v1.Node{node}, others...))
	fh := handleOver(b, ctx, snapshot)
	// The bench node runs no agent that delivers shares: place them by
	// accounting only, or Filter refuses the shared pod.
	fitArgs := scheme.DefaultGPUFitArgs()
	fitArgs.AccountingOnlySharing = true
	fitPl, err := gpufit.New(ctx, fitArgs, fh)
	if err != nil {
		b.Fatal(err)
	}
	args := scheme.DefaultGPUScoreArgs()
	args.Policy = string(policy)
	args.TargetWorkload.Mode = config.WorkloadStatic
	args.TargetWorkload.Tasks = tasks
	if edit != nil {
		edit(args)
	}
	scorePl, err := gpuscore.New(ctx, args, fh)
	if err != nil {
		b.Fatal(err)
	}
	leastPl, err := leastrequested.New(ctx, nil, fh)
	if err != nil {
		b.Fatal(err)
	}
	ni, _ := snapshot.Get(node.Name)
	e := &benchEnv{fit: fitPl.(fwk.FilterPlugin), score: scorePl.(fwk.ScorePlugin), least: leastPl.(fwk.ScorePlugin), ni: ni, handle: fh}
	e.pre = func(ctx context.Context, cs fwk.CycleState, pod *v1.Pod) {
		fitPl.(fwk.PreFilterPlugin).PreFilter(ctx, cs, pod, nil)
		scorePl.(fwk.PreScorePlugin).PreScore(ctx, cs, pod, nil)
		leastPl.(fwk.PreScorePlugin).PreScore(ctx, cs, pod, nil)
	}
	return e
}

// baselineFit is the in-tree NodeResourcesFit (LeastAllocated) on the bench
// node.
func baselineFit(b *testing.B, ctx context.Context) (fwk.Plugin, fwk.NodeInfo) {
	node, pods := benchNode()
	snapshot := cache.NewSnapshot(pods, []*v1.Node{node})
	fh, _ := frameworkruntime.NewFramework(ctx, nil, nil, frameworkruntime.WithSnapshotSharedLister(snapshot))
	fts := plfeature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate)
	fts.EnableDRAExtendedResource = false
	pl, err := noderesources.NewFit(ctx, &schedconfig.NodeResourcesFitArgs{ScoringStrategy: &schedconfig.ScoringStrategy{
		Type: schedconfig.LeastAllocated, Resources: []schedconfig.ResourceSpec{{Name: "cpu", Weight: 1}, {Name: "memory", Weight: 1}}}}, fh, fts)
	if err != nil {
		b.Fatal(err)
	}
	ni, _ := snapshot.Get("gpu-8")
	return pl, ni
}

// runBaseline measures the in-tree NodeResourcesFit Filter plus
// LeastAllocated Score on the same node and pod, in the same run, so that
// our cost prints as a ratio to it.
func runBaseline(b *testing.B, pod *v1.Pod) float64 {
	ctx := klog.NewContext(context.Background(), klog.Background())
	pl, ni := baselineFit(b, ctx)
	cs := framework.NewCycleState()
	pl.(fwk.PreFilterPlugin).PreFilter(ctx, cs, pod, nil)
	pl.(fwk.PreScorePlugin).PreScore(ctx, cs, pod, nil)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		pl.(fwk.FilterPlugin).Filter(ctx, cs, pod, ni)
		pl.(fwk.ScorePlugin).Score(ctx, cs, pod, ni)
	}
	b.StopTimer()
	return float64(b.Elapsed().Nanoseconds()) / float64(b.N)
}

// BenchmarkFilterScore is the per-node cost of our plugins for one pod:
// GPUFit Filter, GPUScore Score and LeastRequested Score, on a warm cache.
func BenchmarkFilterScore(b *testing.B) {
	base := map[string]float64{}
	for _, kind := range []string{"shared", "whole", "cpu"} {
		b.Run("baseline-NodeResourcesFit/"+kind, func(b *testing.B) { base[kind] = runBaseline(b, benchPods[kind]) })
	}
	for _, policy := range gpu.Policies {
		for _, kind := range []string{"shared", "whole", "cpu"} {
			b.Run(fmt.Sprintf("%s/%s", policy, kind), func(b *testing.B) {
				e := newBenchEnv(b, policy)
				ctx := klog.NewContext(context.Background(), klog.Background())
				pod := benchPods[kind]
				cs := framework.NewCycleState()
				e.pre(ctx, cs, pod)
				e.fit.Filter(ctx, cs, pod, e.ni) // warm the node's state
				e.score.Score(ctx, cs, pod, e.ni)
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if kind != "cpu" {
						if s := e.fit.Filter(ctx, cs, pod, e.ni); !s.IsSuccess() {
							b.Fatal(s)
						}
					}
					e.score.Score(ctx, cs, pod, e.ni)
					e.least.Score(ctx, cs, pod, e.ni)
				}
				b.StopTimer()
				ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
				if base[kind] > 0 {
					b.ReportMetric(ns/base[kind], "x-baseline")
				}
			})
		}
	}
}

// BenchmarkScoreOnly isolates GPUScore (the fragmentation score target is
// under 2 µs per node).
func BenchmarkScoreOnly(b *testing.B) {
	for _, kind := range []string{"shared", "whole", "cpu"} {
		b.Run(string(gpu.Fragmentation)+"/"+kind, func(b *testing.B) {
			timeScore(b, newBenchEnv(b, gpu.Fragmentation), benchPods[kind])
		})
	}
}

// timeScore runs GPUScore's Score on the env's node b.N times in one warm
// cycle and returns the time per call.
func timeScore(b *testing.B, e *benchEnv, pod *v1.Pod) float64 {
	ctx := klog.NewContext(context.Background(), klog.Background())
	cs := framework.NewCycleState()
	e.pre(ctx, cs, pod)
	e.score.Score(ctx, cs, pod, e.ni)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		e.score.Score(ctx, cs, pod, e.ni)
	}
	b.StopTimer()
	return float64(b.Elapsed().Nanoseconds()) / float64(b.N)
}

// BenchmarkScoreModelScarcity is GPUScore's Score when the target restricts
// GPU models, so that the model-scarcity term prices the node's model (a
// fleet of G2 and T4 nodes; every third GPU task only on T4), as a ratio to
// the same Score with the term off, in the same run.
func BenchmarkScoreModelScarcity(b *testing.B) {
	node, pods := benchNode()
	var others []*v1.Node
	for i := range 4 {
		others = append(others, st.MakeNode().Name(fmt.Sprint("t4-", i)).Capacity(map[v1.ResourceName]string{
			v1.ResourceCPU: "32", v1.ResourceMemory: "128Gi", gpu.ResourceNvidiaGPU: "4"}).Label(gpu.LabelGPUProduct, "T4").Obj())
	}
	tasks := benchWorkload()
	for i := range tasks {
		if tasks[i].GPUMilli > 0 && i%3 == 1 {
			tasks[i].Models = []string{"T4"}
		}
	}
	off := map[string]float64{}
	for _, weight := range []int32{0, 100} {
		for _, kind := range []string{"shared", "whole"} {
			b.Run(fmt.Sprintf("weight-%d/%s", weight, kind), func(b *testing.B) {
				e := newEnvWith(b, gpu.Fragmentation, node, pods, others, tasks, func(a *config.GPUScoreArgs) { a.Scoring.ModelScarcityWeightPercent = weight })
				ns := timeScore(b, e, benchPods[kind])
				if weight == 0 {
					off[kind] = ns
				} else if off[kind] > 0 {
					b.ReportMetric(ns/off[kind], "x-term-off")
				}
			})
		}
	}
}

// BenchmarkStateRebuild is the cost when a GPU pod on the node changed
// since the last cycle (a new object for one of them, each iteration): the
// device state is computed again from the node's pods. "cpu-pods" adds 40
// CPU-only pods, as on the GPU nodes CPU pods pile onto; they are neither
// parsed nor read again (a CPU pod's own change is BenchmarkNodeChange's).
func BenchmarkStateRebuild(b *testing.B) {
	node, pods := benchNode()
	withCPU := pods
	for i := 0; i < 40; i++ {
		withCPU = append(withCPU, cpuPodOn(fmt.Sprintf("cpu-%d", i), node.Name))
	}
	for name, pods := range map[string][]*v1.Pod{"gpu-pods": pods, "cpu-pods": withCPU} {
		b.Run(name, func(b *testing.B) {
			tr := gpu.NewTracker(gpu.DefaultNodeOptions)
			lists := [2][]*v1.Pod{pods, append([]*v1.Pod(nil), pods...)}
			lists[1][0] = pods[0].DeepCopy()
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				tr.Build(node, int64(i), lists[i%2], 96000, 1<<20)
			}
		})
	}
}

// BenchmarkPreemptionFilter is a step of the preemption dry run: a copy of
// the node with a victim removed (a new generation, so no cached device
// state), then Filter. GPUFit rebuilds the node's devices from its pods;
// the baseline is the in-tree NodeResourcesFit Filter on the same copy.
// "plan" is GPUPreemption's planning of the node's victims (once per node
// and preemptor).
func BenchmarkPreemptionFilter(b *testing.B) {
	ctx := klog.NewContext(context.Background(), klog.Background())
	var base float64
	pod := benchPods["whole"]
	run := func(b *testing.B, filter fwk.FilterPlugin, pre fwk.PreFilterPlugin, ni fwk.NodeInfo) float64 {
		cs := framework.NewCycleState()
		pre.PreFilter(ctx, cs, pod, nil)
		victim := ni.GetPods()[0].GetPod()
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			c := ni.Snapshot()
			if err := c.RemovePod(klog.Background(), victim); err != nil {
				b.Fatal(err)
			}
			filter.Filter(ctx, cs, pod, c)
		}
		b.StopTimer()
		return float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	}
	b.Run("baseline-NodeResourcesFit", func(b *testing.B) {
		pl, ni := baselineFit(b, ctx)
		base = run(b, pl.(fwk.FilterPlugin), pl.(fwk.PreFilterPlugin), ni)
	})
	b.Run("GPUFit", func(b *testing.B) {
		e := newBenchEnv(b, gpu.Fragmentation)
		ns := run(b, e.fit, e.fit.(fwk.PreFilterPlugin), e.ni)
		if base > 0 {
			b.ReportMetric(ns/base, "x-baseline")
		}
	})
	// The plan: on the bench node (one more device to clear), and on a
	// 16-GPU node with four 200m shares on every device, clearing 4 devices
	// (1,820 sets costed) and 8 (greedy).
	big := st.MakeNode().Name("gpu-16").Capacity(map[v1.ResourceName]string{
		v1.ResourceCPU: "96", v1.ResourceMemory: "384Gi", gpu.ResourceNvidiaGPU: "16"}).Obj()
	var bigPods []*v1.Pod
	for d := 0; d < 16; d++ {
		for k := 0; k < 4; k++ {
			name := fmt.Sprintf("s-%d-%d", d, k)
			bigPods = append(bigPods, st.MakePod().Name(name).UID(name).Namespace("default").Node("gpu-16").
				Annotation(gpu.AnnotationMilli, "200").Annotation(gpu.AnnotationAssignment, fmt.Sprintf("gpu-16:%d=200", d)).Obj())
		}
	}
	node8, pods8 := benchNode()
	for _, tc := range []struct {
		name  string
		node  *v1.Node
		pods  []*v1.Pod
		count int32
	}{{"plan/8gpu-clear-1", node8, pods8, 2}, {"plan/16gpu-64pods-clear-4", big, bigPods, 4}, {"plan/16gpu-64pods-clear-8", big, bigPods, 8}} {
		b.Run(tc.name, func(b *testing.B) {
			tr := gpu.NewTracker(gpu.DefaultNodeOptions)
			victims := map[types.UID]gpu.Victim{}
			for _, p := range tc.pods {
				victims[p.UID] = gpu.Victim{}
			}
			req := gpu.Request{Count: tc.count}
			if _, ok := tr.PlanEviction(tc.node, tc.pods, &req, victims, nil); !ok {
				b.Fatal("no plan")
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				tr.PlanEviction(tc.node, tc.pods, &req, victims, nil)
			}
			b.StopTimer()
			if base > 0 {
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/base, "x-baseline")
			}
		})
	}
}

// BenchmarkNodeChange is the per-node cost of Filter and Score right after
// the node changed (a CPU pod bound, then removed: each a new generation),
// on a node with 5 and with 250 CPU pods beside its GPU pods; the 250-pod
// run prints its ratio to the 5-pod one, measured in the same run. "none"
// is the change alone (the scheduler's NodeInfo finds the pod to remove by
// a scan of its pods).
func BenchmarkNodeChange(b *testing.B) {
	for _, kind := range []string{"none", "cpu", "shared", "whole"} {
		var few float64
		for _, n := range []int{5, 250} {
			b.Run(fmt.Sprintf("%s/%d-pods", kind, n), func(b *testing.B) {
				node, pods := withCPUPods(n)
				e := newEnvOn(b, gpu.Fragmentation, node, pods)
				ctx := klog.NewContext(context.Background(), klog.Background())
				pod := benchPods[kind]
				if kind == "none" {
					pod = benchPods["cpu"]
				}
				cs := framework.NewCycleState()
				e.pre(ctx, cs, pod)
				bound, err := framework.NewPodInfo(cpuPodOn("bound", node.Name))
				if err != nil {
					b.Fatal(err)
				}
				call := func() {
					if kind == "none" {
						return
					}
					if kind != "cpu" {
						e.fit.Filter(ctx, cs, pod, e.ni)
					}
					e.score.Score(ctx, cs, pod, e.ni)
					e.least.Score(ctx, cs, pod, e.ni)
				}
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					e.ni.AddPodInfo(bound)
					call()
					if err := e.ni.RemovePod(klog.Background(), bound.GetPod()); err != nil {
						b.Fatal(err)
					}
					call()
				}
				b.StopTimer()
				ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
				if n == 5 {
					few = ns
				} else if few > 0 {
					b.ReportMetric(ns/few, "x-5-pods")
				}
			})
		}
	}
}

// BenchmarkCPUOnlyCycle is a CPU-only pod's GPUScore over a cycle's nodes
// (500 of 5,000, what the scheduler scores at that size, a different 500
// each cycle as its search moves on): each node scored in its own Score
// call ("per-node": PreScore without the nodes), or all at once in PreScore
// ("batch"). ns per node scored; x-baseline is batch over per-node, in the
// same run. Between cycles, 64 MiB are written, untimed: in the scheduler,
// the rest of a cycle's work evicts the nodes' states before the same nodes
// come round again, and every lookup misses the CPU's caches.
func BenchmarkCPUOnlyCycle(b *testing.B) {
	const total, perCycle = 5000, 500
	metrics.Register()
	ctx := klog.NewContext(context.Background(), klog.Background())
	var nodes []*v1.Node
	var pods []*v1.Pod
	for i := 0; i < total; i++ {
		name := fmt.Sprintf("gpu-%04d", i)
		nodes = append(nodes, st.MakeNode().Name(name).Capacity(map[v1.ResourceName]string{
			v1.ResourceCPU: "96", v1.ResourceMemory: "384Gi", gpu.ResourceNvidiaGPU: "8"}).Label(gpu.LabelGPUProduct, "G2").Obj())
		for d := 0; d < i%4; d++ {
			pods = append(pods, st.MakePod().Name(fmt.Sprintf("%s-%d", name, d)).UID(fmt.Sprintf("%s-%d", name, d)).Namespace("default").Node(name).
				Req(map[v1.ResourceName]string{v1.ResourceCPU: "4", v1.ResourceMemory: "16Gi", gpu.ResourceNvidiaGPU: "1"}).
				Annotation(gpu.AnnotationAssignment, fmt.Sprintf("%s:%d=1000", name, d)).Obj())
		}
	}
	snapshot := cache.NewSnapshot(pods, nodes)
	fh := handleOver(b, ctx, snapshot)
	args := scheme.DefaultGPUScoreArgs()
	args.TargetWorkload.Mode = config.WorkloadStatic
	args.TargetWorkload.Tasks = benchWorkload()
	p, err := gpuscore.New(ctx, args, fh)
	if err != nil {
		b.Fatal(err)
	}
	pre, score := p.(fwk.PreScorePlugin), p.(fwk.ScorePlugin)
	nis, err := snapshot.NodeInfos().List()
	if err != nil {
		b.Fatal(err)
	}
	pod := benchPods["cpu"]
	cycle := func(i int, batch bool) {
		start := (i * perCycle) % total
		ns := nis[start : start+perCycle]
		cs := framework.NewCycleState()
		var arg []fwk.NodeInfo
		if batch {
			arg = ns
		}
		if s := pre.PreScore(ctx, cs, pod, arg); !s.IsSuccess() {
			b.Fatal(s)
		}
		for _, ni := range ns {
			if _, s := score.Score(ctx, cs, pod, ni); !s.IsSuccess() {
				b.Fatal(s)
			}
		}
	}
	for i := 0; i < total/perCycle; i++ {
		cycle(i, false) // every node's state cached and its NodeInfo remembered
	}
	evict := make([]byte, 64<<20)
	var base float64
	for _, mode := range []string{"per-node", "batch"} {
		b.Run(mode, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				for j := 0; j < len(evict); j += 64 {
					evict[j]++
				}
				b.StartTimer()
				cycle(i, mode == "batch")
			}
			ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N*perCycle)
			b.ReportMetric(ns, "ns/node")
			if mode == "per-node" {
				base = ns
			} else if base > 0 {
				b.ReportMetric(ns/base, "x-baseline")
			}
		})
	}
}
