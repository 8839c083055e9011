package gpufit

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	clientsetfake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
	configv1 "k8s.io/kube-scheduler/config/v1"
	fwk "k8s.io/kube-scheduler/framework"
	configtesting "k8s.io/kubernetes/pkg/scheduler/apis/config/testing"
	"k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/names"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	"k8s.io/kubernetes/pkg/scheduler/metrics"
	st "k8s.io/kubernetes/pkg/scheduler/testing"
	tk "k8s.io/kubernetes/test/utils/ktesting"
	"k8s.io/utils/ptr"
)

// The queue visits, for a bound pod that frees no GPU, only the pending pods
// some other plugin rejected: a pod GPUFit alone rejected is left out while
// it sits in the pool, and only then; a GPU pod's deletion visits everyone.
func TestNarrowBoundPodEvents(t *testing.T) {
	tCtx := tk.Init(t)
	logger, _ := ktesting.NewTestContext(t)
	nodes := []*v1.Node{gpuNode("n1", "1").Obj(), gpuNode("n2", "1").Obj()}
	e := newEnv(tCtx, t, nil, nodes, nil)
	n := e.pl.narrow
	if n == nil {
		t.Fatal("no narrowing with hints on")
	}
	reject := func(p *v1.Pod, n1, n2 string) {
		t.Helper()
		statuses := framework.NewDefaultNodeToStatus()
		statuses.Set("n1", fwk.NewStatus(fwk.Unschedulable, "x").WithPlugin(n1))
		statuses.Set("n2", fwk.NewStatus(fwk.UnschedulableAndUnresolvable, "y").WithPlugin(n2))
		e.pl.PostFilter(tCtx, framework.NewCycleState(), p, statuses)
	}
	arrive := func(p *v1.Pod) { n.observe(p); e.pl.PreEnqueue(tCtx, p) }

	// Before the queue ever ran PreEnqueue nothing could end an exclusion,
	// so nothing is excluded.
	early := wholePod("early", "1").Obj()
	n.observe(early)
	reject(early, Name, Name)
	if n.excluded != 0 {
		t.Fatalf("excluded %d pods before PreEnqueue ran", n.excluded)
	}

	var backlog []*v1.Pod
	for i := range narrowMinExcluded + 10 {
		p := wholePod(fmt.Sprintf("gpu-%03d", i), "1").Obj()
		arrive(p)
		reject(p, Name, Name)
		backlog = append(backlog, p)
	}
	cpuBlocked := st.MakePod().Name("cpu").UID("cpu").Req(map[v1.ResourceName]string{v1.ResourceCPU: "64"}).Obj()
	mixed := wholePod("mixed", "1").Obj()
	gang := wholePod("gang", "1").Obj()
	gang.Spec.SchedulingGroup = &v1.PodSchedulingGroup{PodGroupName: ptr.To("g")}
	for _, p := range []*v1.Pod{cpuBlocked, mixed, gang} {
		arrive(p)
	}
	reject(cpuBlocked, names.NodeResourcesFit, names.NodeResourcesFit)
	reject(mixed, Name, names.InterPodAffinity)
	// A taint elsewhere never resolves on a bound pod: still excluded.
	tainted := wholePod("tainted", "1").Obj()
	arrive(tainted)
	reject(tainted, Name, names.TaintToleration)
	reject(gang, Name, Name)

	key := func(p *v1.Pod) types.NamespacedName {
		return types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
	}
	check := func(step string, want ...*v1.Pod) {
		t.Helper()
		got := n.candidates()
		if got == nil {
			t.Fatalf("%s: no narrowing", step)
		}
		var wantKeys []types.NamespacedName
		for _, p := range want {
			wantKeys = append(wantKeys, key(p))
		}
		cmp := func(a, b types.NamespacedName) int { return strings.Compare(a.String(), b.String()) }
		got = slices.Clone(got)
		slices.SortFunc(got, cmp)
		slices.SortFunc(wantKeys, cmp)
		if !slices.Equal(got, wantKeys) {
			t.Errorf("%s: candidates %v, want %v", step, got, wantKeys)
		}
	}
	check("after the rejections", early, cpuBlocked, mixed, gang)

	// What the exclusion stands on: GPUFit's own hint skips an excluded
	// pod for a CPU pod's deletion, and the narrowing names the same pods.
	cpuGone := st.MakePod().Name("cpu-gone").UID("cpu-gone").Node("n1").Req(map[v1.ResourceName]string{v1.ResourceCPU: "1"}).Obj()
	for _, p := range backlog {
		if h, _ := e.pl.isSchedulableAfterPodDelete(logger, p, cpuGone, nil); h != fwk.QueueSkip {
			t.Fatalf("%s excluded, but GPUFit's hint queues it for a CPU pod's deletion", p.Name)
		}
	}
	r, _ := e.pl.narrowAfterPodDelete(logger, cpuGone, nil)
	if r.AllPods || len(r.Pods) != 4 {
		t.Errorf("CPU pod deleted: %+v, want the 4 candidates", r)
	}
	r, _ = e.pl.narrowAfterPodAdd(logger, nil, cpuGone)
	if r.AllPods || len(r.Pods) != 4 {
		t.Errorf("pod bound: %+v, want the 4 candidates", r)
	}
	gpuGone := wholePod("gpu-gone", "1").Node("n1").Obj()
	if r, _ = e.pl.narrowAfterPodDelete(logger, gpuGone, nil); !r.AllPods {
		t.Errorf("a GPU pod's deletion must visit every pod: %+v", r)
	}

	// Leaving the pool (PreEnqueue) or a new attempt (PreFilter) ends the
	// exclusion; a pod that is bound or gone is forgotten.
	e.pl.PreEnqueue(tCtx, backlog[0])
	e.pl.PreFilter(tCtx, framework.NewCycleState(), backlog[1], nil)
	bound := backlog[2].DeepCopy()
	bound.Spec.NodeName = "n1"
	n.observe(bound)
	n.forget(cpuBlocked)
	check("after they moved", early, mixed, gang, backlog[0], backlog[1])

	// Too few exclusions for the narrowing to pay: every pod is visited.
	for _, p := range backlog[3:20] {
		e.pl.PreEnqueue(tCtx, p)
	}
	if got := n.candidates(); got != nil {
		t.Errorf("%d excluded: narrowing to %d pods, want all", n.excluded, len(got))
	}
}

// A profile that names its extension points without PreEnqueue would never
// end an exclusion: nothing is excluded there.
func TestNarrowNeedsPreEnqueue(t *testing.T) {
	tCtx := tk.Init(t)
	nodes := []*v1.Node{gpuNode("n1", "1").Obj()}
	e := newEnv(tCtx, t, nil, nodes, nil)
	for i := range 2 * narrowMinExcluded {
		p := wholePod(fmt.Sprintf("p%d", i), "1").Obj()
		e.pl.narrow.observe(p)
		statuses := framework.NewDefaultNodeToStatus()
		statuses.Set("n1", fwk.NewStatus(fwk.Unschedulable).WithPlugin(Name))
		e.pl.PostFilter(tCtx, framework.NewCycleState(), p, statuses)
	}
	if got := e.pl.narrow.candidates(); got != nil || e.pl.narrow.excluded != 0 {
		t.Errorf("excluded %d pods with no PreEnqueue: candidates %v", e.pl.narrow.excluded, got)
	}
}

// The in-tree filters the narrowing trusts register no event that a bound
// pod's arrival or deletion matches; a filter that does (NodeResourcesFit:
// a deleted pod frees CPU) is not trusted.
func TestBlindToBoundPods(t *testing.T) {
	tCtx := tk.Init(t)
	metrics.Register() // the framework counts its plugins
	cfg := configtesting.V1ToInternalWithDefaults(t, configv1.KubeSchedulerConfiguration{})
	client := clientsetfake.NewClientset()
	fh, err := frameworkruntime.NewFramework(tCtx, plugins.NewInTreeRegistry(), &cfg.Profiles[0],
		frameworkruntime.WithClientSet(client),
		frameworkruntime.WithInformerFactory(informers.NewSharedInformerFactory(client, 0)),
		frameworkruntime.WithSnapshotSharedLister(cache.NewEmptySnapshot()))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, ext := range fh.EnqueueExtensions() {
		name := ext.(fwk.Plugin).Name()
		events, err := ext.EventsToRegister(tCtx)
		if err != nil {
			t.Fatal(err)
		}
		sees := false
		for _, ev := range events {
			for _, bound := range []fwk.ClusterEvent{{Resource: fwk.AssignedPod, ActionType: fwk.Add}, {Resource: fwk.AssignedPod, ActionType: fwk.Delete}} {
				sees = sees || framework.MatchClusterEvents(ev.Event, bound)
			}
		}
		seen[name] = true
		if sees && blindToBoundPods[name] {
			t.Errorf("%s registers bound-pod events, but the narrowing trusts it to ignore them", name)
		}
	}
	for name := range blindToBoundPods {
		if !seen[name] {
			t.Errorf("%s is trusted but not in the default profile: cannot check it", name)
		}
	}
	if blindToBoundPods[names.NodeResourcesFit] || !seen[names.NodeResourcesFit] {
		t.Errorf("NodeResourcesFit must be seen and not trusted")
	}
}
