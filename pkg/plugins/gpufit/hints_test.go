package gpufit

import (
	"context"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2/ktesting"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/names"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	st "k8s.io/kubernetes/pkg/scheduler/testing"
	tk "k8s.io/kubernetes/test/utils/ktesting"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/plugins/internal/shared"
)

// EventsToRegister covers every way a GPUFit rejection can be resolved, each
// with a hint.
func TestEventsToRegister(t *testing.T) {
	tCtx := tk.Init(t)
	e := newEnv(tCtx, t, nil, nil, nil)
	events, err := e.pl.EventsToRegister(tCtx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[fwk.ClusterEvent]bool{
		// Not the general update of a bound pod: the queue would visit
		// every pending pod on every kubelet status update. Node
		// annotations only with a device agent that reports devices there.
		{Resource: fwk.Node, ActionType: fwk.Add | fwk.UpdateNodeAllocatable | fwk.UpdateNodeLabel | fwk.UpdateNodeAnnotation}: true,
		{Resource: fwk.AssignedPod, ActionType: fwk.Delete}:                                                                    true,
		{Resource: fwk.TargetPod, ActionType: fwk.Update}:                                                                      true,
		// Only to narrow the queue's walk (narrow.go); its hint skips.
		{Resource: fwk.AssignedPod, ActionType: fwk.Add}: true,
		// GPUs that DRA drivers publish, and claims that free them.
		{Resource: fwk.ResourceSlice, ActionType: fwk.Add | fwk.Update}:    true,
		{Resource: fwk.ResourceClaim, ActionType: fwk.Update | fwk.Delete}: true,
	}
	if len(events) != len(want) {
		t.Fatalf("got %d events", len(events))
	}
	for _, ev := range events {
		if !want[ev.Event] {
			t.Errorf("unexpected event %v", ev.Event)
		}
		if ev.QueueingHintFn == nil {
			t.Errorf("event %v has no hint", ev.Event)
		}
		if (ev.Event.Resource == fwk.AssignedPod) != (ev.PreQueueingHintFn != nil) {
			t.Errorf("event %v: PreQueueingHint %v, want one on bound pods only", ev.Event, ev.PreQueueingHintFn != nil)
		}
	}
	// Without a device agent, node annotations carry no device.
	plain := accountingArgs()
	plain.HAMi.Enabled = false
	events, _ = newEnv(tCtx, t, plain, nil, nil).pl.EventsToRegister(tCtx)
	for _, ev := range events {
		if ev.Event.Resource == fwk.Node && ev.Event.ActionType&fwk.UpdateNodeAnnotation != 0 {
			t.Errorf("node annotations registered without a device agent: %v", ev.Event)
		}
		if ev.Event.Resource == fwk.AssignedPod && ev.Event.ActionType&fwk.Update != 0 {
			t.Errorf("the general update of a bound pod is registered: %v", ev.Event)
		}
	}
	// With hints off (the measured baseline), every event requeues.
	args := accountingArgs()
	args.Requeue.QueueingHints = false
	off := newEnv(tCtx, t, args, nil, nil)
	events, _ = off.pl.EventsToRegister(tCtx)
	for _, ev := range events {
		if ev.QueueingHintFn != nil || ev.PreQueueingHintFn != nil {
			t.Errorf("hints disabled, but %v has one", ev.Event)
		}
	}
}

func TestQueueingHints(t *testing.T) {
	// full is a 2-GPU node with both devices taken; half has one free device.
	full := gpuNode("full", "2").Label(gpu.LabelGPUProduct, "A100").Obj()
	half := gpuNode("half", "2").Obj()
	a := boundPod("a", "full", "full:0=1000")
	b := boundPod("b", "full", "full:1=1000")
	c := boundPod("c", "half", "half:0=1000")
	cpuOnly := boundPod("cpu", "full", "")
	pending := wholePod("p", "1").Obj()
	pendingA100 := wholePod("p", "1").Annotation(gpu.AnnotationModel, "A100").Obj()
	pendingShared := sharedPod("s", "500").Obj()

	withAllocatable := func(n *v1.Node, count string) *v1.Node {
		n = n.DeepCopy()
		n.Status.Allocatable[gpuRes] = resource.MustParse(count)
		n.Status.Capacity[gpuRes] = resource.MustParse(count)
		return n
	}
	withLabel := func(n *v1.Node, k, v string) *v1.Node {
		n = n.DeepCopy()
		if n.Labels == nil {
			n.Labels = map[string]string{}
		}
		n.Labels[k] = v
		return n
	}
	withCPU := func(n *v1.Node, cpu string) *v1.Node {
		n = n.DeepCopy()
		n.Status.Allocatable[v1.ResourceCPU] = resource.MustParse(cpu)
		return n
	}
	withAnnotations := func(p *v1.Pod, kv ...string) *v1.Pod {
		p = p.DeepCopy()
		p.Annotations = map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			p.Annotations[kv[i]] = kv[i+1]
		}
		return p
	}

	tests := map[string]struct {
		pod *v1.Pod
		// The informer's view after the event.
		nodes   []*v1.Node
		pods    []*v1.Pod
		hint    string
		oldObj  interface{}
		newObj  interface{}
		want    fwk.QueueingHint
		noStore bool
	}{
		"node added with a free GPU": {pending, nil, nil, "node", nil, gpuNode("new", "1").Obj(), fwk.Queue, false},
		"node added without GPU":     {pending, nil, nil, "node", nil, st.MakeNode().Name("new").Obj(), fwk.QueueSkip, false},
		"node added, model not allowed": {pendingA100, nil, nil, "node", nil,
			gpuNode("new", "8").Label(gpu.LabelGPUProduct, "T4").Obj(), fwk.QueueSkip, false},
		"node added, too small for the request": {wholePod("p", "4").Obj(), nil, nil, "node", nil, gpuNode("new", "2").Obj(), fwk.QueueSkip, false},
		// The level matters, not the event: the node gained a device and
		// the pods on it leave that device free.
		"allocatable grew, a device is free": {pending, nil, []*v1.Pod{a, b}, "node", full, withAllocatable(full, "3"), fwk.Queue, false},
		"allocatable grew, still full": {pending, nil, []*v1.Pod{a, b, boundPod("x", "full", "full:2=1000")}, "node", full,
			withAllocatable(full, "3"), fwk.QueueSkip, false},
		"label now allows the model":    {pendingA100, nil, []*v1.Pod{c}, "node", half, withLabel(half, gpu.LabelGPUProduct, "A100"), fwk.Queue, false},
		"label change, node still full": {pendingA100, nil, []*v1.Pod{a, b}, "node", full, withLabel(full, "x", "y"), fwk.QueueSkip, false},
		// GPU Feature Discovery rewrites a timestamp every minute: no device
		// came or went, so nothing is judged, even where the pod would fit.
		"GFD timestamp label, a device free": {pending, nil, []*v1.Pod{c}, "node", half,
			withLabel(half, "nvidia.com/gfd.timestamp", "1764510000"), fwk.QueueSkip, false},
		"CPU allocatable changed, a device free": {pending, nil, []*v1.Pod{c}, "node", half, withCPU(half, "31"), fwk.QueueSkip, false},
		"GPU memory label came, a device free": {st.MakePod().Name("m").Namespace("default").UID("m").SchedulerName(gpu.SchedulerName).Annotation(gpu.AnnotationMemory, "20480").Obj(), nil, []*v1.Pod{c}, "node", half,
			withLabel(half, gpu.LabelGPUMemory, "81920"), fwk.Queue, false},

		"GPU pod deleted frees a device": {pending, []*v1.Node{full}, []*v1.Pod{b}, "delete", a, nil, fwk.Queue, false},
		"GPU pod deleted, share fits":    {pendingShared, []*v1.Node{full}, []*v1.Pod{b}, "delete", a, nil, fwk.Queue, false},
		"CPU pod deleted frees no GPU":   {pending, []*v1.Node{full}, []*v1.Pod{a, b}, "delete", cpuOnly, nil, fwk.QueueSkip, false},
		// Two pods were on full; the informer already shows only one gone
		// and one still there: the pending 2-GPU pod still does not fit.
		"deleted, still not enough":        {wholePod("p", "2").Obj(), []*v1.Node{full}, []*v1.Pod{b}, "delete", a, nil, fwk.QueueSkip, false},
		"deleted from a vanished node":     {pending, nil, nil, "delete", a, nil, fwk.QueueSkip, false},
		"deleted while reserved elsewhere": {pending, []*v1.Node{full}, []*v1.Pod{b}, "delete", a, nil, fwk.QueueSkip, true},

		"own request changed":   {pending, nil, nil, "target", pendingShared, withAnnotations(pendingShared, gpu.AnnotationMilli, "100"), fwk.Queue, false},
		"own annotation fixed":  {pending, nil, nil, "target", withAnnotations(pendingShared, gpu.AnnotationMilli, "x"), pendingShared, fwk.Queue, false},
		"own status update":     {pending, nil, nil, "target", pendingShared, pendingShared.DeepCopy(), fwk.QueueSkip, false},
		"own unrelated label":   {pending, nil, nil, "target", pending, st.MakePod().Name("p").Label("a", "b").Req(map[v1.ResourceName]string{v1.ResourceCPU: "1", gpuRes: "1"}).Obj(), fwk.QueueSkip, false},
		"own GPU count changed": {pending, nil, nil, "target", wholePod("p", "2").Obj(), pending, fwk.Queue, false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			logger, tCtx := ktesting.NewTestContext(t)
			e := newEnv(tCtx, t, nil, nil, nil)
			for _, n := range tc.nodes {
				e.factory.Core().V1().Nodes().Informer().GetStore().Add(n)
			}
			if n, ok := tc.newObj.(*v1.Node); ok {
				e.factory.Core().V1().Nodes().Informer().GetStore().Add(n)
			}
			for _, p := range tc.pods {
				e.factory.Core().V1().Pods().Informer().GetStore().Add(p)
			}
			if tc.noStore {
				// An in-flight reservation holds the freed device.
				e.pl.shared.Tracker().Reserve("full", "other", gpu.Reservation{Choice: gpu.Choice{Mask: 1, Milli: 1000}})
			}
			var got fwk.QueueingHint
			var err error
			switch tc.hint {
			case "node":
				got, err = e.pl.isSchedulableAfterNodeChange(logger, tc.pod, tc.oldObj, tc.newObj)
			case "delete":
				got, err = e.pl.isSchedulableAfterPodDelete(logger, tc.pod, tc.oldObj, tc.newObj)
			case "target":
				got, err = e.pl.isSchedulableAfterTargetPodUpdate(logger, tc.pod, tc.oldObj, tc.newObj)
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("want %v, got %v", tc.want, got)
			}
		})
	}
}

// One event is judged once for all pending pods, but each pod by its own
// request.
func TestQueueingHintOneEventManyPods(t *testing.T) {
	logger, tCtx := ktesting.NewTestContext(t)
	half := gpuNode("half", "2").Obj()
	e := newEnv(tCtx, t, nil, []*v1.Node{half}, []*v1.Pod{boundPod("c", "half", "half:0=1000")})
	gone := boundPod("d", "half", "half:1=1000")
	for i, tc := range []struct {
		pod  *v1.Pod
		want fwk.QueueingHint
	}{{wholePod("p1", "1").Obj(), fwk.Queue}, {wholePod("p2", "2").Obj(), fwk.QueueSkip}, {sharedPod("p3", "300").Obj(), fwk.Queue}, {wholePod("p4", "2").Obj(), fwk.QueueSkip}} {
		got, err := e.pl.isSchedulableAfterPodDelete(logger, tc.pod, gone, nil)
		if err != nil || got != tc.want {
			t.Errorf("pod %d: want %v, got %v %v", i, tc.want, got, err)
		}
	}
	// The queue replays the same event later (it came during another pod's
	// cycle): a pod bound to the node since then is seen.
	taker := boundPod("e", "half", "half:1=1000")
	e.factory.Core().V1().Pods().Informer().GetStore().Add(taker)
	e.pl.podChanged(nil, taker) // as the pod handler does
	if got, _ := e.pl.isSchedulableAfterPodDelete(logger, wholePod("p5", "1").Obj(), gone, nil); got != fwk.QueueSkip {
		t.Errorf("replayed event judged on a stale state: got %v", got)
	}
	e.factory.Core().V1().Pods().Informer().GetStore().Delete(taker)
	e.pl.podChanged(nil, taker)
	// The next event is judged afresh: the other device was freed too.
	e.factory.Core().V1().Pods().Informer().GetStore().Delete(boundPod("c", "half", "half:0=1000"))
	if got, _ := e.pl.isSchedulableAfterPodDelete(logger, wholePod("p2", "2").Obj(), boundPod("c", "half", "half:0=1000"), nil); got != fwk.Queue {
		t.Errorf("after the second deletion: want Queue, got %v", got)
	}
}

// Without informers the hint knows only the node's inventory: it must not
// skip a pod that might fit.
func TestQueueingHintWithoutInformer(t *testing.T) {
	logger, tCtx := ktesting.NewTestContext(t)
	e := newEnv(tCtx, t, nil, nil, nil)
	e.pl.shared = newSharedWithoutInformer(tCtx, t)
	got, _ := e.pl.isSchedulableAfterNodeChange(logger, wholePod("p", "1").Obj(), nil, gpuNode("n", "1").Obj())
	if got != fwk.Queue {
		t.Errorf("want Queue, got %v", got)
	}
	got, _ = e.pl.isSchedulableAfterNodeChange(logger, wholePod("p", "2").Obj(), nil, gpuNode("n", "1").Obj())
	if got != fwk.QueueSkip {
		t.Errorf("a node too small can be skipped even without informers, got %v", got)
	}
}

func newSharedWithoutInformer(tCtx context.Context, t *testing.T) *shared.Shared {
	fh, err := frameworkruntime.NewFramework(tCtx, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := shared.For(fh)
	t.Cleanup(func() { shared.Forget(fh) })
	if err := s.Configure(gpu.DefaultNodeOptions); err != nil {
		t.Fatal(err)
	}
	return s
}

// PostFilter tells the reconciler which plugins rejected the pod's nodes:
// only a pod held by nothing but what the reconciler re-checks is one it
// may activate.
func TestPostFilterRecordsRejectors(t *testing.T) {
	tCtx := tk.Init(t)
	nodes := []*v1.Node{gpuNode("n1", "1").Obj(), gpuNode("n2", "1").Obj()}
	for name, tc := range map[string]struct {
		n1, n2 string
		want   bool
	}{
		"GPUs everywhere":      {Name, Name, true},
		"GPUs and a taint":     {Name, names.TaintToleration, true},
		"GPUs and an affinity": {Name, names.InterPodAffinity, false},
		"a volume":             {names.VolumeBinding, names.VolumeBinding, false},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(tCtx, t, nil, nodes, nil)
			if e.pl.rec == nil {
				t.Fatal("no reconciler")
			}
			pod := wholePod("p", "1").Obj()
			statuses := framework.NewDefaultNodeToStatus()
			statuses.Set("n1", fwk.NewStatus(fwk.Unschedulable, "x").WithPlugin(tc.n1))
			statuses.Set("n2", fwk.NewStatus(fwk.UnschedulableAndUnresolvable, "y").WithPlugin(tc.n2))
			r, s := e.pl.PostFilter(tCtx, framework.NewCycleState(), pod, statuses)
			if r != nil || s.Code() != fwk.Unschedulable {
				t.Errorf("PostFilter must change nothing: %v %v", r, s)
			}
			if got := e.pl.rec.JudgedWhole(pod); got != tc.want {
				t.Errorf("judged whole: %v, want %v", got, tc.want)
			}
		})
	}
}

// GPU Feature Discovery's timestamp never reaches the scheduler's view of a
// node: rewriting it is no scheduling event. Every other label stays.
func TestVolatileLabelsDropped(t *testing.T) {
	tCtx := tk.Init(t)
	node := gpuNode("n", "1").Label(gpu.LabelGPUProduct, "A100").Label("nvidia.com/gfd.timestamp", "1764510000").Label("zone", "a").Obj()
	e := newEnv(tCtx, t, nil, nil, nil)
	if _, err := e.client.CoreV1().Nodes().Create(tCtx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.factory.Start(tCtx.Done())
	e.factory.WaitForCacheSync(tCtx.Done())
	got, err := e.factory.Core().V1().Nodes().Lister().Get("n")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := got.Labels["nvidia.com/gfd.timestamp"]; ok {
		t.Errorf("the GFD timestamp reached the scheduler: %v", got.Labels)
	}
	if got.Labels[gpu.LabelGPUProduct] != "A100" || got.Labels["zone"] != "a" {
		t.Errorf("other labels lost: %v", got.Labels)
	}
}
