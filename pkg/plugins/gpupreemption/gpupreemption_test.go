package gpupreemption

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	policy "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/informers"
	clientsetfake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	fwk "k8s.io/kube-scheduler/framework"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	internalcache "k8s.io/kubernetes/pkg/scheduler/backend/cache"
	internalqueue "k8s.io/kubernetes/pkg/scheduler/backend/queue"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/defaultbinder"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/defaultpreemption"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	plfeature "k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/noderesources"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/queuesort"
	"k8s.io/kubernetes/pkg/scheduler/framework/preemption"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	"k8s.io/kubernetes/pkg/scheduler/metrics"
	st "k8s.io/kubernetes/pkg/scheduler/testing"
	tf "k8s.io/kubernetes/pkg/scheduler/testing/framework"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config/scheme"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/plugins/gpufit"
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func gpuNode(name, gpus string) *v1.Node {
	return st.MakeNode().Name(name).Capacity(map[v1.ResourceName]string{
		v1.ResourceCPU: "64", v1.ResourceMemory: "256Gi", v1.ResourcePods: "110", gpu.ResourceNvidiaGPU: gpus,
	}).Obj()
}

// share is a low-priority share on one device of a node, started at the
// given minute (upstream reprieves the oldest first).
func share(name, node string, dev, milli, minute int) *v1.Pod {
	return st.MakePod().Namespace("ns").Name(name).UID(name).Node(node).Priority(0).
		Req(map[v1.ResourceName]string{v1.ResourceCPU: "1"}).
		Annotation(gpu.AnnotationMilli, itoa(milli)).
		Annotation(gpu.AnnotationAssignment, node+":"+itoa(dev)+"="+itoa(milli)).
		StartTime(metav1.NewTime(epoch.Add(time.Duration(minute) * time.Minute))).Obj()
}

func itoa(i int) string { return strconv.Itoa(i) }

func preemptor(name string, gpus string, milli int) *v1.Pod {
	w := st.MakePod().Namespace("ns").Name(name).UID(name).Priority(1000).Req(map[v1.ResourceName]string{v1.ResourceCPU: "1"})
	if gpus != "" {
		w = w.Req(map[v1.ResourceName]string{v1.ResourceCPU: "1", gpu.ResourceNvidiaGPU: gpus})
	}
	if milli > 0 {
		w = w.Annotation(gpu.AnnotationMilli, itoa(milli))
	}
	return w.Obj()
}

// dryRun returns the victims per candidate node that a preemption plugin's
// dry run chooses, on a real framework with GPUFit and NodeResourcesFit.
func dryRun(t *testing.T, build func(ctx context.Context, h fwk.Handle) *preemption.Evaluator, pod *v1.Pod, nodes []*v1.Node, pods []*v1.Pod, pdbs []*policy.PodDisruptionBudget) map[string][]string {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	objs := []runtime.Object{pod}
	for _, p := range pods {
		objs = append(objs, p)
	}
	for _, n := range nodes {
		objs = append(objs, n)
	}
	fh, snapshot, factory := newFramework(ctx, t, pods, nodes, objs...)
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	ev := build(ctx, fh)
	state := framework.NewCycleState()
	if _, s, _ := fh.RunPreFilterPlugins(ctx, state, pod); !s.IsSuccess() {
		t.Fatalf("PreFilter: %v", s)
	}
	infos, _ := snapshot.NodeInfos().List()
	offset, n := ev.GetOffsetAndNumCandidates(int32(len(infos)))
	candidates, _, err := ev.DryRunPreemption(ctx, state, pod, infos, pdbs, offset, n)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, c := range candidates {
		for _, p := range c.Victims().Pods {
			got[c.Name()] = append(got[c.Name()], p.Name)
		}
		slices.Sort(got[c.Name()])
		if n := c.Victims().NumPDBViolations; n > 0 {
			got[c.Name()] = append(got[c.Name()], "violations="+strconv.FormatInt(n, 10))
		}
	}
	return got
}

// newFramework is a real framework with NodeResourcesFit and GPUFit over
// the given snapshot, its informers fed by a fake clientset of objs (not
// started: plugins built on it register theirs first).
func newFramework(ctx context.Context, t *testing.T, pods []*v1.Pod, nodes []*v1.Node, objs ...runtime.Object) (framework.Framework, *internalcache.Snapshot, informers.SharedInformerFactory) {
	t.Helper()
	cs := clientsetfake.NewClientset(objs...)
	factory := informers.NewSharedInformerFactory(cs, 0)
	args := scheme.DefaultGPUFitArgs()
	args.AccountingOnlySharing = true
	args.Requeue.Enabled = false
	gpuFit := func(ctx context.Context, _ runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
		return gpufit.New(ctx, args, h)
	}
	snapshot := internalcache.NewSnapshot(pods, nodes)
	fh, err := tf.NewFramework(ctx, []tf.RegisterPluginFunc{
		tf.RegisterPluginAsExtensions(noderesources.Name, frameworkruntime.FactoryAdapter(feature.Features{}, noderesources.NewFit), "Filter", "PreFilter"),
		tf.RegisterPluginAsExtensions(gpufit.Name, gpuFit, "Filter", "PreFilter"),
		tf.RegisterQueueSortPlugin(queuesort.Name, queuesort.New),
		tf.RegisterBindPlugin(defaultbinder.Name, defaultbinder.New),
	}, "",
		frameworkruntime.WithClientSet(cs),
		frameworkruntime.WithPodNominator(internalqueue.NewSchedulingQueue(nil, factory)),
		frameworkruntime.WithSnapshotSharedLister(snapshot),
		frameworkruntime.WithMutableSnapshotLister(snapshot),
		frameworkruntime.WithInformerFactory(factory),
		frameworkruntime.WithLogger(klog.FromContext(ctx)))
	if err != nil {
		t.Fatal(err)
	}
	return fh, snapshot, factory
}

func ours(ctx context.Context, h fwk.Handle) *preemption.Evaluator {
	pl, err := New(ctx, nil, h)
	if err != nil {
		panic(err)
	}
	return pl.(*GPUPreemption).Evaluator
}

func upstream(ctx context.Context, h fwk.Handle) *preemption.Evaluator {
	pl, err := defaultpreemption.New(ctx, &schedconfig.DefaultPreemptionArgs{MinCandidateNodesPercentage: 10, MinCandidateNodesAbsolute: 100}, h,
		plfeature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate))
	if err != nil {
		panic(err)
	}
	return pl.Evaluator
}

func TestDeviceLevelVictims(t *testing.T) {
	metrics.Register()
	n1 := []*v1.Node{gpuNode("n1", "2")}
	tests := map[string]struct {
		pod   *v1.Pod
		nodes []*v1.Node
		pods  []*v1.Pod
		pdbs  []*policy.PodDisruptionBudget
		want  map[string][]string
		// differs: plain upstream chooses otherwise (the case shows the
		// planner at work, and fails without it).
		differs bool
	}{
		// Upstream reprieves the oldest share first, on device 0, and then
		// needs both shares of device 1.
		"whole GPU: the share alone on its device": {
			pod: preemptor("p", "1", 0), nodes: n1,
			pods: []*v1.Pod{share("old", "n1", 0, 300, 0), share("b", "n1", 1, 300, 1), share("c", "n1", 1, 300, 2)},
			want: map[string][]string{"n1": {"old"}}, differs: true,
		},
		// Upstream reprieves by age: it keeps a, e and b, then cannot keep c
		// or d. One pod, e, frees enough on its own.
		"share: one pod where upstream takes two": {
			pod: preemptor("p", "", 500), nodes: n1,
			pods: []*v1.Pod{share("a", "n1", 0, 200, 0), share("e", "n1", 1, 700, 1), share("b", "n1", 0, 200, 2),
				share("c", "n1", 0, 200, 3), share("d", "n1", 0, 200, 4)},
			want: map[string][]string{"n1": {"e"}}, differs: true,
		},
		"share: the smallest pod that frees enough": {
			pod: preemptor("p", "", 300), nodes: n1,
			pods: []*v1.Pod{share("big", "n1", 0, 600, 0), share("small", "n1", 0, 300, 1), share("c", "n1", 1, 800, 2)},
			want: map[string][]string{"n1": {"small"}},
		},
		// A budget that allows no disruption protects the cheap share; the
		// device with two unprotected shares goes instead.
		"a PodDisruptionBudget moves the victims": {
			pod: preemptor("p", "1", 0), nodes: n1,
			pods: []*v1.Pod{
				withLabel(share("guarded", "n1", 0, 300, 0), "app", "guarded"),
				share("b", "n1", 1, 300, 1), share("c", "n1", 1, 300, 2)},
			pdbs: []*policy.PodDisruptionBudget{pdb("app", "guarded", 0)},
			want: map[string][]string{"n1": {"b", "c"}},
		},
		// One budget allows one disruption and covers all three: evicting
		// the lone share breaks nothing. (The reprieve order tries the
		// planned victim last; the budget is charged to the victims alone.)
		"a budget that allows one disruption": {
			pod: preemptor("p", "1", 0), nodes: n1,
			pods: []*v1.Pod{
				withLabel(share("a", "n1", 0, 300, 0), "app", "guarded"),
				withLabel(share("b", "n1", 1, 300, 1), "app", "guarded"), withLabel(share("c", "n1", 1, 300, 2), "app", "guarded")},
			pdbs: []*policy.PodDisruptionBudget{pdb("app", "guarded", 1)},
			want: map[string][]string{"n1": {"a"}},
		},
		// Three devices with one, one and two shares. The lone z is the
		// cheapest by milli but its budget allows no disruption: the plan
		// takes w (a planner blind to budgets would take z). Upstream
		// reprieves the oldest first, z and w, and then needs x and y.
		"a budget: the other lone share, where upstream takes two": {
			pod: preemptor("p", "1", 0), nodes: []*v1.Node{gpuNode("n1", "3")},
			pods: []*v1.Pod{
				withLabel(share("z", "n1", 0, 200, 0), "app", "guarded"), share("w", "n1", 2, 300, 1),
				share("x", "n1", 1, 300, 2), share("y", "n1", 1, 300, 3)},
			pdbs: []*policy.PodDisruptionBudget{pdb("app", "guarded", 0)},
			want: map[string][]string{"n1": {"w"}}, differs: true,
		},
		// Nothing to plan: upstream's choice (want nil).
		"CPU-only preemptor": {
			pod: st.MakePod().Namespace("ns").Name("p").UID("p").Priority(1000).Req(map[v1.ResourceName]string{v1.ResourceCPU: "63"}).Obj(), nodes: n1,
			pods: []*v1.Pod{share("a", "n1", 0, 300, 0), share("b", "n1", 1, 300, 1)},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := dryRun(t, ours, tc.pod, tc.nodes, tc.pods, tc.pdbs)
			up := dryRun(t, upstream, tc.pod, tc.nodes, tc.pods, tc.pdbs)
			t.Logf("upstream DefaultPreemption: %v", up)
			want := tc.want
			if want == nil {
				want = up
			}
			if !equal(got, want) {
				t.Errorf("victims %v, want %v", got, want)
			}
			if tc.differs && equal(up, want) {
				t.Errorf("upstream chooses %v too: the case cannot fail without the planner", up)
			}
		})
	}
}

func withLabel(p *v1.Pod, k, v string) *v1.Pod {
	if p.Labels == nil {
		p.Labels = map[string]string{}
	}
	p.Labels[k] = v
	return p
}

func pdb(k, v string, allowed int32) *policy.PodDisruptionBudget {
	return &policy.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "pdb"},
		Spec:       policy.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{k: v}}},
		Status:     policy.PodDisruptionBudgetStatus{DisruptionsAllowed: allowed},
	}
}

func equal(a, b map[string][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

// A nominated preemptor retried while its victim still terminates: upstream
// changes nothing ("a terminating pod on the nominated node"), and the
// devices the victim frees stay held for the preemptor, not dropped for the
// nominee fallback's tightest free ones. When upstream clears the
// nomination (nothing can be evicted any more), the hold goes with it.
func TestHoldKeptWhileVictimsTerminate(t *testing.T) {
	metrics.Register()
	for name, tc := range map[string]struct {
		terminating bool
		priority    int32 // the victim's
		keep        bool
	}{
		"victim terminating: held":           {terminating: true, keep: true},
		"nothing to evict: cleared, dropped": {priority: 2000},
	} {
		t.Run(name, func(t *testing.T) {
			testHold(t, tc.terminating, tc.priority, tc.keep)
		})
	}
}

func testHold(t *testing.T, terminating bool, priority int32, keep bool) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	nodes := []*v1.Node{gpuNode("n1", "2")}
	victim := share("victim", "n1", 1, 600, 0)
	victim.Spec.Priority = &priority
	if terminating {
		victim.DeletionTimestamp = &metav1.Time{Time: epoch}
		victim.Status.Conditions = []v1.PodCondition{{Type: v1.DisruptionTarget, Status: v1.ConditionTrue, Reason: v1.PodReasonPreemptionByScheduler}}
	}
	other := share("other", "n1", 0, 300, 1)
	other.Spec.Priority = &priority
	pod := preemptor("p", "", 500)
	pod.Status.NominatedNodeName = "n1"
	pods := []*v1.Pod{victim, other}
	fh, _, factory := newFramework(ctx, t, pods, nodes, pod, victim, other, nodes[0])
	pl, err := New(ctx, nil, fh)
	if err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	gp := pl.(*GPUPreemption)
	tr := gp.shared.Tracker()
	if tr == nil {
		t.Fatal("no tracker: GPUFit is not in the profile")
	}
	// The first preemption chose device 1, the victim's.
	freed := gpu.Choice{Mask: 1 << 1, Milli: 500}
	tr.Nominate(pod.UID, "n1", freed)

	state := framework.NewCycleState()
	if _, s, _ := fh.RunPreFilterPlugins(ctx, state, pod); !s.IsSuccess() {
		t.Fatalf("PreFilter: %v", s)
	}
	m := framework.NewDefaultNodeToStatus()
	m.Set("n1", fwk.NewStatus(fwk.Unschedulable, "no device with 500 milli free"))
	res, status := gp.PostFilter(ctx, state, pod, m)
	changed := res != nil && res.NominatingInfo.Mode() != fwk.ModeNoop
	if changed == keep {
		t.Fatalf("nomination changed: %v, want %v (%+v, %v)", changed, !keep, res, status)
	}
	node, got, ok := tr.Nomination(pod.UID)
	if keep && (!ok || node != "n1" || got.Mask != 1<<1 || got.Milli != 500) {
		t.Errorf("held %v on %q (%v), want device 1 on n1 (status %v)", got, node, ok, status)
	}
	if !keep && ok {
		t.Errorf("still held %v on %q after the nomination was cleared (status %v)", got, node, status)
	}
}
