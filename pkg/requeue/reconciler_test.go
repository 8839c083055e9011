package requeue

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/component-base/metrics/testutil"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu/gputest"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/internal/objects"
)

// state is the GPU accounting as the plugins keep it: a tracker over the
// informer's pods.
type state struct {
	tracker *gpu.Tracker
	pods    cache.Indexer
	wl      *gpu.Workload
}

func (s *state) Tracker() *gpu.Tracker   { return s.tracker }
func (s *state) Scoring() gpu.Scoring    { return gpu.DefaultScoring }
func (s *state) Workload() *gpu.Workload { return s.wl }
func (s *state) PodsOnNode(n string) ([]*v1.Pod, bool) {
	if _, ok := s.pods.GetIndexers()["node"]; ok {
		objs, _ := s.pods.ByIndex("node", n)
		out := make([]*v1.Pod, 0, len(objs))
		for _, o := range objs {
			out = append(out, o.(*v1.Pod))
		}
		return out, true
	}
	return gputest.PodsOn(s.pods, n), true
}

func (s *state) SameDevices(a, b *v1.Node) bool {
	return objects.SameDevices(a, b, s.tracker.Options())
}

type env struct {
	r      *Reconciler
	client *fake.Clientset
	act    *gputest.Activator
	pods   cache.Store
	nodes  cache.Store
	active bool
}

func newEnv(t *testing.T) *env {
	t.Helper()
	client := fake.NewClientset()
	f := informers.NewSharedInformerFactory(client, 0)
	podInf, nodeInf := f.Core().V1().Pods().Informer(), f.Core().V1().Nodes().Informer()
	e := &env{client: client, act: &gputest.Activator{}, pods: podInf.GetStore(), nodes: nodeInf.GetStore(), active: true}
	st := &state{tracker: gpu.NewTracker(gpu.DefaultNodeOptions), pods: podInf.GetIndexer()}
	r, err := New(Config{SchedulerName: gpu.SchedulerName, Workers: 1, ResyncPeriod: time.Minute, BackoffBase: time.Millisecond,
		BackoffMax: time.Second, Explain: true}, st, e.act, client, podInf, nodeInf, gpu.DefaultRequestOptions,
		func() bool { return e.active })
	if err != nil {
		t.Fatal(err)
	}
	e.r = r
	return e
}

func gpuNode(name string, gpus int64, model string) *v1.Node {
	res := v1.ResourceList{
		v1.ResourceCPU: resource.MustParse("32"), v1.ResourceMemory: resource.MustParse("128Gi"),
		v1.ResourcePods: resource.MustParse("110"), gpu.ResourceNvidiaGPU: *resource.NewQuantity(gpus, resource.DecimalSI),
	}
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{gpu.LabelGPUProduct: model}},
		Status: v1.NodeStatus{Capacity: res, Allocatable: res}}
}

func boundPod(name, node, assignment string) *v1.Pod {
	return gputest.BoundPod("ns", name, node, assignment)
}

func pendingPod(name string, ann map[string]string, gpus int64) *v1.Pod {
	c := v1.Container{Name: "c", Resources: v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("1")}}}
	if gpus > 0 {
		q := *resource.NewQuantity(gpus, resource.DecimalSI)
		c.Resources.Requests[gpu.ResourceNvidiaGPU], c.Resources.Limits = q, v1.ResourceList{gpu.ResourceNvidiaGPU: q}
	}
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID(name), Annotations: ann, ResourceVersion: "1"},
		Spec:       v1.PodSpec{SchedulerName: gpu.SchedulerName, Containers: []v1.Container{c}},
		Status: v1.PodStatus{Conditions: []v1.PodCondition{{Type: v1.PodScheduled, Status: v1.ConditionFalse,
			Reason: v1.PodReasonUnschedulable, LastTransitionTime: metav1.NewTime(time.Now().Add(-time.Second))}}},
	}
}

func (e *env) add(t *testing.T, objs ...runtime.Object) {
	t.Helper()
	for _, o := range objs {
		switch x := o.(type) {
		case *v1.Node:
			e.nodes.Add(x)
		case *v1.Pod:
			e.pods.Add(x)
			if x.Spec.NodeName == "" {
				// Its last attempt failed on GPUs, as GPUFit's PostFilter
				// records it.
				e.r.RecordRejection(x, []string{GPUFitName})
			}
			if _, err := e.client.Tracker().Get(v1.SchemeGroupVersion.WithResource("pods"), x.Namespace, x.Name); err != nil {
				e.client.Tracker().Add(x)
			}
		}
	}
	e.r.invalidate()
}

func (e *env) patches() []string {
	var out []string
	for _, a := range e.client.Actions() {
		if p, ok := a.(clienttesting.PatchAction); ok {
			out = append(out, string(p.GetPatch()))
		}
	}
	return out
}

// reconcile reconciles one pod, then lets the writer send what it judged.
func (e *env) reconcile(t *testing.T, name string) error {
	t.Helper()
	logger, ctx := ktesting.NewTestContext(t)
	ctx = klog.NewContext(ctx, logger)
	if err := e.r.reconcile(ctx, "ns/"+name); err != nil {
		return err
	}
	return e.flush(ctx)
}

// flush runs the writer until its queue is empty (keys spaced for later
// stay there).
func (e *env) flush(ctx context.Context) error {
	for _, q := range []workqueue.TypedRateLimitingInterface[string]{e.r.clearQ, e.r.writeQ} {
		for q.Len() > 0 {
			key, _ := q.Get()
			err := e.r.write(ctx, key, e.client)
			q.Done(key)
			if err != nil {
				return err
			}
		}
	}
	return nil
}

func TestActivatesWhenANodeFits(t *testing.T) {
	e := newEnv(t)
	e.add(t, gpuNode("n1", 2, "T4"), boundPod("a", "n1", "n1:0=600"), pendingPod("p", map[string]string{gpu.AnnotationMilli: "400"}, 0))
	if err := e.reconcile(t, "p"); err != nil {
		t.Fatal(err)
	}
	if len(e.act.Activated()) != 1 || len(e.patches()) != 0 {
		t.Errorf("want one activation and no write, got %v / %v", e.act.Activated(), e.patches())
	}
}

func TestExplainsAndWritesOnlyOnChange(t *testing.T) {
	e := newEnv(t)
	e.add(t, gpuNode("n1", 2, "T4"), gpuNode("n2", 1, "T4"),
		boundPod("a", "n1", "n1:0=600"), boundPod("a2", "n1", "n1:1=700"), boundPod("b", "n2", "n2:0=900"),
		pendingPod("p", map[string]string{gpu.AnnotationMilli: "500"}, 0))
	if err := e.reconcile(t, "p"); err != nil {
		t.Fatal(err)
	}
	want := "no node has a GPU with 500 milli free"
	ps := e.patches()
	if len(ps) != 1 || !strings.Contains(ps[0], want) || len(e.act.Activated()) != 0 {
		t.Fatalf("want one write of %q, got %v (activations %v)", want, ps, e.act.Activated())
	}
	// The informer now shows the reason: nothing changed, nothing is written.
	if !strings.Contains(ps[0], `"type":"gpu-scheduler.io/PendingReason"`) {
		t.Errorf("the reason is a pod condition: %s", ps[0])
	}
	if a := e.client.Actions()[len(e.client.Actions())-1]; a.GetSubresource() != "status" {
		t.Errorf("the reason goes through pods/status, got subresource %q", a.GetSubresource())
	}
	p := pendingPod("p", map[string]string{gpu.AnnotationMilli: "500"}, 0)
	p.Status.Conditions = append(p.Status.Conditions, v1.PodCondition{Type: gpu.ConditionPending, Status: v1.ConditionTrue,
		Reason: ReasonUnschedulable, Message: want})
	e.pods.Update(p)
	if err := e.reconcile(t, "p"); err != nil {
		t.Fatal(err)
	}
	if n := len(e.patches()); n != 1 {
		t.Errorf("rewrote an unchanged reason: %d writes", n)
	}
	// The free amounts change, the reason does not: the message names no
	// amount and no node, so nothing is written.
	e.pods.Delete(boundPod("b", "n2", "n2:0=900"))
	e.pods.Add(boundPod("b2", "n2", "n2:0=550"))
	e.r.invalidate()
	if err := e.reconcile(t, "p"); err != nil {
		t.Fatal(err)
	}
	if n := len(e.patches()); n != 1 {
		t.Errorf("rewrote a reason for a changed amount: %d writes", n)
	}
	// The cluster changes in kind: a cordoned node with free GPUs. The
	// reason follows.
	c := gpuNode("n3", 2, "T4")
	c.Spec.Unschedulable = true
	e.add(t, c)
	if err := e.reconcile(t, "p"); err != nil {
		t.Fatal(err)
	}
	if ps := e.patches(); len(ps) != 2 || !strings.Contains(ps[1], "no node has a GPU with 500 milli free; cordoned: 1 node") {
		t.Errorf("reason not kept current: %v", ps)
	}
}

func TestMessages(t *testing.T) {
	tests := map[string]struct {
		objs []runtime.Object
		pod  *v1.Pod
		want string
		// delivery: shares need a node that delivers them (the default).
		delivery bool
		class    string
	}{
		"share where nothing delivers it": {[]runtime.Object{gpuNode("n1", 4, "T4"), gpuNode("n2", 4, "T4")},
			pendingPod("p", map[string]string{gpu.AnnotationMilli: "500"}, 0),
			"no device plugin that delivers GPU shares (HAMi's) on 2 nodes", true, ClassUnsuitable},
		"gpu uuid nowhere": {[]runtime.Object{gpuNode("n1", 4, "T4")},
			pendingPod("p", map[string]string{gpu.AnnotationHAMiUseUUID: "GPU-x"}, 1),
			"none of the GPUs the pod allows (nvidia.com/use-gpuuuid, nouse-gpuuuid) on 1 node", false, ClassUnsuitable},
		"whole GPUs": {[]runtime.Object{gpuNode("n1", 4, "A100"), gpuNode("n2", 8, "A100"),
			boundPod("a", "n1", "n1:0=1000"), boundPod("b", "n2", "n2:0=1000,1=1000,2=1000,3=1000,4=1000"), boundPod("b2", "n2", "n2:5=500")},
			pendingPod("p", nil, 4), "needs 4 free GPUs on one node; no node of an allowed model has that many free", false, ClassFragmented},
		// Free GPUs, but on nodes the pod cannot use: every node is visited
		// and the message counts each constraint.
		"whole GPUs, counted per node": {[]runtime.Object{gpuNode("n1", 4, "A100"), func() *v1.Node {
			n := gpuNode("n2", 8, "A100")
			n.Spec.Taints = []v1.Taint{{Key: "gpu", Effect: v1.TaintEffectNoSchedule}}
			return n
		}(), boundPod("a", "n1", "n1:0=1000")},
			pendingPod("p", nil, 4), "needs 4 free GPUs on one node; untolerated taints on 1 node", false, ClassCapacity},
		"model": {[]runtime.Object{gpuNode("n1", 4, "T4"), gpuNode("n2", 4, "T4"), gpuNode("n3", 4, "A100"),
			boundPod("a", "n3", "n3:0=1000,1=1000,2=1000,3=1000")},
			pendingPod("p", map[string]string{gpu.AnnotationModel: "A100"}, 1),
			"needs 1 free GPU on one node; no node of an allowed model has that many free", false, ClassCapacity},
		"invalid": {[]runtime.Object{gpuNode("n1", 4, "T4")}, pendingPod("p", map[string]string{gpu.AnnotationMilli: "lots"}, 0),
			`invalid annotation gpu-scheduler.io/gpu-milli="lots"`, false, ClassInvalid},
		"cpu nodes and taints": {[]runtime.Object{func() *v1.Node {
			n := gpuNode("cpu", 0, "")
			delete(n.Status.Allocatable, gpu.ResourceNvidiaGPU)
			return n
		}(),
			func() *v1.Node {
				n := gpuNode("tainted", 2, "T4")
				n.Spec.Taints = []v1.Taint{{Key: "gpu", Effect: v1.TaintEffectNoSchedule}}
				return n
			}()},
			pendingPod("p", nil, 1), "no GPU on 1 node; untolerated taints on 1 node", false, ClassOther},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			e.r.reqOpts.NeedsDelivery = tc.delivery
			e.add(t, append(tc.objs, tc.pod)...)
			if err := e.reconcile(t, "p"); err != nil {
				t.Fatal(err)
			}
			ps := e.patches()
			if len(ps) != 1 || !strings.Contains(ps[0], strings.ReplaceAll(tc.want, `"`, `\"`)) {
				t.Errorf("want %q, got %v", tc.want, ps)
			}
			if v, ok := e.r.classes.Load(tc.pod.UID); !ok || v.(pendingClass).class != tc.class {
				t.Errorf("class %v, want %s", v, tc.class)
			}
		})
	}
}

// One freed device wakes one pod: activations book into the view.
func TestBookingWakesOnePodPerDevice(t *testing.T) {
	e := newEnv(t)
	e.add(t, gpuNode("n1", 1, "T4"))
	for _, n := range []string{"p1", "p2", "p3"} {
		e.add(t, pendingPod(n, nil, 1))
	}
	for _, n := range []string{"p1", "p2", "p3"} {
		if err := e.reconcile(t, n); err != nil {
			t.Fatal(err)
		}
	}
	if len(e.act.Activated()) != 1 {
		t.Errorf("want one activation, got %v", e.act.Activated())
	}
}

// Between PreBind and the bind, a pod still looks pending; its own
// reservation must not make the reconciler call it stuck.
func TestSkipsPodsBeingBound(t *testing.T) {
	e := newEnv(t)
	e.add(t, gpuNode("n1", 1, "T4"), pendingPod("p", map[string]string{gpu.AnnotationMilli: "500"}, 0))
	e.r.gpu.Tracker().Reserve("n1", "p", gpu.Reservation{Namespace: "ns", Name: "p", Choice: gpu.Choice{Mask: 1, Milli: 500}, Since: time.Now()})
	if err := e.reconcile(t, "p"); err != nil {
		t.Fatal(err)
	}
	if len(e.act.Activated()) != 0 || len(e.patches()) != 0 {
		t.Errorf("acted on a pod being bound: %v %v", e.act.Activated(), e.patches())
	}
}

func TestStandbyKeepsOff(t *testing.T) {
	e := newEnv(t)
	e.active = false
	e.add(t, gpuNode("n1", 1, "T4"), pendingPod("p", nil, 1), pendingPod("q", nil, 4))
	e.reconcile(t, "p")
	e.reconcile(t, "q")
	if len(e.act.Activated()) != 0 || len(e.patches()) != 0 {
		t.Errorf("a standby acted: %v %v", e.act.Activated(), e.patches())
	}
}

func TestSkipsBoundAndGone(t *testing.T) {
	e := newEnv(t)
	e.add(t, gpuNode("n1", 1, "T4"), boundPod("b", "n1", "n1:0=1000"))
	for _, n := range []string{"b", "missing"} {
		if err := e.reconcile(t, n); err != nil {
			t.Fatal(err)
		}
	}
	if len(e.act.Activated()) != 0 || len(e.patches()) != 0 {
		t.Errorf("acted on a bound or missing pod")
	}
}

func TestFailedWriteBacksOff(t *testing.T) {
	e := newEnv(t)
	e.client.PrependReactor("patch", "pods", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("apiserver unavailable")
	})
	e.add(t, gpuNode("n1", 1, "T4"), pendingPod("p", nil, 4))
	if err := e.reconcile(t, "p"); err == nil {
		t.Fatal("want an error")
	}
	// Through the writer, a failure is requeued with per-key backoff (the
	// reason judged stays until written).
	e.r.writeQ.Add("ns/p")
	logger, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(klog.NewContext(ctx, logger))
	defer cancel()
	go e.r.writer(ctx, e.r.writeQ, e.client)
	deadline := time.Now().Add(5 * time.Second)
	for e.r.writeQ.NumRequeues("ns/p") < 3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := e.r.writeQ.NumRequeues("ns/p"); n < 3 {
		t.Errorf("want backoff retries, got %d", n)
	}
}

func TestSweepReservations(t *testing.T) {
	e := newEnv(t)
	tr := e.r.gpu.Tracker()
	old := time.Now().Add(-time.Minute)
	e.add(t, gpuNode("n1", 4, "T4"),
		boundPod("done", "n1", "n1:0=1000"),  // bound, annotated, long ago
		boundPod("fresh", "n1", "n1:1=1000"), // bound, annotated, just now
		pendingPod("flight", nil, 1))         // still in flight
	tr.Reserve("n1", "done", gpu.Reservation{Namespace: "ns", Name: "done", Choice: gpu.Choice{Mask: 1, Milli: 1000}, Since: old})
	tr.Reserve("n1", "fresh", gpu.Reservation{Namespace: "ns", Name: "fresh", Choice: gpu.Choice{Mask: 2, Milli: 1000}, Since: time.Now()})
	tr.Reserve("n1", "flight", gpu.Reservation{Namespace: "ns", Name: "flight", Choice: gpu.Choice{Mask: 4, Milli: 1000}, Since: old})
	tr.Reserve("n1", "deleted", gpu.Reservation{Namespace: "ns", Name: "deleted", Choice: gpu.Choice{Mask: 8, Milli: 1000}, Since: time.Now()})
	e.r.sweepReservations(context.Background())
	var left []string
	for _, r := range tr.Reservations() {
		left = append(left, r.Name)
	}
	if strings.Join(left, ",") != "flight,fresh" {
		t.Errorf("left %v, want flight and fresh", left)
	}
}

// A busy cluster does not rewrite every pending pod's reason on each change.
func TestReasonWritesAreSpaced(t *testing.T) {
	e := newEnv(t)
	e.r.cfg.ExplainEvery = time.Hour
	e.add(t, gpuNode("n1", 1, "T4"), boundPod("a", "n1", "n1:0=700"), pendingPod("p", map[string]string{gpu.AnnotationMilli: "500"}, 0))
	if err := e.reconcile(t, "p"); err != nil {
		t.Fatal(err)
	}
	// The reason changes (a cordoned node with a free GPU), but not before
	// the interval ends.
	c := gpuNode("n2", 1, "T4")
	c.Spec.Unschedulable = true
	e.add(t, c)
	if err := e.reconcile(t, "p"); err != nil {
		t.Fatal(err)
	}
	if n := len(e.patches()); n != 1 {
		t.Errorf("want the second write deferred, got %d writes", n)
	}
}

// The reconciler activates a pod only when its last attempt failed on
// nothing but what the reconciler re-checks; a pod held by anything else is
// left to the scheduler's hints and backoff, and gets no GPU reason either.
func TestActivatesOnlyWhatItJudges(t *testing.T) {
	withStorage := pendingPod("p", nil, 1)
	withStorage.Spec.Containers[0].Resources.Requests[v1.ResourceEphemeralStorage] = resource.MustParse("1Gi")
	for name, tc := range map[string]struct {
		pod      *v1.Pod
		rejected []string // nil: no attempt recorded
		activate bool
	}{
		"GPUs only":                         {pendingPod("p", nil, 1), []string{GPUFitName}, true},
		"GPUs and taints":                   {pendingPod("p", nil, 1), []string{GPUFitName, "TaintToleration", "NodeAffinity", "NodeUnschedulable"}, true},
		"GPUs and CPU":                      {pendingPod("p", nil, 1), []string{GPUFitName, "NodeResourcesFit"}, true},
		"anti-affinity":                     {pendingPod("p", nil, 1), []string{GPUFitName, "InterPodAffinity"}, false},
		"a volume":                          {pendingPod("p", nil, 1), []string{"VolumeBinding"}, false},
		"no status plugin":                  {pendingPod("p", nil, 1), []string{""}, false},
		"NodeResourcesFit, storage unknown": {withStorage, []string{GPUFitName, "NodeResourcesFit"}, false},
		// The shipped profile runs NodeResourcesFit under this name.
		"GPUs and CPU, fast fit":    {pendingPod("p", nil, 1), []string{GPUFitName, NodeResourcesFitFastName}, true},
		"fast fit, storage unknown": {withStorage, []string{GPUFitName, NodeResourcesFitFastName}, false},
		// Its attempt failed after the filters, or this process has not
		// seen one: once per resync period (below).
		"no attempt recorded": {pendingPod("p", nil, 1), nil, true},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			e.add(t, gpuNode("n1", 1, "T4"), tc.pod)
			e.r.rejections.Delete(tc.pod.UID)
			if tc.rejected != nil {
				e.r.RecordRejection(tc.pod, tc.rejected)
			}
			if err := e.reconcile(t, "p"); err != nil {
				t.Fatal(err)
			}
			if got := len(e.act.Activated()) == 1; got != tc.activate {
				t.Errorf("activated: %v, want %v", got, tc.activate)
			}
			if len(e.patches()) != 0 {
				t.Errorf("a pod whose GPUs are free got a reason: %v", e.patches())
			}
		})
	}
}

// An activation uses up its record: the pod is activated again only after
// another failed attempt that the reconciler judges whole, or, with no
// record, once a resync period has passed. A pod whose GPUs are there loses
// its GPU reason.
func TestOneActivationPerAttempt(t *testing.T) {
	e := newEnv(t)
	e.r.cfg.ResyncPeriod = time.Hour
	p := pendingPod("p", nil, 1)
	p.Status.Conditions = append(p.Status.Conditions, v1.PodCondition{Type: gpu.ConditionPending, Status: v1.ConditionTrue,
		Reason: ReasonUnschedulable, Message: "needs 1 free GPU on one node"})
	e.add(t, gpuNode("n1", 2, "T4"), p)
	activations := func() int {
		if err := e.reconcile(t, "p"); err != nil {
			t.Fatal(err)
		}
		e.r.invalidate() // a fresh view: the booking of the last one is gone
		return len(e.act.Activated())
	}
	if n := activations(); n != 1 {
		t.Fatalf("want one activation, got %d", n)
	}
	if ps := e.patches(); len(ps) != 1 || !strings.Contains(ps[0], `"$patch":"delete"`) {
		t.Errorf("the GPU reason of a pod whose GPUs are there must go: %v", ps)
	}
	// The attempt failed after the filters (a Reserve, a node lock): no
	// record. Not again within the resync period.
	if n := activations(); n != 1 {
		t.Errorf("activated again without a new attempt: %d", n)
	}
	// A new attempt failed on GPUs alone.
	e.r.RecordRejection(p, []string{GPUFitName})
	if n := activations(); n != 2 {
		t.Errorf("want a second activation after a new failed attempt, got %d", n)
	}
	// The next attempt starts (GPUFit's PreFilter) and is blocked by an
	// anti-affinity: never.
	e.r.ForgetRejection(p.UID)
	e.r.RecordRejection(p, []string{"InterPodAffinity"})
	if n := activations(); n != 2 {
		t.Errorf("activated a pod blocked elsewhere: %d", n)
	}
	// With no record, once a resync period has passed.
	e.r.ForgetRejection(p.UID)
	e.r.cfg.ResyncPeriod = 0
	if n := activations(); n != 3 {
		t.Errorf("want an activation after the resync period, got %d", n)
	}
}

// Only events that can free or add GPU capacity wake the reconciler: CPU
// pods come and go, GPU Feature Discovery rewrites a timestamp label on
// every node every minute, and neither frees a device.
func TestWakesOnlyOnGPUCapacity(t *testing.T) {
	n := gpuNode("n1", 2, "T4")
	relabelled := n.DeepCopy()
	relabelled.Labels["nvidia.com/gfd.timestamp"] = "1764510000"
	grown := n.DeepCopy()
	grown.Status.Allocatable[gpu.ResourceNvidiaGPU] = resource.MustParse("3")
	cpuPod := boundPod("cpu", "n1", "")
	gpuPod := boundPod("g", "n1", "n1:0=1000")
	done := gpuPod.DeepCopy()
	done.Status.Phase = v1.PodSucceeded
	cpuDone := cpuPod.DeepCopy()
	cpuDone.Status.Phase = v1.PodSucceeded
	cpuNode := gpuNode("cpu-node", 0, "")
	for name, tc := range map[string]struct {
		event func(r *Reconciler)
		wake  bool
	}{
		"CPU pod deleted":        {func(r *Reconciler) { r.onPodDelete(cpuPod) }, false},
		"GPU pod deleted":        {func(r *Reconciler) { r.onPodDelete(gpuPod) }, true},
		"GPU pod deleted, tomb":  {func(r *Reconciler) { r.onPodDelete(cache.DeletedFinalStateUnknown{Obj: gpuPod}) }, true},
		"GPU pod finished":       {func(r *Reconciler) { r.onPod(gpuPod, done) }, true},
		"CPU pod finished":       {func(r *Reconciler) { r.onPod(cpuPod, cpuDone) }, false},
		"GPU pod status":         {func(r *Reconciler) { r.onPod(gpuPod, gpuPod.DeepCopy()) }, false},
		"GFD timestamp label":    {func(r *Reconciler) { r.onNodeUpdate(n, relabelled) }, false},
		"GPU allocatable grew":   {func(r *Reconciler) { r.onNodeUpdate(n, grown) }, true},
		"GPU node added":         {func(r *Reconciler) { r.onNodeAdd(n) }, true},
		"node without GPU added": {func(r *Reconciler) { r.onNodeAdd(cpuNode) }, false},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			tc.event(e.r)
			if got := len(e.r.dirty) == 1; got != tc.wake {
				t.Errorf("woke: %v, want %v", got, tc.wake)
			}
		})
	}
}

// Workers check in parallel, without a global lock: one free device still
// wakes exactly one of many pods (run with -race).
func TestParallelChecksBookOnce(t *testing.T) {
	e := newEnv(t)
	e.add(t, gpuNode("n1", 1, "T4"), gpuNode("n2", 2, "T4"), boundPod("a", "n2", "n2:0=1000,1=1000"))
	var names []string
	for i := 0; i < 64; i++ {
		n := "p" + string(rune('a'+i/26)) + string(rune('a'+i%26))
		names = append(names, n)
		e.add(t, pendingPod(n, nil, 1))
	}
	logger, ctx := ktesting.NewTestContext(t)
	ctx = klog.NewContext(ctx, logger)
	done := make(chan error, len(names))
	for _, n := range names {
		go func() { done <- e.r.reconcile(ctx, "ns/"+n) }()
	}
	for range names {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if n := len(e.act.Activated()); n != 1 {
		t.Errorf("want one activation for one free device, got %d", n)
	}
}

// Verdicts are shared by pods of one shape only: a pod that tolerates a
// taint is not told what a pod that does not was told.
func TestShapesDoNotLeak(t *testing.T) {
	e := newEnv(t)
	tainted := gpuNode("n1", 1, "T4")
	tainted.Spec.Taints = []v1.Taint{{Key: "gpu", Effect: v1.TaintEffectNoSchedule}}
	tolerant := pendingPod("q", nil, 1)
	tolerant.Spec.Tolerations = []v1.Toleration{{Key: "gpu", Operator: v1.TolerationOpExists}}
	e.add(t, tainted, pendingPod("p", nil, 1), tolerant)
	for _, n := range []string{"p", "q"} {
		if err := e.reconcile(t, n); err != nil {
			t.Fatal(err)
		}
	}
	if a := e.act.Activated(); len(a) != 1 || a[0] != "ns/q" {
		t.Errorf("want only q activated, got %v", a)
	}
	if ps := e.patches(); len(ps) != 1 || !strings.Contains(ps[0], "untolerated taints on 1 node") {
		t.Errorf("want p explained, got %v", ps)
	}
}

// The resync publishes fragmentation against the target workload, what
// more of each typical kind would fit, and the pending GPU pods by class.
func TestExportsFragmentation(t *testing.T) {
	e := newEnv(t)
	wl, err := gpu.NewWorkload([]gpu.Task{{CPU: 1000, Milli: 500, Count: 1, Weight: 1}, {CPU: 1000, Milli: 1000, Count: 1, Weight: 1}})
	if err != nil {
		t.Fatal(err)
	}
	e.r.gpu.(*state).wl = wl
	// Free: 400, 0, 1000, 1000.
	e.add(t, gpuNode("n1", 4, "T4"), boundPod("a", "n1", "n1:0=600"), boundPod("b", "n1", "n1:1=1000"),
		pendingPod("p", nil, 3), pendingPod("gone", nil, 1))
	for _, n := range []string{"p", "gone"} {
		if err := e.reconcile(t, n); err != nil {
			t.Fatal(err)
		}
	}
	e.pods.Delete(pendingPod("gone", nil, 1))
	e.r.exportAllocation()
	get := func(g interface{ Set(float64) }) float64 {
		v, err := testutil.GetGaugeMetricValue(g.(metrics.GaugeMetric))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	// p has waited about a second (its condition's transition time).
	if age := get(pendingAge.WithLabelValues(ClassCapacity)); age < 0.5 || age > 60 {
		t.Errorf("the longest wait: %v s", age)
	}
	// Both kinds waste the 400 on device 0: F = 400, of 2,400 idle.
	for name, c := range map[string]struct{ got, want float64 }{
		"node":       {nodeGauge(t, "gpu_scheduler_fragmentation_milli", "n1", "T4"), 400},
		"cluster":    {get(clusterFrag), 400},
		"idle":       {get(clusterIdle), 2400},
		"ratio":      {get(clusterFragRatio), 400.0 / 2400},
		"500m":       {get(placeable.WithLabelValues("1x500m 1cpu")), 4},
		"1000m":      {get(placeable.WithLabelValues("1x1000m 1cpu")), 2},
		"share":      {get(taskShare.WithLabelValues("1x500m 1cpu")), 0.5},
		"fragmented": {get(pendingByClass.WithLabelValues(ClassFragmented)), 0},
		"capacity":   {get(pendingByClass.WithLabelValues(ClassCapacity)), 1},
		"no wait":    {get(pendingAge.WithLabelValues(ClassFragmented)), 0},
	} {
		if math.Abs(c.got-c.want) > 1e-9 {
			t.Errorf("%s: %v, want %v", name, c.got, c.want)
		}
	}
}

// The unbound members of pod groups, and how long the oldest has existed:
// bound members, pods of no group, another scheduler's and deleted ones do
// not count.
func TestExportsGangWaits(t *testing.T) {
	e := newEnv(t)
	member := func(name string, age time.Duration) *v1.Pod {
		p := pendingPod(name, nil, 1)
		p.Spec.SchedulingGroup = &v1.PodSchedulingGroup{PodGroupName: ptr.To("g")}
		p.CreationTimestamp = metav1.NewTime(time.Now().Add(-age))
		p.Status.Conditions = nil // gated or at Permit: no condition
		return p
	}
	bound := member("bound", time.Hour)
	bound.Spec.NodeName = "n1"
	other := member("other", time.Hour)
	other.Spec.SchedulerName = "default-scheduler"
	deleted := member("deleted", time.Hour)
	deleted.DeletionTimestamp = ptr.To(metav1.Now())
	e.add(t, gpuNode("n1", 4, "T4"), member("m1", 20*time.Minute), member("m2", time.Minute), bound, other, deleted,
		pendingPod("solo", nil, 1))
	e.r.exportAllocation()
	n, err := testutil.GetGaugeMetricValue(gangPending.WithLabelValues(gpu.SchedulerName))
	if err != nil {
		t.Fatal(err)
	}
	age, err := testutil.GetGaugeMetricValue(gangPendingAge.WithLabelValues(gpu.SchedulerName))
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 || age < 1199 || age > 1260 {
		t.Errorf("%v gang members pending, the oldest for %v s; want 2 and 1200", n, age)
	}
}

// A standby publishes no per-node figures: summed over the replicas, the
// leader's would count twice.
func TestStandbyExportsNoAllocation(t *testing.T) {
	e := newEnv(t)
	e.add(t, gpuNode("n1", 4, "T4"), boundPod("a", "n1", "n1:0=600"))
	count := func() int {
		mfs, err := legacyregistry.DefaultGatherer.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "gpu_scheduler_allocated_milli" {
				return len(mf.GetMetric())
			}
		}
		return 0
	}
	e.r.exportAllocation()
	if n := count(); n != 1 {
		t.Fatalf("leader: %d allocation series, want 1", n)
	}
	if a, c, u := nodeGauge(t, "gpu_scheduler_allocated_milli", "n1", "T4"), nodeGauge(t, "gpu_scheduler_capacity_milli", "n1", "T4"),
		nodeGauge(t, "gpu_scheduler_unhealthy_gpus", "n1", "T4"); a != 600 || c != 4000 || u != -1 {
		t.Errorf("allocated %v, capacity %v, unhealthy %v; want 600, 4000 and no series", a, c, u)
	}
	e.active = false
	e.r.exportAllocation()
	if n := count(); n != 0 {
		t.Errorf("standby: %d allocation series, want none", n)
	}
}

// nodeGauge is a per-node series as a scrape serves it (-1: absent).
func nodeGauge(t *testing.T, name, node, model string) float64 {
	t.Helper()
	mfs, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["node"] == node && labels["model"] == model {
				return m.GetGauge().GetValue()
			}
		}
	}
	return -1
}
