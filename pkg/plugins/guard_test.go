package plugins_test

import (
	"context"
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	st "k8s.io/kubernetes/pkg/scheduler/testing"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
)

// withCPUPods is the bench node with n CPU-only pods beside its GPU pods.
func withCPUPods(n int) (*v1.Node, []*v1.Pod) {
	node, pods := benchNode()
	for i := 0; i < n; i++ {
		pods = append(pods, cpuPodOn(fmt.Sprintf("cpu-%d", i), node.Name))
	}
	return node, pods
}

func cpuPodOn(name, node string) *v1.Pod {
	return st.MakePod().Name(name).UID(name).Namespace("default").Node(node).
		Req(map[v1.ResourceName]string{v1.ResourceCPU: "100m", v1.ResourceMemory: "500Mi"}).Obj()
}

// nodeCost is what one pod's Filter and Score cost on a node: allocations
// per call on a warm cache, and, over a CPU pod bound and removed again
// (each a new generation of the node), allocations and Build's work per
// change.
type nodeCost struct {
	warmAllocs, changeAllocs float64
	// warmLookups: lookups of a node's state by name (a map read that
	// misses the CPU's caches at thousands of nodes) on a warm cache.
	warmLookups uint64
	// total is Build's work over changes changes of the node.
	total   gpu.BuildStats
	changes uint64
}

func measureNodeCost(t testing.TB, kind string, cpuPods int) nodeCost {
	node, pods := withCPUPods(cpuPods)
	e := newEnvOn(t, gpu.Fragmentation, node, pods)
	ctx := klog.NewContext(context.Background(), klog.Background())
	pod := benchPods[kind]
	cs := framework.NewCycleState()
	e.pre(ctx, cs, pod)
	call := func() {
		if kind != "cpu" {
			if s := e.fit.Filter(ctx, cs, pod, e.ni); !s.IsSuccess() {
				t.Fatal(s)
			}
		}
		if _, s := e.score.Score(ctx, cs, pod, e.ni); !s.IsSuccess() {
			t.Fatal(s)
		}
		if _, s := e.least.Score(ctx, cs, pod, e.ni); !s.IsSuccess() {
			t.Fatal(s)
		}
	}
	call()
	var c nodeCost
	lookups := gpu.Lookups()
	c.warmAllocs = testing.AllocsPerRun(100, call)
	c.warmLookups = gpu.Lookups() - lookups
	bound, err := framework.NewPodInfo(cpuPodOn("bound", node.Name))
	if err != nil {
		t.Fatal(err)
	}
	change := func() {
		e.ni.AddPodInfo(bound)
		call()
		if err := e.ni.RemovePod(klog.Background(), bound.GetPod()); err != nil {
			t.Fatal(err)
		}
		call()
	}
	change()
	before := gpu.Builds()
	const runs = 50
	c.changeAllocs = testing.AllocsPerRun(runs, change) / 2
	after := gpu.Builds()
	c.changes = 2 * (runs + 1) // AllocsPerRun runs once more to warm up
	c.total = gpu.BuildStats{
		Reused: after.Reused - before.Reused, Computed: after.Computed - before.Computed,
		Parsed: after.Parsed - before.Parsed, Read: after.Read - before.Read,
	}
	return c
}

// The per-node cost of our Filter and Score is counted, not timed: no
// allocation on a warm cache, and after a CPU pod's bind on the node, the
// same allocations and no more parsing on a node with 250 pods than on one
// with 5; no lookup by name on a warm cache; a CPU pod's bind keeps the node's devices (an increment, not a
// rebuild). The throughput fall of issue 36 came from work that grew with
// the pods on a node and from per-node work for pods that ask for no GPU.
func TestPerNodeCostIndependentOfPods(t *testing.T) {
	for _, kind := range []string{"cpu", "shared", "whole"} {
		t.Run(kind, func(t *testing.T) {
			few, many := measureNodeCost(t, kind, 5), measureNodeCost(t, kind, 250)
			for _, c := range []struct {
				pods int
				nodeCost
			}{{5, few}, {250, many}} {
				if c.warmAllocs != 0 {
					t.Errorf("%d pods: %.1f allocations per Filter and Score on a warm cache, want 0", c.pods, c.warmAllocs)
				}
				if c.warmLookups != 0 {
					t.Errorf("%d pods: %d lookups of the node's state by name over 101 Filter and Score calls on a warm cache, want 0 (the snapshot's NodeInfo leads to it)", c.pods, c.warmLookups)
				}
				if c.total.Parsed > c.changes {
					t.Errorf("%d pods: %d pods parsed over %d changes of the node, want at most the one bound each time", c.pods, c.total.Parsed, c.changes)
				}
				if c.total.Reused != c.changes || c.total.Computed != 0 || c.total.Read != 0 {
					t.Errorf("%d pods: over %d changes (a CPU pod bound or removed), the devices were reused %d times and computed %d times (%d pods read), want every time and never",
						c.pods, c.changes, c.total.Reused, c.total.Computed, c.total.Read)
				}
			}
			// Allocation counts vary under the race detector (seen: 0.5
			// more with 250 pods in 1 run of 30).
			if !raceEnabled && many.changeAllocs != few.changeAllocs {
				t.Errorf("allocations per change of the node: %.1f with 250 pods, %.1f with 5", many.changeAllocs, few.changeAllocs)
			}
		})
	}
}

// On a node without GPUs, a CPU-only pod's score needs no device state:
// once the node is known to have none, its changes build nothing.
func TestCPUNodeChangesBuildNothing(t *testing.T) {
	node := st.MakeNode().Name("cpu-node").Capacity(map[v1.ResourceName]string{
		v1.ResourceCPU: "96", v1.ResourceMemory: "384Gi", v1.ResourcePods: "300"}).Obj()
	var pods []*v1.Pod
	for i := 0; i < 250; i++ {
		pods = append(pods, cpuPodOn(fmt.Sprintf("cpu-%d", i), node.Name))
	}
	e := newEnvOn(t, gpu.Fragmentation, node, pods)
	ctx := klog.NewContext(context.Background(), klog.Background())
	pod := benchPods["cpu"]
	cs := framework.NewCycleState()
	e.pre(ctx, cs, pod)
	first, _ := e.score.Score(ctx, cs, pod, e.ni)
	bound, err := framework.NewPodInfo(cpuPodOn("bound", node.Name))
	if err != nil {
		t.Fatal(err)
	}
	before := gpu.Builds()
	for i := 0; i < 10; i++ {
		e.ni.AddPodInfo(bound)
		if got, _ := e.score.Score(ctx, cs, pod, e.ni); got != first {
			t.Fatalf("score %d after a bind, %d before: a node without GPUs ranks the same", got, first)
		}
		if err := e.ni.RemovePod(klog.Background(), bound.GetPod()); err != nil {
			t.Fatal(err)
		}
		e.score.Score(ctx, cs, pod, e.ni)
	}
	if after := gpu.Builds(); after.Reused+after.Computed != before.Reused+before.Computed || after.Parsed != before.Parsed {
		t.Errorf("20 changes of a node without GPUs: %d builds, %d pods parsed; want none",
			after.Reused+after.Computed-before.Reused-before.Computed, after.Parsed-before.Parsed)
	}
}
