package gpufit

import (
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/backend/cache"
	internalqueue "k8s.io/kubernetes/pkg/scheduler/backend/queue"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	"k8s.io/kubernetes/pkg/scheduler/metrics"
	"k8s.io/kubernetes/test/utils/ktesting"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu/gputest"
)

// A pod for a model no node hosts has one attempt (its FailedScheduling),
// then waits in the real scheduling queue's pool without further attempts,
// the 5-minute flush included, until a hint finds a node for it; the
// reconciler's activation also lets it in.
func TestHostlessPodWaitsGated(t *testing.T) {
	tCtx := ktesting.Init(t)
	logger := klog.FromContext(tCtx)
	metrics.Register()
	a100 := gpuNode("a100", "2").Label(gpu.LabelGPUProduct, "NVIDIA-A100").Obj()
	client := fake.NewClientset()
	factory := informers.NewSharedInformerFactory(client, 0)
	snapshot := cache.NewSnapshot(nil, []*v1.Node{a100})
	act := &gputest.Activator{}
	fh, err := frameworkruntime.NewFramework(tCtx, nil, nil,
		frameworkruntime.WithPodActivator(act),
		frameworkruntime.WithSnapshotSharedLister(snapshot),
		frameworkruntime.WithClientSet(client),
		frameworkruntime.WithInformerFactory(factory))
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(tCtx, accountingArgs(), fh)
	if err != nil {
		t.Fatal(err)
	}
	pl := p.(*GPUFit)
	if pl.hostless == nil {
		t.Fatal("no gate with hints and the reconciler on")
	}
	nodes := factory.Core().V1().Nodes().Informer().GetStore()
	if err := nodes.Add(a100); err != nil {
		t.Fatal(err)
	}

	events, err := pl.EventsToRegister(tCtx)
	if err != nil {
		t.Fatal(err)
	}
	hints := internalqueue.QueueingHintMap{}
	for _, ev := range events {
		h := &internalqueue.QueueingHintFunction{PluginName: Name, QueueingHintFn: ev.QueueingHintFn, PreQueueingHintFn: ev.PreQueueingHintFn}
		evs := []fwk.ClusterEvent{ev.Event}
		if ev.Event.Resource == fwk.Pod {
			evs = framework.UnrollPodEvent(ev.Event)
		}
		for _, e := range evs {
			hints[e] = append(hints[e], h)
		}
	}
	clock := testingclock.NewFakeClock(time.Now())
	queue := internalqueue.NewTestQueue(tCtx, nil,
		internalqueue.WithClock(clock),
		internalqueue.WithQueueingHintMapPerProfile(internalqueue.QueueingHintMapPerProfile{gpu.SchedulerName: hints}),
		internalqueue.WithPreEnqueuePluginMap(map[string]map[string]fwk.PreEnqueuePlugin{gpu.SchedulerName: {Name: pl}}))
	defer queue.Close()

	pod := wholePod("h100", "1").Annotation(gpu.AnnotationModel, "NVIDIA-H100").Obj()
	if err := factory.Core().V1().Pods().Informer().GetStore().Add(pod); err != nil {
		t.Fatal(err)
	}
	where := func(want string) {
		t.Helper()
		in := func(pods []*v1.Pod) bool {
			return slices.ContainsFunc(pods, func(p *v1.Pod) bool { return p.UID == pod.UID })
		}
		got := "nowhere"
		switch {
		case in(queue.PodsInActiveQ()):
			got = "active"
		case in(queue.PodsInBackoffQ()):
			got = "backoff"
		case in(queue.UnschedulablePods()):
			got = "pool"
		}
		if got != want {
			t.Fatalf("the pod is in %s, want %s", got, want)
		}
	}
	// One attempt: PreFilter finds no node for the model.
	attempt := func() {
		t.Helper()
		e, err := queue.Pop(logger)
		if err != nil {
			t.Fatal(err)
		}
		pInfo := e.(*framework.QueuedPodInfo)
		list, _ := snapshot.NodeInfos().List()
		if _, s := pl.PreFilter(tCtx, framework.NewCycleState(), pInfo.Pod, list); s.Code() != fwk.UnschedulableAndUnresolvable {
			t.Fatalf("PreFilter: %v, want a model no node hosts", s)
		}
		pInfo.UnschedulablePlugins = sets.New(Name)
		if err := queue.AddUnschedulablePodIfNotPresent(logger, pInfo, queue.SchedulingCycle()); err != nil {
			t.Fatal(err)
		}
		queue.Done(pInfo.Pod.UID)
	}

	// The queue's flush of the pods in its pool longer than 5 minutes.
	flush := func() {
		clock.Step(6 * time.Minute)
		queue.MoveAllToActiveOrBackoffQueue(logger, framework.EventUnschedulableTimeout, nil, nil, nil)
	}
	// A change of the nodes' devices, as the node handler counts it (the
	// informers do not run here).
	nodesChanged := func() { pl.hostless.nodeGen.Add(1) }

	queue.Add(tCtx, pod)
	where("active")
	attempt()
	where("pool")
	// The flush runs PreEnqueue again: the pod stays in the pool, no
	// attempt.
	flush()
	where("pool")

	// A node without the model: still gated.
	nodeAdd := fwk.ClusterEvent{Resource: fwk.Node, ActionType: fwk.Add}
	t4 := gpuNode("t4", "2").Label(gpu.LabelGPUProduct, "Tesla-T4").Obj()
	if err := nodes.Add(t4); err != nil {
		t.Fatal(err)
	}
	queue.MoveAllToActiveOrBackoffQueue(logger, nodeAdd, nil, t4, nil)
	flush()
	where("pool")

	// A node with the model, full: GPUFit's hint skips it (the pod does
	// not fit there now), so the gate stays; the queue's next flush finds
	// the model hosted and lets the pod in, for an attempt that may
	// preempt.
	podStore := factory.Core().V1().Pods().Informer().GetStore()
	full := gpuNode("h100-full", "2").Label(gpu.LabelGPUProduct, "NVIDIA-H100").Obj()
	for _, b := range []*v1.Pod{boundPod("busy-0", "h100-full", "h100-full:0=1000"), boundPod("busy-1", "h100-full", "h100-full:1=1000")} {
		if err := podStore.Add(b); err != nil {
			t.Fatal(err)
		}
	}
	if err := nodes.Add(full); err != nil {
		t.Fatal(err)
	}
	nodesChanged()
	queue.MoveAllToActiveOrBackoffQueue(logger, nodeAdd, nil, full, nil)
	where("pool")
	flush()
	where("active")

	// The node goes: gated again after the next refusal.
	if err := nodes.Delete(full); err != nil {
		t.Fatal(err)
	}
	nodesChanged()
	attempt()
	flush()
	where("pool")

	// A node where it fits: GPUFit's hint answers Queue, the gate opens at
	// once, before the node handler has counted the node.
	h100 := gpuNode("h100", "2").Label(gpu.LabelGPUProduct, "NVIDIA-H100").Obj()
	if err := nodes.Add(h100); err != nil {
		t.Fatal(err)
	}
	queue.MoveAllToActiveOrBackoffQueue(logger, nodeAdd, nil, h100, nil)
	where("active")
	if err := nodes.Delete(h100); err != nil {
		t.Fatal(err)
	}
	nodesChanged()

	// Refused again, then activated by the reconciler, which read the
	// cluster: let in.
	attempt()
	flush()
	where("pool")
	ungating{h: pl.hostless, next: queue}.Activate(logger, map[string]*v1.Pod{"default/h100": pod})
	where("active")

	// A gate is dropped with its pod, and a pod deleted during its attempt
	// is not recorded after its deletion.
	attempt()
	if _, ok := pl.hostless.gated(pod.UID); !ok {
		t.Fatal("not gated after a refusal")
	}
	pl.hostless.forget(pod)
	if _, ok := pl.hostless.gated(pod.UID); ok || pl.hostless.n.Load() != 0 {
		t.Error("the gate outlived its pod")
	}
	if err := podStore.Delete(pod); err != nil {
		t.Fatal(err)
	}
	req, _ := gpu.ParseRequest(pod, pl.reqOpts)
	pl.hostless.record(pod, &req, []string{"x"})
	if pl.hostless.n.Load() != 0 {
		t.Error("a pod deleted during its attempt was recorded")
	}
}
