package fitfast

import (
	"context"
	"fmt"
	"math/rand"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	featuregatetesting "k8s.io/component-base/featuregate/testing"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	plfeature "k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/noderesources"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	st "k8s.io/kubernetes/pkg/scheduler/testing"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/requeue"
)

// hugepages-2Mi is no extended resource: upstream checks it though listed.
var testArgs = runtime.RawExtension{Raw: []byte(`{"ignoredResources":["example.com/ignored","hugepages-2Mi"],"ignoredResourceGroups":["ignored.io"]}`)}

// both builds our plugin and the in-tree one from the same args.
func both(t testing.TB) (*Plugin, fwk.FilterPlugin) {
	ctx := klog.NewContext(context.Background(), klog.Background())
	fh, err := frameworkruntime.NewFramework(ctx, nil, nil, frameworkruntime.WithSnapshotSharedLister(cache.NewEmptySnapshot()))
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(ctx, &runtime.Unknown{Raw: testArgs.Raw}, fh)
	if err != nil {
		t.Fatal(err)
	}
	// Upstream's args written out here, not decoded by argsFrom: a
	// decoding bug shows as a difference.
	args := &config.NodeResourcesFitArgs{IgnoredResources: []string{"example.com/ignored", "hugepages-2Mi"}, IgnoredResourceGroups: []string{"ignored.io"},
		ScoringStrategy: &config.ScoringStrategy{Type: config.LeastAllocated, Resources: []config.ResourceSpec{{Name: "cpu", Weight: 1}, {Name: "memory", Weight: 1}}}}
	up, err := noderesources.NewFit(ctx, args, fh, plfeature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate))
	if err != nil {
		t.Fatal(err)
	}
	return p.(*Plugin), up.(fwk.FilterPlugin)
}

// scalarShare: how often each extended resource is asked for or offered.
const scalarShare = 0.25

var scalarNames = []v1.ResourceName{"nvidia.com/gpu", "example.com/dev", "example.com/ignored", "ignored.io/x", "hugepages-2Mi"}

// randList is a random request or capacity over CPU, memory, ephemeral
// storage and extended resources (some ignored by the args), each present
// with probability p.
func randList(rng *rand.Rand, p float64, scale, scalars int64) v1.ResourceList {
	l := v1.ResourceList{}
	if rng.Float64() < p {
		l[v1.ResourceCPU] = *resource.NewMilliQuantity(rng.Int63n(4*scale)+1, resource.DecimalSI)
	}
	if rng.Float64() < p {
		l[v1.ResourceMemory] = *resource.NewQuantity((rng.Int63n(4*scale)+1)<<20, resource.BinarySI)
	}
	if rng.Float64() < p/2 {
		l[v1.ResourceEphemeralStorage] = *resource.NewQuantity((rng.Int63n(4*scale)+1)<<20, resource.BinarySI)
	}
	for _, n := range scalarNames {
		if rng.Float64() < p*scalarShare {
			l[n] = *resource.NewQuantity(rng.Int63n(scalars)+1, resource.DecimalSI)
		}
	}
	// Explicit zeros: checked by neither.
	if rng.Intn(10) == 0 {
		l[v1.ResourceCPU] = resource.MustParse("0")
	}
	if rng.Intn(10) == 0 {
		l[scalarNames[rng.Intn(len(scalarNames))]] = resource.MustParse("0")
	}
	return l
}

// same: the same code and reasons, in upstream's order: the pod limit, CPU,
// memory and ephemeral storage first, in that order, then the scalar
// resources (in map order, upstream's too).
func same(a, b *fwk.Status) bool {
	if a.IsSuccess() || b.IsSuccess() {
		return a.IsSuccess() == b.IsSuccess()
	}
	first := []string{"Too many pods", "Insufficient cpu", "Insufficient memory", "Insufficient ephemeral-storage"}
	rank := func(r string) int {
		if i := slices.Index(first, r); i >= 0 {
			return i
		}
		return len(first)
	}
	byRank := func(x, y string) int {
		if c := rank(x) - rank(y); c != 0 {
			return c
		}
		return strings.Compare(x, y)
	}
	inOrder := func(r []string) bool {
		return slices.IsSortedFunc(r, func(x, y string) int { return rank(x) - rank(y) })
	}
	ra, rb := slices.Clone(a.Reasons()), slices.Clone(b.Reasons())
	if !inOrder(ra) || !inOrder(rb) {
		return false
	}
	slices.SortFunc(ra, byRank)
	slices.SortFunc(rb, byRank)
	return a.Code() == b.Code() && slices.Equal(ra, rb)
}

func strs(l v1.ResourceList) map[v1.ResourceName]string {
	out := make(map[v1.ResourceName]string, len(l))
	for n, q := range l {
		out[n] = q.String()
	}
	return out
}

func randPod(rng *rand.Rand, name string) *v1.Pod {
	w := st.MakePod().Name(name).UID(name).Namespace("default")
	for c := 0; c < 1+rng.Intn(2); c++ {
		w = w.Res(strs(randList(rng, 0.7, 1000, 2)))
	}
	p := w.Obj()
	if rng.Intn(5) == 0 {
		p.Spec.InitContainers = []v1.Container{{Name: "init", Resources: v1.ResourceRequirements{Requests: randList(rng, 0.5, 2000, 3)}}}
	}
	if rng.Intn(6) == 0 {
		p.Spec.Overhead = v1.ResourceList{v1.ResourceCPU: resource.MustParse("50m"), v1.ResourceMemory: resource.MustParse("32Mi")}
	}
	if rng.Intn(8) == 0 {
		p.Spec.Resources = &v1.ResourceRequirements{Requests: randList(rng, 0.8, 1500, 3)}
	}
	return p
}

// The shortcut never changes a verdict: on random nodes and pods (extended
// resources asked for and absent, ignored resources and groups, init
// containers, overhead, pod-level resources, pods already on the node whose
// request grew, the pod limit), our Filter's status is upstream's, code and
// reasons, with the in-place resize gate off and on.
func TestFilterMatchesUpstream(t *testing.T) {
	for _, gates := range []struct{ inPlace, podLevel bool }{{false, true}, {true, true}, {false, false}, {true, false}} {
		inPlace := gates.inPlace
		t.Run(fmt.Sprintf("inPlacePreemption=%v,podLevelResources=%v", inPlace, gates.podLevel), func(t *testing.T) {
			featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.InPlacePodVerticalScalingSchedulerPreemption, inPlace)
			featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.PodLevelResources, gates.podLevel)
			ours, up := both(t)
			ctx := klog.NewContext(context.Background(), klog.Background())
			rng := rand.New(rand.NewSource(42))
			var fits, rejected, refusedHere, onNode int
			for i := 0; i < 4000; i++ {
				alloc := randList(rng, 0.95, 12000, 12)
				alloc[v1.ResourcePods] = *resource.NewQuantity(rng.Int63n(6)+1, resource.DecimalSI)
				node := st.MakeNode().Name("n").Capacity(strs(alloc)).Obj()
				ni := framework.NewNodeInfo()
				ni.SetNode(node)
				for j := 0; j < rng.Intn(5); j++ {
					p := randPod(rng, fmt.Sprintf("bound-%d", j))
					p.Spec.NodeName = "n"
					ni.AddPod(p)
				}
				pod := randPod(rng, "pod")
				switch pods := ni.GetPods(); {
				case len(pods) > 0 && rng.Intn(4) == 0:
					// A pod already on the node, asking for more than the
					// node holds for it (upstream checks only the growth).
					cached := pods[rng.Intn(len(pods))].GetPod()
					pod.UID, pod.Name, pod.Spec.NodeName = cached.UID, cached.Name, "n"
					onNode++
				case rng.Intn(10) == 0:
					// Bound here, but not in the node's pods yet.
					pod.Spec.NodeName = "n"
				case rng.Intn(10) == 0:
					pod.Spec.NodeName = "elsewhere"
				}
				cs := framework.NewCycleState()
				if _, s := ours.PreFilter(ctx, cs, pod, nil); !s.IsSuccess() {
					continue // upstream rejects it before any node
				}
				got, want := ours.Filter(ctx, cs, pod, ni), up.Filter(ctx, cs, pod, ni)
				if !same(got, want) {
					t.Fatalf("case %d: got %v, upstream %v\nnode %v\npod %v", i, got, want, node.Status.Allocatable, pod.Spec)
				}
				if want.IsSuccess() {
					fits++
				} else {
					rejected++
					if _, ok := ours.refuse(ours.request(cs), pod, ni); ok {
						refusedHere++
					}
				}
			}
			// Both verdicts and both ways to refuse must be common, or the
			// comparison proves little.
			if fits < 500 || rejected < 500 || onNode < 300 || refusedHere < 300 || rejected-refusedHere < 300 {
				t.Fatalf("fits %d, rejected %d (%d without upstream's Filter), on the node %d: the cases do not cover every path", fits, rejected, refusedHere, onNode)
			}
			t.Logf("%d fit, %d rejected (%d without upstream's Filter; %d pods already on the node)", fits, rejected, refusedHere, onNode)
		})
	}
}

// busyNode: 96 CPUs and 8 GPUs, of which a pod holds 90 and 7.
func busyNode() *framework.NodeInfo {
	ni := framework.NewNodeInfo(st.MakePod().Name("b").UID("b").Node("n").Req(map[v1.ResourceName]string{v1.ResourceCPU: "90", "nvidia.com/gpu": "7"}).Obj())
	ni.SetNode(st.MakeNode().Name("n").Capacity(map[v1.ResourceName]string{
		v1.ResourceCPU: "96", v1.ResourceMemory: "768Gi", v1.ResourcePods: "250", "nvidia.com/gpu": "8"}).Obj())
	return ni
}

// A node with room passes without an allocation (upstream allocates on
// every call, and runs a regular expression per extended resource), for a
// CPU pod and for a whole-GPU pod; a node without room gets upstream's
// reasons, built here with fewer allocations.
func TestShortcutTaken(t *testing.T) {
	ours, up := both(t)
	ctx := klog.NewContext(context.Background(), klog.Background())
	ni := busyNode()
	for _, tc := range []struct {
		name string
		req  map[v1.ResourceName]string
		fits bool
		// upstream: the refusal is upstream's Filter's.
		upstream bool
	}{
		{"cpu", map[v1.ResourceName]string{v1.ResourceCPU: "100m", v1.ResourceMemory: "500Mi"}, true, false},
		{"gpu", map[v1.ResourceName]string{v1.ResourceCPU: "4", v1.ResourceMemory: "32Gi", "nvidia.com/gpu": "1"}, true, false},
		{"two-gpus", map[v1.ResourceName]string{v1.ResourceCPU: "4", "nvidia.com/gpu": "2"}, false, false},
		{"cpu-short", map[v1.ResourceName]string{v1.ResourceCPU: "8"}, false, false},
		// In ignoredResources: no node has it, and upstream does not check.
		{"ignored", map[v1.ResourceName]string{v1.ResourceCPU: "1", "example.com/ignored": "3"}, true, false},
		// Not on the node: DRA may serve it (DRAExtendedResource is GA).
		{"absent", map[v1.ResourceName]string{v1.ResourceCPU: "1", "example.com/dev": "1"}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := st.MakePod().Name(tc.name).UID(tc.name).Req(tc.req).Obj()
			cs := framework.NewCycleState()
			ours.PreFilter(ctx, cs, pod, nil)
			got, want := ours.Filter(ctx, cs, pod, ni), up.Filter(ctx, cs, pod, ni)
			if got.IsSuccess() != tc.fits || !same(got, want) {
				t.Fatalf("got %v, upstream %v, want fits=%v", got, want, tc.fits)
			}
			if !tc.fits {
				// Refused here: the reasons and the status, no regular
				// expression or formatting per node.
				if _, ok := ours.refuse(ours.request(cs), pod, ni); ok == tc.upstream {
					t.Fatalf("refused here: %v, want %v", ok, !tc.upstream)
				}
				if tc.upstream {
					return
				}
				o := testing.AllocsPerRun(100, func() { ours.Filter(ctx, cs, pod, ni) })
				u := testing.AllocsPerRun(100, func() { up.Filter(ctx, cs, pod, ni) })
				if o >= u {
					t.Errorf("%v allocations per refusal, upstream %v: want fewer", o, u)
				}
				return
			}
			if a := testing.AllocsPerRun(100, func() { ours.Filter(ctx, cs, pod, ni) }); a != 0 {
				t.Errorf("%v allocations per Filter on a node with room, want 0", a)
			}
			if a := testing.AllocsPerRun(100, func() { up.Filter(ctx, cs, pod, ni) }); a == 0 {
				t.Errorf("upstream's Filter no longer allocates: the shortcut may have no point")
			}
		})
	}
}

// Args are NodeResourcesFit's, decoded strictly, defaulted and validated
// as upstream's.
func TestArgs(t *testing.T) {
	ctx := klog.NewContext(context.Background(), klog.Background())
	fh, err := frameworkruntime.NewFramework(ctx, nil, nil, frameworkruntime.WithSnapshotSharedLister(cache.NewEmptySnapshot()))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, raw string
		ok        bool
	}{
		{"none", "", true},
		{"ignored", `{"ignoredResources":["nvidia.com/gpumem"]}`, true},
		{"misspelt", `{"ignoredResource":["nvidia.com/gpumem"]}`, false},
		{"bad-strategy", `{"scoringStrategy":{"type":"Nonsense"}}`, false},
		{"bad-group", `{"ignoredResourceGroups":["a/b"]}`, false},
		{"miscased", `{"IgnoredResources":["nvidia.com/gpumem"]}`, false},
		{"repeated", `{"ignoredResources":["a.io/x"],"ignoredResources":["b.io/y"]}`, false},
		{"kind", `{"kind":"NodeResourcesFitArgs","apiVersion":"kubescheduler.config.k8s.io/v1"}`, true},
		{"other-kind", `{"kind":"GPUFitArgs"}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var obj runtime.Object
			if tc.raw != "" {
				obj = &runtime.Unknown{Raw: []byte(tc.raw)}
			}
			p, err := New(ctx, obj, fh)
			if (err == nil) != tc.ok {
				t.Fatalf("err %v, want ok=%v", err, tc.ok)
			}
			if err == nil && p.Name() != Name {
				t.Errorf("name %q", p.Name())
			}
		})
	}
	if _, err := New(ctx, &config.NodeResourcesFitArgs{ScoringStrategy: &config.ScoringStrategy{Type: config.LeastAllocated,
		Resources: []config.ResourceSpec{{Name: "cpu", Weight: 1}}}}, fh); err != nil {
		t.Errorf("internal args: %v", err)
	}
}

// The reconciler re-checks NodeResourcesFitFast's rejections by its name.
func TestNameKnownToRequeue(t *testing.T) {
	if Name != requeue.NodeResourcesFitFastName {
		t.Errorf("plugin %q, requeue knows %q", Name, requeue.NodeResourcesFitFastName)
	}
}

// Our Filter against upstream's, in the same run, on a node with room and
// on one without (for a whole GPU, and for CPU): ns per call of each and
// their ratio. Timing is reported, never asserted.
func BenchmarkFilter(b *testing.B) {
	ours, up := both(b)
	ctx := klog.NewContext(context.Background(), klog.Background())
	ni := busyNode()
	for _, tc := range []struct {
		name string
		req  map[v1.ResourceName]string
	}{
		{"fits", map[v1.ResourceName]string{v1.ResourceCPU: "4", v1.ResourceMemory: "32Gi", "nvidia.com/gpu": "1"}},
		{"refused-gpu", map[v1.ResourceName]string{v1.ResourceCPU: "4", v1.ResourceMemory: "32Gi", "nvidia.com/gpu": "2"}},
		{"refused-cpu", map[v1.ResourceName]string{v1.ResourceCPU: "8", v1.ResourceMemory: "32Gi", "nvidia.com/gpu": "1"}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			pod := st.MakePod().Name(tc.name).UID(tc.name).Req(tc.req).Obj()
			cs := framework.NewCycleState()
			ours.PreFilter(ctx, cs, pod, nil)
			start := time.Now()
			for i := 0; i < b.N; i++ {
				ours.Filter(ctx, cs, pod, ni)
			}
			o := time.Since(start)
			start = time.Now()
			for i := 0; i < b.N; i++ {
				up.Filter(ctx, cs, pod, ni)
			}
			u := time.Since(start)
			b.ReportMetric(float64(o.Nanoseconds())/float64(b.N), "ours-ns/op")
			b.ReportMetric(float64(u.Nanoseconds())/float64(b.N), "upstream-ns/op")
			b.ReportMetric(float64(o)/float64(u), "ours/upstream")
		})
	}
}

// Filter runs on many nodes at once: the scalar resources' cache under
// concurrent refusals (run with -race), each status still upstream's.
func TestFilterConcurrent(t *testing.T) {
	ours, up := both(t)
	ctx := klog.NewContext(context.Background(), klog.Background())
	node := st.MakeNode().Name("n").Capacity(map[v1.ResourceName]string{
		v1.ResourceCPU: "8", v1.ResourcePods: "10", "nvidia.com/gpu": "1", "example.com/dev": "1", "hugepages-2Mi": "1"}).Obj()
	ni := framework.NewNodeInfo()
	ni.SetNode(node)
	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				name := []v1.ResourceName{"nvidia.com/gpu", "example.com/dev", "hugepages-2Mi"}[(g+i)%3]
				pod := st.MakePod().Name("p").UID("p").Req(map[v1.ResourceName]string{v1.ResourceCPU: "1", name: "2"}).Obj()
				cs := framework.NewCycleState()
				ours.PreFilter(ctx, cs, pod, nil)
				if got, want := ours.Filter(ctx, cs, pod, ni), up.Filter(ctx, cs, pod, ni); !same(got, want) {
					errs <- fmt.Sprintf("%s: got %v, upstream %v", name, got, want)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if len(ours.scalars) != 3 {
		t.Errorf("%d names cached, want 3", len(ours.scalars))
	}
}
