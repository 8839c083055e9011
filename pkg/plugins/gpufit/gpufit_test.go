package gpufit

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	klogtesting "k8s.io/klog/v2/ktesting"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/backend/cache"
	internalqueue "k8s.io/kubernetes/pkg/scheduler/backend/queue"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	"k8s.io/kubernetes/pkg/scheduler/metrics"
	st "k8s.io/kubernetes/pkg/scheduler/testing"
	"k8s.io/kubernetes/test/utils/ktesting"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config/scheme"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu/gputest"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/plugins/internal/shared"
)

const gpuRes = v1.ResourceName(gpu.ResourceNvidiaGPU)

func gpuNode(name string, gpus string) *st.NodeWrapper {
	return st.MakeNode().Name(name).Capacity(map[v1.ResourceName]string{v1.ResourceCPU: "32", v1.ResourceMemory: "128Gi", gpuRes: gpus})
}

// boundPod is a pod already on a node, holding devices by its annotation
// and the request that agrees with it.
func boundPod(name, node, assignment string) *v1.Pod {
	return gputest.BoundPod("default", name, node, assignment)
}

func wholePod(name string, n string) *st.PodWrapper {
	return st.MakePod().Name(name).Namespace("default").UID(name).SchedulerName(gpu.SchedulerName).
		Req(map[v1.ResourceName]string{v1.ResourceCPU: "1", gpuRes: n})
}

func sharedPod(name string, milli string) *st.PodWrapper {
	return st.MakePod().Name(name).Namespace("default").UID(name).SchedulerName(gpu.SchedulerName).
		Req(map[v1.ResourceName]string{v1.ResourceCPU: "1"}).Annotation(gpu.AnnotationMilli, milli)
}

type testEnv struct {
	fh       framework.Framework
	pl       *GPUFit
	snapshot *cache.Snapshot
	client   *fake.Clientset
	factory  informers.SharedInformerFactory
	act      *gputest.Activator
}

// accountingArgs are the default args with accounting-only sharing on: most
// tests here are of the accounting, on nodes without a device agent; the
// delivery rule has tests of its own (hami_test.go).
func accountingArgs() *config.GPUFitArgs {
	a := scheme.DefaultGPUFitArgs()
	a.AccountingOnlySharing = true
	return a
}

// newEnv builds a framework handle over a snapshot and the plugin on it.
// The informers are not started: tests put objects in their stores directly.
func newEnv(tCtx context.Context, t testing.TB, args *config.GPUFitArgs, nodes []*v1.Node, pods []*v1.Pod) *testEnv {
	t.Helper()
	client := fake.NewClientset()
	factory := informers.NewSharedInformerFactory(client, 0)
	snapshot := cache.NewSnapshot(pods, nodes)
	act := &gputest.Activator{}
	fh, err := frameworkruntime.NewFramework(tCtx, nil, nil,
		frameworkruntime.WithPodActivator(act),
		frameworkruntime.WithSnapshotSharedLister(snapshot),
		frameworkruntime.WithClientSet(client),
		frameworkruntime.WithInformerFactory(factory))
	if err != nil {
		t.Fatal(err)
	}
	if args == nil {
		args = accountingArgs()
	}
	var obj runtime.Object = args
	p, err := New(tCtx, obj, fh)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if err := factory.Core().V1().Nodes().Informer().GetStore().Add(n); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range pods {
		if err := factory.Core().V1().Pods().Informer().GetStore().Add(p); err != nil {
			t.Fatal(err)
		}
	}
	return &testEnv{fh: fh, pl: p.(*GPUFit), snapshot: snapshot, client: client, factory: factory, act: act}
}

func (e *testEnv) nodeInfo(t *testing.T, name string) fwk.NodeInfo {
	t.Helper()
	ni, err := e.snapshot.Get(name)
	if err != nil {
		t.Fatal(err)
	}
	return ni
}

func TestFilter(t *testing.T) {
	nodes := []*v1.Node{
		gpuNode("free1", "1").Obj(),
		// Devices 0 and 1 have 300 and 400 milli left: 700 in all.
		gpuNode("split", "2").Obj(),
		gpuNode("room", "2").Obj(),
		gpuNode("four", "4").Obj(),
		gpuNode("t4", "2").Label(gpu.LabelGPUProduct, "Tesla-T4").Obj(),
		st.MakeNode().Name("cpu").Capacity(map[v1.ResourceName]string{v1.ResourceCPU: "32"}).Obj(),
		gpuNode("mem", "2").Label(gpu.LabelGPUMemory, "16384").Obj(),
	}
	unhealthy := gpuNode("sick", "4").Obj()
	unhealthy.Status.Allocatable[gpuRes] = resource.MustParse("2")
	nodes = append(nodes, unhealthy)
	pods := []*v1.Pod{
		boundPod("a", "split", "split:0=700"),
		boundPod("b", "split", "split:1=600"),
		boundPod("c", "room", "room:0=700"),
		boundPod("d", "four", "four:2=1000"),
	}
	type want struct {
		code   fwk.Code
		reason string
	}
	ok := want{}
	tests := map[string]struct {
		pod   *v1.Pod
		nodes map[string]want
	}{
		"shared fits one device": {sharedPod("s", "500").Obj(), map[string]want{
			"free1": ok,
			"room":  ok,
			// 700 milli free in sum, but no single device has 500.
			"split": {fwk.Unschedulable, ErrReasonNoDeviceShare},
			"cpu":   {fwk.UnschedulableAndUnresolvable, ErrReasonNoGPU},
			"mem":   ok,
			"sick":  ok,
		}},
		"shared exactly the free part": {sharedPod("s", "400").Obj(), map[string]want{"split": ok}},
		"three whole GPUs": {wholePod("w", "3").Obj(), map[string]want{
			"four":  ok,
			"room":  {fwk.UnschedulableAndUnresolvable, ErrReasonTooFewDevices},
			"free1": {fwk.UnschedulableAndUnresolvable, ErrReasonTooFewDevices},
			// Capacity 4, but only 2 healthy.
			"sick": {fwk.UnschedulableAndUnresolvable, ErrReasonTooFewDevices},
		}},
		"four whole GPUs, one taken": {wholePod("w", "4").Obj(), map[string]want{
			"four": {fwk.Unschedulable, ErrReasonTooFewFree},
		}},
		"whole GPU on a partly shared node": {wholePod("w", "2").Obj(), map[string]want{
			"room":  {fwk.Unschedulable, ErrReasonTooFewFree},
			"split": {fwk.Unschedulable, ErrReasonTooFewFree},
			"sick":  ok,
		}},
		"model": {wholePod("w", "1").Annotation(gpu.AnnotationModel, "NVIDIA-A100-SXM4-80GB").Obj(), map[string]want{
			"t4":    {fwk.UnschedulableAndUnresolvable, ErrReasonModel},
			"free1": {fwk.UnschedulableAndUnresolvable, ErrReasonModel},
		}},
		"model matches": {wholePod("w", "1").Annotation(gpu.AnnotationModel, "A100|Tesla-T4").Obj(), map[string]want{"t4": ok}},
		"hami model alias": {wholePod("w", "1").Annotation(gpu.AnnotationHAMiUseType, "t4").Obj(), map[string]want{
			"t4": ok, "free1": {fwk.UnschedulableAndUnresolvable, ErrReasonModel}}},
		"memory share": {sharedPod("m", "").Obj(), nil},
	}
	// The memory case: 8Gi of a 16Gi device is 500 milli.
	memPod := st.MakePod().Name("m").Namespace("default").UID("m").Annotation(gpu.AnnotationMemory, "8Gi").Obj()
	tests["memory share"] = struct {
		pod   *v1.Pod
		nodes map[string]want
	}{memPod, map[string]want{
		"mem":   ok,
		"free1": {fwk.UnschedulableAndUnresolvable, ErrReasonMemoryUnknown},
	}}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tCtx := ktesting.Init(t)
			e := newEnv(tCtx, t, nil, nodes, pods)
			cs := framework.NewCycleState()
			all, _ := e.snapshot.NodeInfos().List()
			_, s := e.pl.PreFilter(tCtx, cs, tc.pod, all)
			// A model no node has is answered once, in PreFilter; Filter
			// still says so node by node.
			if nowhere := name == "model"; s.IsSuccess() == nowhere || nowhere && (s.Code() != fwk.UnschedulableAndUnresolvable || s.Message() != ErrReasonNoGPU+", "+ErrReasonModel) {
				t.Fatalf("PreFilter: %v", s)
			}
			for node, w := range tc.nodes {
				s := e.pl.Filter(tCtx, cs, tc.pod, e.nodeInfo(t, node))
				if s.Code() != w.code {
					t.Errorf("%s: code: want %v, got %v (%v)", node, w.code, s.Code(), s.Reasons())
				}
				if w.reason != "" && (len(s.Reasons()) != 1 || s.Reasons()[0] != w.reason) {
					t.Errorf("%s: reasons: want [%s], got %v", node, w.reason, s.Reasons())
				}
			}
		})
	}
}

// Every invalid annotation makes the pod unresolvable at PreFilter, with a
// message naming the key and the rule.
func TestPreFilterInvalid(t *testing.T) {
	tests := map[string]struct {
		pod  *v1.Pod
		want string
	}{
		"milli text":         {sharedPod("p", "lots").Obj(), `invalid annotation gpu-scheduler.io/gpu-milli="lots": must be an integer from 1 to 999`},
		"milli range":        {sharedPod("p", "1500").Obj(), `gpu-scheduler.io/gpu-milli="1500": must be an integer from 1 to 999`},
		"fraction":           {st.MakePod().Name("p").Annotation(gpu.AnnotationKAIFraction, "1.5").Obj(), `gpu-fraction="1.5": must be a decimal fraction greater than 0 and less than 1`},
		"fraction and milli": {sharedPod("p", "100").Annotation(gpu.AnnotationKAIFraction, "0.1").Obj(), `gpu-fraction="0.1": conflicts with gpu-scheduler.io/gpu-milli`},
		"shared with whole":  {wholePod("p", "2").Annotation(gpu.AnnotationMilli, "100").Obj(), `request nvidia.com/gpu: 1 (delivered by a device plugin that enforces shares) or none (accounting only), not 2`},
		"memory":             {st.MakePod().Name("p").Annotation(gpu.AnnotationMemory, "-3").Obj(), `gpu-scheduler.io/gpu-memory="-3": must be a positive amount`},
		"num devices":        {st.MakePod().Name("p").Annotation(gpu.AnnotationKAIFraction, "0.5").Annotation(gpu.AnnotationKAIFractionNumDevices, "3").Obj(), `gpu-fraction-num-devices="3": a fraction of more than one device is not supported`},
		"model empty":        {wholePod("p", "1").Annotation(gpu.AnnotationModel, "|").Obj(), `gpu-scheduler.io/gpu-model="|": must list at least one GPU model`},
		"model no gpu":       {st.MakePod().Name("p").Annotation(gpu.AnnotationModel, "T4").Obj(), `a GPU model constraint needs a GPU request`},
		"two model dialects": {wholePod("p", "1").Annotation(gpu.AnnotationModel, "T4").Annotation(gpu.AnnotationHAMiUseType, "T4").Obj(), `conflicts with nvidia.com/use-gputype`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tCtx := ktesting.Init(t)
			e := newEnv(tCtx, t, nil, nil, nil)
			_, s := e.pl.PreFilter(tCtx, framework.NewCycleState(), tc.pod, nil)
			if s.Code() != fwk.UnschedulableAndUnresolvable {
				t.Fatalf("want UnschedulableAndUnresolvable, got %v", s)
			}
			if !strings.Contains(s.Message(), tc.want) {
				t.Errorf("message %q does not contain %q", s.Message(), tc.want)
			}
		})
	}
}

func TestPreFilterSkipsCPUOnly(t *testing.T) {
	tCtx := ktesting.Init(t)
	e := newEnv(tCtx, t, nil, nil, nil)
	cs := framework.NewCycleState()
	_, s := e.pl.PreFilter(tCtx, cs, st.MakePod().Name("c").Req(map[v1.ResourceName]string{v1.ResourceCPU: "2"}).Obj(), nil)
	if !s.IsSkip() {
		t.Fatalf("want Skip, got %v", s)
	}
	// The request is still recorded for scoring.
	if _, err := cs.Read("PreFilterGPUFit"); err != nil {
		t.Errorf("request not written: %v", err)
	}
}

// Reserve picks devices consistently with the state; the binding carries
// exactly the reserved devices (default), or PreBind writes them (option);
// Unreserve releases them; both are idempotent.
func TestReserveBindUnreserve(t *testing.T) {
	for _, mode := range []string{config.WriteAtBind, config.WriteAtPreBind} {
		t.Run(mode, func(t *testing.T) {
			tCtx := ktesting.Init(t)
			node := gpuNode("n", "2").Obj()
			args := accountingArgs()
			args.AssignmentWrite = mode
			e := newEnv(tCtx, t, args, []*v1.Node{node}, []*v1.Pod{boundPod("a", "n", "n:0=600")})
			pod := sharedPod("s", "300").Obj()
			if _, err := e.client.CoreV1().Pods("default").Create(tCtx, pod, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			e.factory.Core().V1().Pods().Informer().GetStore().Add(pod)
			cs := framework.NewCycleState()
			if _, s := e.pl.PreFilter(tCtx, cs, pod, nil); !s.IsSuccess() {
				t.Fatal(s)
			}
			if s := e.pl.Reserve(tCtx, cs, pod, "n"); !s.IsSuccess() {
				t.Fatal(s)
			}
			if s := e.pl.Reserve(tCtx, cs, pod, "n"); !s.IsSuccess() {
				t.Fatalf("second Reserve must succeed (idempotent): %v", s)
			}
			node1, r, ok := e.pl.shared.Tracker().Reserved("s")
			// BestFit without GPUScore: the tighter device 0 (400 free).
			if !ok || node1 != "n" || r.Choice != (gpu.Choice{Mask: 1, Milli: 300}) {
				t.Fatalf("reservation: %v %+v %v", node1, r, ok)
			}
			_, pre := e.pl.PreBindPreFlight(tCtx, cs, pod, "n")
			if s := e.pl.PreBind(tCtx, cs, pod, "n"); !s.IsSuccess() {
				t.Fatal(s)
			}
			bind := e.pl.Bind(tCtx, cs, pod, "n")
			var written string
			for _, a := range e.client.Actions() {
				switch act := a.(type) {
				case clienttesting.CreateAction:
					if b, ok := act.GetObject().(*v1.Binding); ok && b.Target.Name == "n" {
						written = b.Annotations[gpu.AnnotationAssignment]
					}
				case clienttesting.PatchAction:
					if strings.Contains(string(act.GetPatch()), gpu.AnnotationAssignment) {
						written = "patch:" + string(act.GetPatch())
					}
				}
			}
			switch mode {
			case config.WriteAtBind:
				if !pre.IsSkip() || !bind.IsSuccess() || written != "n:0=300" {
					t.Errorf("bind mode: preflight %v, bind %v, written %q", pre, bind, written)
				}
			case config.WriteAtPreBind:
				if !pre.IsSuccess() || !bind.IsSkip() || !strings.Contains(written, `"gpu-scheduler.io/assignment":"n:0=300"`) {
					t.Errorf("prebind mode: preflight %v, bind %v, written %q", pre, bind, written)
				}
			}
			// A bound pod keeps its devices until its assignment is seen.
			if _, _, ok := e.pl.shared.Tracker().Reserved("s"); !ok {
				t.Errorf("released after a bind")
			}
			// A cycle that fails before binding releases them, once.
			again := sharedPod("s2", "300").Obj()
			e.factory.Core().V1().Pods().Informer().GetStore().Add(again)
			cs2 := framework.NewCycleState()
			e.pl.PreFilter(tCtx, cs2, again, nil)
			if s := e.pl.Reserve(tCtx, cs2, again, "n"); !s.IsSuccess() {
				t.Fatal(s)
			}
			e.pl.Unreserve(tCtx, cs2, again, "n")
			e.pl.Unreserve(tCtx, cs2, again, "n")
			if _, _, ok := e.pl.shared.Tracker().Reserved("s2"); ok {
				t.Errorf("still reserved after Unreserve")
			}
			// A CPU-only pod has nothing to write and is not ours to bind.
			cpu := framework.NewCycleState()
			cpuPod := st.MakePod().Name("c").Obj()
			e.pl.PreFilter(tCtx, cpu, cpuPod, nil)
			if s := e.pl.Reserve(tCtx, cpu, cpuPod, "n"); !s.IsSuccess() {
				t.Fatal(s)
			}
			if _, s := e.pl.PreBindPreFlight(tCtx, cpu, cpuPod, "n"); !s.IsSkip() {
				t.Errorf("PreBindPreFlight for a CPU pod: want Skip, got %v", s)
			}
			if s := e.pl.Bind(tCtx, cpu, cpuPod, "n"); !s.IsSkip() {
				t.Errorf("Bind for a CPU pod: want Skip, got %v", s)
			}
		})
	}
}

// Scheduling cycles are serial, but binding cycles run in parallel and may
// Unreserve at any time. However they interleave, no device is ever booked
// beyond its capacity, and a pod that no longer fits is refused at Reserve.
func TestReserveConcurrentUnreserve(t *testing.T) {
	tCtx := ktesting.Init(t)
	node := gpuNode("n", "2").Obj()
	e := newEnv(tCtx, t, nil, []*v1.Node{node}, nil)
	tr := e.pl.shared.Tracker()
	var wg sync.WaitGroup
	type cycle struct {
		pod *v1.Pod
		cs  fwk.CycleState
	}
	release := make(chan cycle, 1000)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range release {
				e.pl.Unreserve(tCtx, c.cs, c.pod, "n")
				e.pl.Unreserve(tCtx, c.cs, c.pod, "n")
			}
		}()
	}
	refused := 0
	for i := 0; i < 600; i++ {
		pod := sharedPod(fmt.Sprintf("p%d", i), "300").Obj()
		// The pod exists in the API while the scheduler works on it.
		e.factory.Core().V1().Pods().Informer().GetStore().Add(pod)
		cs := framework.NewCycleState()
		if _, s := e.pl.PreFilter(tCtx, cs, pod, nil); !s.IsSuccess() {
			t.Fatal(s)
		}
		s := e.pl.Reserve(tCtx, cs, pod, "n")
		if !s.IsSuccess() {
			if s.Code() != fwk.Unschedulable || s.Reasons()[0] != ErrReasonDevicesChanged {
				t.Fatalf("unexpected status %v", s)
			}
			refused++
		} else if i%2 == 0 {
			release <- cycle{pod, cs}
		}
		var used [2]int32
		for _, r := range tr.Reservations() {
			for _, d := range r.Choice.Devices() {
				used[d] += r.Choice.Milli
			}
		}
		if used[0] > 1000 || used[1] > 1000 {
			t.Fatalf("device over-booked: %v", used)
		}
	}
	close(release)
	wg.Wait()
	if refused == 0 {
		t.Errorf("the node fills up: some Reserve must have been refused")
	}
	// Only the pods never released still hold devices: at most 3 per device.
	if n := len(tr.Reservations()); n > 6 || n == 0 {
		t.Errorf("reservations left: %d", n)
	}
}

// A reservation whose pod was deleted no longer holds devices, even before
// any event handler runs: the scheduler's cache may already have dropped the
// pod, and a stale reservation would block the device (found by the e2e
// suite). A reservation of an unbound pod that still exists keeps holding.
func TestStaleReservation(t *testing.T) {
	tCtx := ktesting.Init(t)
	node := gpuNode("n", "1").Obj()
	e := newEnv(tCtx, t, nil, []*v1.Node{node}, nil)
	first := wholePod("first", "1").Obj()
	store := e.factory.Core().V1().Pods().Informer().GetStore()
	store.Add(first)
	cs := framework.NewCycleState()
	e.pl.PreFilter(tCtx, cs, first, nil)
	if s := e.pl.Reserve(tCtx, cs, first, "n"); !s.IsSuccess() {
		t.Fatal(s)
	}
	second := wholePod("second", "1").Obj()
	filter := func() *fwk.Status {
		cs := framework.NewCycleState()
		e.pl.PreFilter(tCtx, cs, second, nil)
		return e.pl.Filter(tCtx, cs, second, e.nodeInfo(t, "n"))
	}
	// In flight: the device is held, in the snapshot view and in the hint's.
	if s := filter(); s.IsSuccess() {
		t.Fatalf("the reserved device must be held")
	}
	logger, _ := ktestingLogger(t)
	if h, _ := e.pl.isSchedulableAfterNodeChange(logger, second, nil, node); h != fwk.QueueSkip {
		t.Errorf("hint: the reserved device must be held")
	}
	// Deleted: the informer no longer has it; no handler has run.
	store.Delete(first)
	e.snapshot = cache.NewSnapshot(nil, []*v1.Node{node}) // a new cycle's view
	if s := filter(); !s.IsSuccess() {
		t.Fatalf("stale reservation still holds the device: %v", s)
	}
	if _, _, ok := e.pl.shared.Tracker().Reserved("first"); ok {
		t.Errorf("stale reservation not dropped")
	}
	if h, _ := e.pl.isSchedulableAfterNodeChange(logger, second, nil, node); h != fwk.Queue {
		t.Errorf("hint: want Queue once the reserved pod is gone")
	}
}

func TestNewValidatesArgs(t *testing.T) {
	tCtx := ktesting.Init(t)
	args := accountingArgs()
	args.GPUResourceNames = []string{"gpu"}
	args.Requeue.Workers = 0
	fh, _ := frameworkruntime.NewFramework(tCtx, nil, nil)
	_, err := New(tCtx, args, fh)
	if err == nil {
		t.Fatal("want an error")
	}
	for _, want := range []string{`args.gpuResourceNames[0]: Invalid value: "gpu": must be an extended resource name`, "args.requeue.workers: Invalid value: 0: must be from 1 to 64"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
}

func TestSignPod(t *testing.T) {
	tCtx := ktesting.Init(t)
	e := newEnv(tCtx, t, nil, nil, nil)
	a, _ := e.pl.SignPod(tCtx, sharedPod("a", "300").Obj())
	b, _ := e.pl.SignPod(tCtx, sharedPod("b", "300").Obj())
	c, _ := e.pl.SignPod(tCtx, sharedPod("c", "400").Obj())
	if diff := cmp.Diff(a, b); diff != "" {
		t.Errorf("same request, different signatures: %s", diff)
	}
	if cmp.Equal(a, c) {
		t.Errorf("different requests must sign differently")
	}
	if _, s := e.pl.SignPod(tCtx, sharedPod("d", "x").Obj()); s.IsSuccess() {
		t.Errorf("an invalid request cannot be signed")
	}
}

func ktestingLogger(t *testing.T) (klog.Logger, context.Context) {
	return klogtesting.NewTestContext(t)
}

// Reserve does not choose a device held for a preemptor nominated to the
// node (its victims gone, it not bound yet): the filters counted it, so the
// choice must too.
func TestReserveLeavesANomineesDevices(t *testing.T) {
	tCtx := ktesting.Init(t)
	metrics.Register() // the scheduling queue counts its pods
	node := gpuNode("n", "2").Obj()
	client := fake.NewClientset()
	factory := informers.NewSharedInformerFactory(client, 0)
	snapshot := cache.NewSnapshot(nil, []*v1.Node{node})
	queue := internalqueue.NewSchedulingQueue(nil, factory)
	fh, err := frameworkruntime.NewFramework(tCtx, nil, nil,
		frameworkruntime.WithPodActivator(&gputest.Activator{}),
		frameworkruntime.WithSnapshotSharedLister(snapshot),
		frameworkruntime.WithPodNominator(queue),
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
	factory.Core().V1().Nodes().Informer().GetStore().Add(node)
	preemptor := wholePod("preemptor", "1").Priority(1000).Obj()
	// The nominator keeps only pods its lister has, and gives their
	// specs only for pods in the queue.
	factory.Core().V1().Pods().Informer().GetStore().Add(preemptor)
	queue.Add(tCtx, preemptor)
	pi, _ := framework.NewPodInfo(preemptor)
	queue.AddNominatedPod(klog.FromContext(tCtx), pi, &fwk.NominatingInfo{NominatingMode: fwk.ModeOverride, NominatedNodeName: "n"})
	for _, held := range []int{0, 1} {
		pl.shared.Tracker().Nominate(preemptor.UID, "n", gpu.Choice{Mask: 1 << uint(held), Milli: gpu.MilliPerGPU})
		for _, prio := range []int32{0, 1000} {
			pod := wholePod(fmt.Sprintf("low-%d-%d", held, prio), "1").Priority(prio).Obj()
			factory.Core().V1().Pods().Informer().GetStore().Add(pod)
			cs := framework.NewCycleState()
			pl.PreFilter(tCtx, cs, pod, nil)
			if s := pl.Reserve(tCtx, cs, pod, "n"); !s.IsSuccess() {
				t.Fatal(s)
			}
			rs := readReserve(cs)
			if prio < 1000 && rs.choice.Mask == 1<<uint(held) {
				t.Errorf("held device %d: a lower-priority pod reserved it", held)
			}
			pl.Unreserve(tCtx, cs, pod, "n")
		}
	}
}

// In a pod group's preemption dry run, a pod pinned to devices of a node
// fits only on them, and reserves them, whatever the policy would choose;
// the pin says nothing of other nodes. Device 0 of "room" has 300 milli
// free, devices 1 and 2 are free.
func TestPinnedFilterAndReserve(t *testing.T) {
	nodes := []*v1.Node{gpuNode("room", "3").Obj(), gpuNode("other", "2").Obj()}
	pods := []*v1.Pod{boundPod("c", "room", "room:0=700")}
	pod := sharedPod("s", "500").Obj()
	const anyFree = 0b110
	pin := func(node string, mask uint64) *shared.Pin {
		return &shared.Pin{Node: node, Choice: gpu.Choice{Mask: mask, Milli: 500}}
	}
	tests := map[string]struct {
		pin     *shared.Pin
		want    fwk.Code
		reserve uint64 // the devices Reserve may take (0: it fails)
	}{
		"unpinned":         {nil, fwk.Success, anyFree},
		"pinned to dev 1":  {pin("room", 0b010), fwk.Success, 0b010},
		"pinned to dev 2":  {pin("room", 0b100), fwk.Success, 0b100},
		"pinned elsewhere": {pin("other", 0b01), fwk.Success, anyFree},
		// Without the pin it fits (devices 1, 2): pinned, it does not.
		"pinned to the used device": {pin("room", 0b001), fwk.Unschedulable, 0},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tCtx := ktesting.Init(t)
			e := newEnv(tCtx, t, nil, nodes, pods)
			cs := framework.NewCycleState()
			all, _ := e.snapshot.NodeInfos().List()
			if _, s := e.pl.PreFilter(tCtx, cs, pod, all); !s.IsSuccess() {
				t.Fatal(s)
			}
			if tc.pin != nil {
				if err := shared.WritePin(cs, tc.pin); err != nil {
					t.Fatal(err)
				}
			}
			s := e.pl.Filter(tCtx, cs, pod, e.nodeInfo(t, "room"))
			if s.Code() != tc.want {
				t.Fatalf("Filter: want %v, got %v", tc.want, s)
			}
			if tc.want == fwk.Unschedulable && s.Reasons()[0] != ErrReasonNoDeviceShare {
				t.Errorf("reason: %v", s.Reasons())
			}
			s = e.pl.Reserve(tCtx, cs, pod, "room")
			if tc.reserve == 0 {
				if s.IsSuccess() {
					t.Errorf("Reserve took devices the pin does not allow: %b", readReserve(cs).choice.Mask)
				}
				return
			}
			if !s.IsSuccess() {
				t.Fatal(s)
			}
			if got := readReserve(cs).choice.Mask; got&^tc.reserve != 0 || got == 0 {
				t.Errorf("reserved %b, want within %b", got, tc.reserve)
			}
			e.pl.Unreserve(tCtx, cs, pod, "room")
		})
	}
}
