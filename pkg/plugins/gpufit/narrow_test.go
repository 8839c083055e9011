package gpufit

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	clientsetfake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
	configv1 "k8s.io/kube-scheduler/config/v1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
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

	"github.com/gpu-scheduler/gpu-scheduler/pkg/plugins/gpupreemption"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/requeue"
)

// The queue visits, for a bound pod that frees no GPU, only the pending pods
// that may be in its pool with a rejector that looks at bound pods: a pod
// GPUFit (or a filter blind to bound pods) alone rejected is left out while
// it sits there, and only then; so is a pod in the active or backoff queue.
// A GPU pod's deletion visits everyone.
func TestNarrowBoundPodEvents(t *testing.T) {
	tCtx := tk.Init(t)
	logger, _ := ktesting.NewTestContext(t)
	nodes := []*v1.Node{gpuNode("n1", "1").Obj(), gpuNode("n2", "1").Obj()}
	e := newEnv(tCtx, t, nil, nodes, nil)
	n := e.pl.narrow
	if n == nil {
		t.Fatal("no narrowing with hints on")
	}
	// newEnv's framework lists no plugins; TestNarrowNeedsItsExtensionPoints
	// checks the real profiles.
	n.check.Do(func() {})
	n.usable = true
	store := e.factory.Core().V1().Pods().Informer().GetStore()
	seen := func(p *v1.Pod) {
		t.Helper()
		if err := store.Add(p); err != nil {
			t.Fatal(err)
		}
		n.observe(p)
	}
	reject := func(p *v1.Pod, n1, n2 string) {
		t.Helper()
		e.pl.PreFilter(tCtx, framework.NewCycleState(), p, nil)
		statuses := framework.NewDefaultNodeToStatus()
		statuses.Set("n1", fwk.NewStatus(fwk.Unschedulable, "x").WithPlugin(n1))
		statuses.Set("n2", fwk.NewStatus(fwk.UnschedulableAndUnresolvable, "y").WithPlugin(n2))
		e.pl.PostFilter(tCtx, framework.NewCycleState(), p, statuses)
	}
	arrive := func(p *v1.Pod) { seen(p); e.pl.PreEnqueue(tCtx, p) }

	var backlog []*v1.Pod
	for i := range narrowMinSaved + 16 {
		p := wholePod(fmt.Sprintf("gpu-%03d", i), "1").UID(fmt.Sprintf("gpu-%03d", i)).Obj()
		arrive(p)
		reject(p, Name, Name)
		backlog = append(backlog, p)
	}
	cpuBlocked := st.MakePod().Name("cpu").UID("cpu").Req(map[v1.ResourceName]string{v1.ResourceCPU: "64"}).Obj()
	mixed := wholePod("mixed", "1").UID("mixed").Obj()
	tainted := wholePod("tainted", "1").UID("tainted").Obj()
	gang := wholePod("gang", "1").UID("gang").Obj()
	gang.Spec.SchedulingGroup = &v1.PodSchedulingGroup{PodGroupName: ptr.To("g")}
	queued := wholePod("queued", "1").UID("queued").Obj()
	gated := wholePod("gated", "1").UID("gated").Obj()
	preemptor := wholePod("preemptor", "1").UID("preemptor").Obj()
	for _, p := range []*v1.Pod{cpuBlocked, mixed, tainted, gang, queued, preemptor} {
		arrive(p)
	}
	reject(cpuBlocked, names.NodeResourcesFit, names.NodeResourcesFit)
	reject(mixed, Name, names.InterPodAffinity)
	// A taint elsewhere never resolves on a bound pod: left out.
	reject(tainted, Name, names.TaintToleration)
	reject(gang, Name, Name)
	// Gated by a PreEnqueue plugin that ran before GPUFit's: never seen.
	seen(gated)
	// Its attempt nominated victims (no PostFilter of GPUFit): it may come
	// back gated on their deletion, whatever GPUFit's PreEnqueue saw.
	e.pl.PreFilter(tCtx, framework.NewCycleState(), preemptor, nil)
	e.pl.PreEnqueue(tCtx, preemptor)

	key := func(p *v1.Pod) types.NamespacedName {
		return types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
	}
	// What the queue was handed stays as it was while the states change
	// (it reads it under its own lock, not the narrower's).
	var handed, handedCopy []types.NamespacedName
	check := func(step string, want ...*v1.Pod) {
		t.Helper()
		if !slices.Equal(handed, handedCopy) {
			t.Errorf("%s: the candidates handed out before changed to %v, were %v", step, handed, handedCopy)
		}
		named := 0
		for k, e := range n.state {
			if e.st.named() {
				named++
				if i, ok := n.namedIdx[k]; !ok || n.named[i] != k {
					t.Errorf("%s: %v named but not indexed", step, k)
				}
			}
		}
		if named != len(n.named) || named != len(n.namedIdx) {
			t.Errorf("%s: %d named in state, %d listed, %d indexed", step, named, len(n.named), len(n.namedIdx))
		}
		got := n.candidates()
		if got == nil {
			t.Fatalf("%s: no narrowing", step)
		}
		handed, handedCopy = got, slices.Clone(got)
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
	check("after the rejections", cpuBlocked, mixed, gang, gated, preemptor)

	// What the exclusion stands on: GPUFit's own hint skips a left-out
	// pod for a CPU pod's deletion.
	cpuGone := st.MakePod().Name("cpu-gone").UID("cpu-gone").Node("n1").Req(map[v1.ResourceName]string{v1.ResourceCPU: "1"}).Obj()
	for _, p := range append(backlog, tainted) {
		if h, _ := e.pl.isSchedulableAfterPodDelete(logger, p, cpuGone, nil); h != fwk.QueueSkip {
			t.Fatalf("%s left out, but GPUFit's hint queues it for a CPU pod's deletion", p.Name)
		}
	}
	r, _ := e.pl.narrowAfterPodDelete(logger, cpuGone, nil)
	if r.AllPods || len(r.Pods) != 5 {
		t.Errorf("CPU pod deleted: %+v, want the 5 candidates", r)
	}
	r, _ = e.pl.narrowAfterPodAdd(logger, nil, cpuGone)
	if r.AllPods || len(r.Pods) != 5 {
		t.Errorf("pod bound: %+v, want the 5 candidates", r)
	}
	gpuGone := wholePod("gpu-gone", "1").Node("n1").Obj()
	if r, _ = e.pl.narrowAfterPodDelete(logger, gpuGone, nil); !r.AllPods {
		t.Errorf("a GPU pod's deletion must visit every pod: %+v", r)
	}
	// A nominated GPU pod deleted (or its nomination changed) frees what
	// the framework counted for it on that node.
	nominated := wholePod("nominated", "1").Obj()
	nominated.Status.NominatedNodeName = "n1"
	if r, _ = e.pl.narrowAfterPodDelete(logger, nominated, nil); !r.AllPods {
		t.Errorf("a nominated GPU pod's deletion must visit every pod: %+v", r)
	}
	if h, _ := e.pl.isSchedulableAfterPodDelete(logger, backlog[0], nominated, nil); h == fwk.QueueSkip {
		t.Errorf("GPUFit's hint skips a nominated GPU pod's deletion")
	}

	// Leaving the pool (PreEnqueue) ends the exclusion without naming the
	// pod (it is queued); a new attempt (PreFilter) names it until its
	// PostFilter; a pod bound or gone is forgotten.
	e.pl.PreEnqueue(tCtx, backlog[0])
	e.pl.PreFilter(tCtx, framework.NewCycleState(), backlog[1], nil)
	bound := backlog[2].DeepCopy()
	bound.Spec.NodeName = "n1"
	n.observe(bound)
	n.forget(cpuBlocked)
	check("after they moved", mixed, gang, gated, preemptor, backlog[1])

	// A pod deleted during its attempt, and another of the same name: the
	// old one's PostFilter writes nothing over the new one.
	again := backlog[3].DeepCopy()
	again.UID = "again"
	if err := store.Update(again); err != nil {
		t.Fatal(err)
	}
	n.observe(again)
	e.pl.PostFilter(tCtx, framework.NewCycleState(), backlog[3], framework.NewDefaultNodeToStatus())
	check("after a pod was replaced", mixed, gang, gated, preemptor, backlog[1], again)

	// Reserved, it is in flight while it binds: not named (the queue
	// replays to it every event of its flight if it comes back). A failure
	// after Reserve runs Unreserve, which names it again.
	binding := wholePod("binding", "1").UID("binding").Obj()
	arrive(binding)
	cs := framework.NewCycleState()
	e.pl.PreFilter(tCtx, cs, binding, nil)
	check("attempting", mixed, gang, gated, preemptor, backlog[1], again, binding)
	if s := e.pl.Reserve(tCtx, cs, binding, "n1"); !s.IsSuccess() {
		t.Fatalf("Reserve: %v", s)
	}
	check("reserved", mixed, gang, gated, preemptor, backlog[1], again)
	// n1's one GPU is reserved: another pod's Reserve there fails, and the
	// framework's Unreserve leaves it named.
	late := wholePod("late", "1").UID("late").Obj()
	arrive(late)
	csLate := framework.NewCycleState()
	e.pl.PreFilter(tCtx, csLate, late, nil)
	if s := e.pl.Reserve(tCtx, csLate, late, "n1"); s.IsSuccess() {
		t.Fatal("Reserve of a reserved GPU passed")
	}
	e.pl.Unreserve(tCtx, csLate, late, "n1")
	check("a Reserve failed", mixed, gang, gated, preemptor, backlog[1], again, late)
	e.pl.Unreserve(tCtx, cs, binding, "n1")
	check("unreserved", mixed, gang, gated, preemptor, backlog[1], again, binding, late)
	// Reserved again and bound: forgotten once the informer sees it bound.
	if s := e.pl.Reserve(tCtx, cs, binding, "n1"); !s.IsSuccess() {
		t.Fatalf("Reserve: %v", s)
	}
	boundNow := binding.DeepCopy()
	boundNow.Spec.NodeName = "n1"
	if err := store.Update(boundNow); err != nil {
		t.Fatal(err)
	}
	n.observe(boundNow)
	check("bound", mixed, gang, gated, preemptor, backlog[1], again, late)
	if _, ok := n.state[key(binding)]; ok {
		t.Error("a bound pod is still tracked")
	}
	// Deleted while binding: its Unreserve writes nothing back.
	e.pl.PreFilter(tCtx, csLate, late, nil)
	if s := e.pl.Reserve(tCtx, csLate, late, "n2"); !s.IsSuccess() {
		t.Fatalf("Reserve: %v", s)
	}
	if err := store.Delete(late); err != nil {
		t.Fatal(err)
	}
	n.forget(late)
	e.pl.Unreserve(tCtx, csLate, late, "n2")
	check("deleted while binding", mixed, gang, gated, preemptor, backlog[1], again)
	if _, ok := n.state[key(late)]; ok {
		t.Error("a pod deleted while binding is tracked again after its Unreserve")
	}
	// A gang's pod stays named through Reserve: its gating plugin reacts
	// to bound pods.
	csGang := framework.NewCycleState()
	e.pl.PreFilter(tCtx, csGang, gang, nil)
	if s := e.pl.Reserve(tCtx, csGang, gang, "n2"); !s.IsSuccess() {
		t.Fatalf("Reserve: %v", s)
	}
	check("gang reserved", mixed, gang, gated, preemptor, backlog[1], again)
	e.pl.Unreserve(tCtx, csGang, gang, "n2")

	// Too few left out for the narrowing to pay: every pod is visited.
	for _, p := range backlog[4:40] {
		e.pl.PreEnqueue(tCtx, p)
	}
	if got := n.candidates(); got != nil {
		t.Errorf("%d left out: narrowing to %d pods, want all", n.blind, len(got))
	}
}

// The states are kept by GPUFit's PreEnqueue, PreFilter and PostFilter: in
// a profile that runs GPUFit through multiPoint the narrowing works; in one
// that names extension points without them, nothing is left out.
func TestNarrowNeedsItsExtensionPoints(t *testing.T) {
	tCtx := tk.Init(t)
	metrics.Register()
	for name, tc := range map[string]struct {
		plugins *config.Plugins
		want    bool
	}{
		"multiPoint": {&config.Plugins{MultiPoint: config.PluginSet{Enabled: []config.Plugin{{Name: Name}}}}, true},
		// A preemptor that nominated victims must not reach GPUFit's
		// PostFilter: it may come back gated on their deletion.
		"PostFilter after DefaultPreemption": {&config.Plugins{
			PreEnqueue: config.PluginSet{Enabled: []config.Plugin{{Name: Name}}},
			PreFilter:  config.PluginSet{Enabled: []config.Plugin{{Name: Name}}},
			PostFilter: config.PluginSet{Enabled: []config.Plugin{{Name: names.DefaultPreemption}, {Name: Name}}},
		}, true},
		"PostFilter before DefaultPreemption": {&config.Plugins{
			PreEnqueue: config.PluginSet{Enabled: []config.Plugin{{Name: Name}}},
			PreFilter:  config.PluginSet{Enabled: []config.Plugin{{Name: Name}}},
			PostFilter: config.PluginSet{Enabled: []config.Plugin{{Name: Name}, {Name: names.DefaultPreemption}}},
		}, false},
		"PostFilter after GPUPreemption": {&config.Plugins{
			PreEnqueue: config.PluginSet{Enabled: []config.Plugin{{Name: Name}}},
			PreFilter:  config.PluginSet{Enabled: []config.Plugin{{Name: Name}}},
			PostFilter: config.PluginSet{Enabled: []config.Plugin{{Name: preemptionPlugin}, {Name: Name}}},
		}, true},
		"PostFilter before GPUPreemption": {&config.Plugins{
			PreEnqueue: config.PluginSet{Enabled: []config.Plugin{{Name: Name}}},
			PreFilter:  config.PluginSet{Enabled: []config.Plugin{{Name: Name}}},
			PostFilter: config.PluginSet{Enabled: []config.Plugin{{Name: Name}, {Name: preemptionPlugin}}},
		}, false},
		"filters only": {&config.Plugins{
			PreFilter: config.PluginSet{Enabled: []config.Plugin{{Name: Name}}},
			Filter:    config.PluginSet{Enabled: []config.Plugin{{Name: Name}}},
		}, false},
	} {
		t.Run(name, func(t *testing.T) {
			client := clientsetfake.NewClientset()
			var pl *GPUFit
			registry := plugins.NewInTreeRegistry()
			registry[Name] = func(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
				p, err := New(ctx, obj, h)
				if err == nil {
					pl = p.(*GPUFit)
				}
				return p, err
			}
			registry[preemptionPlugin] = gpupreemption.New
			tc.plugins.QueueSort.Enabled = []config.Plugin{{Name: names.PrioritySort}}
			tc.plugins.Bind.Enabled = []config.Plugin{{Name: names.DefaultBinder}}
			profile := &config.KubeSchedulerProfile{SchedulerName: "gpu-scheduler", Plugins: tc.plugins,
				PluginConfig: []config.PluginConfig{{Name: Name, Args: accountingArgs()},
					{Name: names.DefaultPreemption, Args: &config.DefaultPreemptionArgs{MinCandidateNodesPercentage: 10, MinCandidateNodesAbsolute: 100}}}}
			if _, err := frameworkruntime.NewFramework(tCtx, registry, profile,
				frameworkruntime.WithClientSet(client),
				frameworkruntime.WithInformerFactory(informers.NewSharedInformerFactory(client, 0)),
				frameworkruntime.WithSnapshotSharedLister(cache.NewEmptySnapshot())); err != nil {
				t.Fatal(err)
			}
			if got := pl.narrow.isUsable(); got != tc.want {
				t.Errorf("usable %v, want %v", got, tc.want)
			}
		})
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
	// GPUDynamicResources is the in-tree plugin under another name (its
	// events are DynamicResources', checked above).
	if blindToBoundPods[requeue.GPUDynamicResourcesName] != blindToBoundPods[names.DynamicResources] {
		t.Errorf("GPUDynamicResources is trusted as DynamicResources is not")
	}
	seen[requeue.GPUDynamicResourcesName] = true
	for name := range blindToBoundPods {
		if !seen[name] {
			t.Errorf("%s is trusted but not in the default profile: cannot check it", name)
		}
	}
	if blindToBoundPods[names.NodeResourcesFit] || !seen[names.NodeResourcesFit] {
		t.Errorf("NodeResourcesFit must be seen and not trusted")
	}
	// NodeResourcesFitFast is NodeResourcesFit under another name.
	if blindToBoundPods[requeue.NodeResourcesFitFastName] {
		t.Errorf("NodeResourcesFitFast is trusted as NodeResourcesFit is not")
	}
}
