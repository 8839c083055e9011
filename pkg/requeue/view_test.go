package requeue

import (
	"context"
	"errors"
	"reflect"
	stdruntime "runtime"
	"testing"
	"time"
	"weak"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clienttesting "k8s.io/client-go/testing"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
)

// TestViewRecomputesOnlyWhatChanged: a rebuilt view computes again the
// states of the nodes whose pods, devices, allocatable or reservations
// changed, and of no other; and after every change it is what computing
// every node afresh gives.
func TestViewRecomputesOnlyWhatChanged(t *testing.T) {
	e := newEnv(t)
	e.add(t, gpuNode("n1", 8, "A100"), gpuNode("n2", 8, "A100"), gpuNode("n3", 8, "A100"),
		boundPod("b1", "n1", "n1:0=1000"), boundPod("b2", "n2", "n2:0=500"))
	tr := e.r.gpu.Tracker()
	node := func(name string) *v1.Node {
		o, _, _ := e.nodes.GetByKey(name)
		return o.(*v1.Node).DeepCopy()
	}
	withNode := func(name string, edit func(*v1.Node)) func() {
		return func() {
			n := node(name)
			edit(n)
			e.nodes.Update(n)
		}
	}
	const reserved = types.UID("r1")
	steps := []struct {
		name       string
		change     func()
		recomputed []string
	}{
		{name: "first view", change: func() {}, recomputed: []string{"n1", "n2", "n3"}},
		{name: "nothing changed", change: func() {}},
		{name: "a label GPU Feature Discovery rewrites", change: withNode("n3", func(n *v1.Node) {
			n.Labels["nvidia.com/gfd.timestamp"] = "1764620000"
		})},
		{name: "a pod's assignment moved", change: func() {
			e.pods.Update(boundPod("b1", "n1", "n1:1=1000"))
		}, recomputed: []string{"n1"}},
		{name: "a pod bound", change: func() {
			e.pods.Add(boundPod("b3", "n2", "n2:1=1000,2=1000"))
		}, recomputed: []string{"n2"}},
		{name: "a pod gone", change: func() {
			e.pods.Delete(boundPod("b3", "n2", ""))
		}, recomputed: []string{"n2"}},
		{name: "a reservation made", change: func() {
			tr.Reserve("n3", reserved, gpu.Reservation{Namespace: "ns", Name: "r1", Choice: gpu.Choice{Mask: 1, Milli: 1000}, Since: time.Now()})
		}, recomputed: []string{"n3"}},
		{name: "a node with a reservation", change: func() {}, recomputed: []string{"n3"}},
		{name: "the reservation dropped", change: func() { tr.Unreserve(reserved) }, recomputed: []string{"n3"}},
		{name: "fewer GPUs", change: withNode("n1", func(n *v1.Node) {
			n.Status.Allocatable[gpu.ResourceNvidiaGPU] = resource.MustParse("4")
		}), recomputed: []string{"n1"}},
		{name: "less CPU", change: withNode("n2", func(n *v1.Node) {
			n.Status.Allocatable[v1.ResourceCPU] = resource.MustParse("16")
		}), recomputed: []string{"n2"}},
		{name: "another model", change: withNode("n2", func(n *v1.Node) {
			n.Labels[gpu.LabelGPUProduct] = "H100"
		}), recomputed: []string{"n2"}},
		{name: "GPU memory reported", change: withNode("n2", func(n *v1.Node) {
			n.Labels[gpu.LabelGPUMemory] = "81920"
		}), recomputed: []string{"n2"}},
		{name: "a GPU unhealthy", change: withNode("n1", func(n *v1.Node) {
			n.Status.Capacity[gpu.ResourceNvidiaGPU] = resource.MustParse("5")
		}), recomputed: []string{"n1"}},
		{name: "another scheduler's pod in flight", change: func() {
			tr.SetPending(boundPod("hami-pod", "", ""), "n1", time.Now().Add(time.Hour))
		}, recomputed: []string{"n1"}},
		{name: "while in flight", change: func() {}, recomputed: []string{"n1"}},
		{name: "no longer in flight", change: func() { tr.SetPending(boundPod("hami-pod", "", ""), "", time.Time{}) }, recomputed: []string{"n1"}},
		{name: "since", change: func() {}},
		{name: "a reservation", change: func() {
			tr.Reserve("n1", "x", gpu.Reservation{Namespace: "ns", Name: "x", Choice: gpu.Choice{Mask: 1 << 2, Milli: 1000}, Since: time.Now()})
		}, recomputed: []string{"n1"}},
		{name: "retired by the scheduler's snapshot", change: func() {
			// The scheduler's view shows the pod with its assignment: the
			// reservation goes, with no version change; a pod that then
			// fails to bind leaves nothing on the node.
			o, _, _ := e.nodes.GetByKey("n1")
			x := boundPod("x", "n1", "n1:2=1000")
			x.UID = "x"
			tr.Compute(o.(*v1.Node), []*v1.Pod{x}, 0, 0, "", true)
		}, recomputed: []string{"n1"}},
		{name: "after the reservation", change: func() {}},
		{name: "deleted and created again", change: func() {
			n := gpuNode("n3", 8, "A100")
			n.UID = "again"
			e.nodes.Update(n)
		}, recomputed: []string{"n3"}},
		{name: "a node gone", change: func() { e.nodes.Delete(node("n2")) }},
	}
	for _, s := range steps {
		before := e.r.computed.Load()
		s.change()
		e.r.invalidate()
		v := e.r.viewNow()
		if got := e.r.computed.Load() - before; got != int64(len(s.recomputed)) {
			t.Errorf("%s: %d node states computed, want %d (%v)", s.name, got, len(s.recomputed), s.recomputed)
		}
		// The level truth: every node computed afresh.
		want := map[string]*baseNode{}
		for _, o := range e.nodes.List() {
			n := o.(*v1.Node)
			pods, _ := e.r.gpu.PodsOnNode(n.Name)
			want[n.Name] = newBaseNode(tr, n, pods)
		}
		if len(v.nodes) != len(want) {
			t.Fatalf("%s: %d nodes in the view, want %d", s.name, len(v.nodes), len(want))
		}
		for _, nv := range v.nodes {
			w := want[nv.node.Name]
			if w == nil {
				t.Fatalf("%s: node %s is gone, yet in the view", s.name, nv.node.Name)
			}
			if nv.node != w.node {
				t.Errorf("%s: %s: the view holds an old version of the node (its labels are what affinity reads)", s.name, nv.node.Name)
			}
			if nv.gpu.Free != w.st.Free || nv.gpu.Overcommitted != w.st.Overcommitted || !reflect.DeepEqual(nv.gpu.Inventory, w.st.Inventory) ||
				nv.cpuFree != w.cpuFree || nv.memFree != w.memFree || nv.podFree != w.podFree {
				t.Errorf("%s: %s in the view: free %v, inventory %+v, cpu %d, mem %d, pods %d; computed afresh: %v, %+v, %d, %d, %d",
					s.name, nv.node.Name, nv.gpu.Free[:8], nv.gpu.Inventory, nv.cpuFree, nv.memFree, nv.podFree,
					w.st.Free[:8], w.st.Inventory, w.cpuFree, w.memFree, w.podFree)
			}
		}
	}
}

// TestViewBookingLeavesTheBase: an activation books devices in its view
// only; the next view starts from the cluster again.
func TestViewBookingLeavesTheBase(t *testing.T) {
	e := newEnv(t)
	e.add(t, gpuNode("n1", 1, "A100"), pendingPod("p1", nil, 1), pendingPod("p2", nil, 1))
	if err := e.reconcile(t, "p1"); err != nil {
		t.Fatal(err)
	}
	if err := e.reconcile(t, "p2"); err != nil {
		t.Fatal(err)
	}
	if got := e.act.Activated(); len(got) != 1 {
		t.Fatalf("one GPU wakes one pod, got %v", got)
	}
	e.r.invalidate()
	v := e.r.viewNow()
	if free := v.nodes[0].gpu.Free[0]; free != gpu.MilliPerGPU {
		t.Errorf("the booking stayed in the node's base: %d milli free in a new view, want %d", free, gpu.MilliPerGPU)
	}
}

// TestViewStateCountsCPUAndMemory: the device state a view's check scores
// with (Evaluate) carries the CPU and memory the node's pods leave, as
// Score's does (a state with none makes every typical pod too large for the
// node, and a share's device the first one, whatever fragmentation says),
// and a booking takes the pod's.
func TestViewStateCountsCPUAndMemory(t *testing.T) {
	e := newEnv(t)
	e.add(t, gpuNode("n1", 2, "A100"), pendingPod("p1", nil, 1))
	bound := boundPod("b1", "n1", "n1:0=1000")
	bound.Spec.Containers[0].Resources.Requests = v1.ResourceList{v1.ResourceCPU: resource.MustParse("12"), v1.ResourceMemory: resource.MustParse("40Gi")}
	e.add(t, bound)
	v := e.r.viewNow()
	nv := v.nodes[0]
	const cpu, memMiB = 32000 - 12000, (128 - 40) * 1024
	if nv.gpu.CPUFree != cpu || nv.gpu.MemFree != memMiB {
		t.Errorf("the view's device state has %dm CPU and %d MiB free, want %dm and %d MiB", nv.gpu.CPUFree, nv.gpu.MemFree, cpu, memMiB)
	}
	nv.book(4000, 8<<30, gpu.Choice{Mask: 1 << 1, Milli: gpu.MilliPerGPU})
	if nv.gpu.CPUFree != cpu-4000 || nv.gpu.MemFree != memMiB-8*1024 || nv.gpu.Free[1] != 0 {
		t.Errorf("after a booking: %dm CPU, %d MiB, device 1 %d milli free; want %dm, %d MiB, 0",
			nv.gpu.CPUFree, nv.gpu.MemFree, nv.gpu.Free[1], cpu-4000, memMiB-8*1024)
	}
}

// TestOwnWritesAreNotReconciled: a pending pod is reconciled again when
// something its judgement reads changed, not after its reason was written
// (each of which would also rebuild an old view).
func TestOwnWritesAreNotReconciled(t *testing.T) {
	base := pendingPod("p", map[string]string{gpu.AnnotationMilli: "500"}, 0)
	edit := func(f func(*v1.Pod)) *v1.Pod {
		p := base.DeepCopy()
		p.ResourceVersion = "2"
		f(p)
		return p
	}
	for _, tc := range []struct {
		name string
		old  interface{}
		new  *v1.Pod
		want bool
	}{
		{"created", nil, base, true},
		{"its reason written", base, edit(func(p *v1.Pod) {
			p.Status.Conditions = append(p.Status.Conditions, v1.PodCondition{Type: gpu.ConditionPending, Status: v1.ConditionTrue, Reason: ReasonUnschedulable, Message: "no node"})
		}), false},
		{"another attempt failed", base, edit(func(p *v1.Pod) {
			p.Status.Conditions[0].Message = "0/3 nodes are available"
		}), true},
		{"unschedulable again, later", base, edit(func(p *v1.Pod) {
			p.Status.Conditions[0].LastTransitionTime.Time = p.Status.Conditions[0].LastTransitionTime.Add(time.Minute)
		}), true},
		{"another request", base, edit(func(p *v1.Pod) { p.Annotations[gpu.AnnotationMilli] = "300" }), true},
		{"a toleration", base, edit(func(p *v1.Pod) { p.Spec.Tolerations = []v1.Toleration{{Operator: v1.TolerationOpExists}} }), true},
		{"more memory", base, edit(func(p *v1.Pod) {
			p.Spec.Containers[0].Resources.Requests[v1.ResourceMemory] = resource.MustParse("1Gi")
		}), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.r.onPod(tc.old, tc.new)
			if got := e.r.queue.Len() == 1; got != tc.want {
				t.Errorf("reconciled again: %v, want %v", got, tc.want)
			}
		})
	}
}

// TestConflictingWriteJudgesAgain: a reason write that finds the pod changed
// since it was judged is dropped, and the pod judged again, whatever that
// change was.
func TestConflictingWriteJudgesAgain(t *testing.T) {
	e := newEnv(t)
	e.client.PrependReactor("patch", "pods", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewConflict(v1.Resource("pods"), "p", errors.New("the object has been modified"))
	})
	e.add(t, gpuNode("n1", 1, "T4"), pendingPod("p", nil, 4))
	for e.r.queue.Len() > 0 {
		k, _ := e.r.queue.Get()
		e.r.queue.Done(k)
	}
	if err := e.reconcile(t, "p"); err != nil {
		t.Fatal(err)
	}
	if _, pending := e.r.writes.Load("ns/p"); pending {
		t.Error("the write that conflicted is still pending")
	}
	deadline := time.Now().Add(5 * time.Second)
	for e.r.queue.Len() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if e.r.queue.Len() != 1 {
		t.Fatalf("the pod was not queued to be judged again (queue %d)", e.r.queue.Len())
	}
	// Judged again while the informer still shows the version that
	// conflicted: the write waits out the spacing instead of going again.
	patches := len(e.patches())
	e.r.cfg.ExplainEvery = time.Hour
	if err := e.reconcile(t, "p"); err != nil {
		t.Fatal(err)
	}
	if n := len(e.patches()) - patches; n != 0 {
		t.Errorf("%d patches sent again at once against the version that conflicted", n)
	}
}

// TestResyncComputesEveryNode: an event's view reuses the nodes' states; a
// resync's computes every node again, and so does a view after the
// accounting was replaced (a new tracker, as Configure makes).
func TestResyncComputesEveryNode(t *testing.T) {
	e := newEnv(t)
	e.add(t, gpuNode("n1", 8, "A100"), gpuNode("n2", 8, "A100"), boundPod("b1", "n1", "n1:0=1000"))
	e.r.viewNow()
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the pass only queues the pods; no worker runs here
	for _, tc := range []struct {
		name   string
		change func()
		want   int64
	}{
		{"an event's pass", func() { e.r.pass(ctx, "event") }, 0},
		{"a resync", func() { e.r.pass(ctx, "resync") }, 2},
		{"another tracker", func() {
			// Its nodes at the versions the old one's were at: only the
			// tracker tells the bases apart.
			tr := gpu.NewTracker(gpu.DefaultNodeOptions)
			for _, o := range e.nodes.List() {
				tr.Compute(o.(*v1.Node), nil, 0, 0, "", false)
			}
			e.r.gpu.(*state).tracker = tr
		}, 2},
	} {
		before := e.r.computed.Load()
		tc.change()
		e.r.invalidate()
		e.r.viewNow()
		if got := e.r.computed.Load() - before; got != tc.want {
			t.Errorf("%s: %d node states computed, want %d", tc.name, got, tc.want)
		}
	}
}

// A base recognises the pods it was computed from without keeping them
// alive: between two views, the informer replaces pods (bound, started),
// and a base must not hold every version it replaced.
func TestBaseKeepsNoPodAlive(t *testing.T) {
	tr := gpu.NewTracker(gpu.DefaultNodeOptions)
	n := gpuNode("n1", 8, "A100")
	pods := []*v1.Pod{boundPod("a", "n1", "n1:0=1000"), boundPod("b", "n1", "n1:1=500")}
	b := newBaseNode(tr, n, pods)
	w := []weak.Pointer[v1.Pod]{weak.Make(pods[0]), weak.Make(pods[1])}
	pods = nil
	stdruntime.GC()
	stdruntime.GC()
	for i, p := range w {
		if p.Value() != nil {
			t.Errorf("pod %d the base was computed from is still alive", i)
		}
	}
	if b.st.Count != 8 {
		t.Fatalf("the base's state counts %d devices", b.st.Count)
	}
}
