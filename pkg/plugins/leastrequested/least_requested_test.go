package leastrequested

import (
	"fmt"
	"math/rand"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	fwk "k8s.io/kube-scheduler/framework"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	plfeature "k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/noderesources"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	st "k8s.io/kubernetes/pkg/scheduler/testing"
	"k8s.io/kubernetes/test/utils/ktesting"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config"
)

func TestScoreWorkedExample(t *testing.T) {
	tCtx := ktesting.Init(t)
	// node: 4 CPU, 10000 bytes memory; existing pod 1 CPU, 5000 bytes;
	// new pod 1 CPU, 2500 bytes.
	// cpu: (4000-2000)*100/4000 = 50; memory: (10000-7500)*100/10000 = 25.
	// weights 1,1: (50+25)/2 = 37. weights cpu 3, memory 1: (150+25)/4 = 43.
	node := st.MakeNode().Name("n").Capacity(map[v1.ResourceName]string{v1.ResourceCPU: "4", v1.ResourceMemory: "10000"}).Obj()
	existing := st.MakePod().Name("e").Node("n").Req(map[v1.ResourceName]string{v1.ResourceCPU: "1", v1.ResourceMemory: "5000"}).Obj()
	pod := st.MakePod().Name("p").Req(map[v1.ResourceName]string{v1.ResourceCPU: "1", v1.ResourceMemory: "2500"}).Obj()
	snapshot := cache.NewSnapshot([]*v1.Pod{existing}, []*v1.Node{node})
	fh, _ := frameworkruntime.NewFramework(tCtx, nil, nil, frameworkruntime.WithSnapshotSharedLister(snapshot))
	ni, _ := snapshot.Get("n")
	for _, tc := range []struct {
		weights []config.ResourceWeight
		want    int64
	}{
		{[]config.ResourceWeight{{Name: "cpu", Weight: 1}, {Name: "memory", Weight: 1}}, 37},
		{[]config.ResourceWeight{{Name: "cpu", Weight: 3}, {Name: "memory", Weight: 1}}, 43},
		{[]config.ResourceWeight{{Name: "memory", Weight: 1}}, 25},
	} {
		p, err := New(tCtx, &config.LeastRequestedArgs{Resources: tc.weights}, fh)
		if err != nil {
			t.Fatal(err)
		}
		cs := framework.NewCycleState()
		p.(fwk.PreScorePlugin).PreScore(tCtx, cs, pod, nil)
		got, s := p.(fwk.ScorePlugin).Score(tCtx, cs, pod, ni)
		if !s.IsSuccess() || got != tc.want {
			t.Errorf("%v: want %d, got %d (%v)", tc.weights, tc.want, got, s)
		}
	}
}

// LeastRequested agrees with the in-tree NodeResourcesFit LeastAllocated
// strategy on the same nodes and pods, whatever the weights.
func TestAgreesWithInTreeLeastAllocated(t *testing.T) {
	tCtx := ktesting.Init(t)
	rng := rand.New(rand.NewSource(3))
	const gpu = "nvidia.com/gpu"
	var nodes []*v1.Node
	var pods []*v1.Pod
	for i := 0; i < 40; i++ {
		name := fmt.Sprintf("n%d", i)
		res := map[v1.ResourceName]string{
			v1.ResourceCPU:    fmt.Sprintf("%dm", 1000+rng.Intn(64000)),
			v1.ResourceMemory: fmt.Sprintf("%dMi", 512+rng.Intn(256*1024)),
		}
		if rng.Intn(2) == 0 {
			res[gpu] = fmt.Sprint(1 + rng.Intn(8))
		}
		nodes = append(nodes, st.MakeNode().Name(name).Capacity(res).Obj())
		for j := rng.Intn(6); j > 0; j-- {
			pods = append(pods, randomPod(rng, fmt.Sprintf("%s-%d", name, j), name))
		}
	}
	snapshot := cache.NewSnapshot(pods, nodes)
	fh, _ := frameworkruntime.NewFramework(tCtx, nil, nil, frameworkruntime.WithSnapshotSharedLister(snapshot))
	fts := plfeature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate)
	// Extended resources backed by DRA need a DRA manager; ours come from
	// device plugins, where both plugins read the node's allocatable.
	fts.EnableDRAExtendedResource = false
	weightSets := [][]config.ResourceWeight{
		{{Name: "cpu", Weight: 1}, {Name: "memory", Weight: 1}},
		{{Name: "cpu", Weight: 5}, {Name: "memory", Weight: 2}},
		{{Name: "cpu", Weight: 1}, {Name: "memory", Weight: 1}, {Name: gpu, Weight: 3}},
	}
	compared := 0
	for _, weights := range weightSets {
		var specs []schedconfig.ResourceSpec
		for _, w := range weights {
			specs = append(specs, schedconfig.ResourceSpec{Name: w.Name, Weight: w.Weight})
		}
		inTree, err := noderesources.NewFit(tCtx, &schedconfig.NodeResourcesFitArgs{
			ScoringStrategy: &schedconfig.ScoringStrategy{Type: schedconfig.LeastAllocated, Resources: specs},
		}, fh, fts)
		if err != nil {
			t.Fatal(err)
		}
		ours, err := New(tCtx, &config.LeastRequestedArgs{Resources: weights}, fh)
		if err != nil {
			t.Fatal(err)
		}
		for k := 0; k < 30; k++ {
			pod := randomPod(rng, fmt.Sprintf("new-%d", k), "")
			csA, csB := framework.NewCycleState(), framework.NewCycleState()
			infos, _ := snapshot.NodeInfos().List()
			inTree.(fwk.PreScorePlugin).PreScore(tCtx, csA, pod, infos)
			ours.(fwk.PreScorePlugin).PreScore(tCtx, csB, pod, infos)
			for _, ni := range infos {
				want, s1 := inTree.(fwk.ScorePlugin).Score(tCtx, csA, pod, ni)
				got, s2 := ours.(fwk.ScorePlugin).Score(tCtx, csB, pod, ni)
				if !s1.IsSuccess() || !s2.IsSuccess() {
					t.Fatalf("status: %v %v", s1, s2)
				}
				if got != want {
					t.Fatalf("weights %v, pod %v, node %s: in-tree %d, ours %d", weights, pod.Spec.Containers, ni.Node().Name, want, got)
				}
				compared++
			}
		}
	}
	t.Logf("compared %d scores", compared)
}

// randomPod has requests, or none (the scheduler's non-zero defaults apply),
// and sometimes GPUs.
func randomPod(rng *rand.Rand, name, node string) *v1.Pod {
	w := st.MakePod().Name(name).UID(name).Namespace("default")
	if node != "" {
		w = w.Node(node)
	}
	req := map[v1.ResourceName]string{}
	switch rng.Intn(4) {
	case 0: // no requests at all
	case 1:
		req[v1.ResourceCPU] = fmt.Sprintf("%dm", rng.Intn(8000))
	default:
		req[v1.ResourceCPU] = fmt.Sprintf("%dm", rng.Intn(16000))
		req[v1.ResourceMemory] = fmt.Sprintf("%dMi", rng.Intn(64*1024))
	}
	if rng.Intn(3) == 0 {
		req["nvidia.com/gpu"] = fmt.Sprint(1 + rng.Intn(2))
	}
	if len(req) == 0 {
		return w.Container("c").Obj()
	}
	return w.Req(req).Obj()
}

func TestNewValidatesArgs(t *testing.T) {
	tCtx := ktesting.Init(t)
	fh, _ := frameworkruntime.NewFramework(tCtx, nil, nil)
	_, err := New(tCtx, &config.LeastRequestedArgs{Resources: []config.ResourceWeight{{Name: "cpu", Weight: 0}, {Name: "cpu", Weight: 1}}}, fh)
	if err == nil {
		t.Fatal("want an error")
	}
	for _, want := range []string{"args.resources[0].weight: Invalid value: 0: must be from 1 to 100", `args.resources[1].name: Duplicate value: "cpu"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not contain %q", err, want)
		}
	}
}
