package gpufit

import (
	"context"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	st "k8s.io/kubernetes/pkg/scheduler/testing"
	"k8s.io/kubernetes/test/utils/ktesting"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/agent/hami"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config/scheme"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
)

const hamiRegister = `[{"id":"GPU-a","count":4,"devmem":20000,"devcore":100,"type":"NVIDIA L4","mode":"hami-core","health":true},` +
	`{"id":"GPU-b","index":1,"count":4,"devmem":20000,"devcore":100,"type":"NVIDIA L4","mode":"hami-core","health":true}]`

func hamiNode(name string) *v1.Node {
	n := gpuNode(name, "8").Obj()
	n.Annotations = map[string]string{hami.AnnotationRegister: hamiRegister}
	return n
}

func slotPod(name, milli string) *v1.Pod {
	return st.MakePod().Name(name).Namespace("default").UID(name).SchedulerName(gpu.SchedulerName).
		Req(map[v1.ResourceName]string{v1.ResourceCPU: "1", gpuRes: "1"}).Annotation(gpu.AnnotationMilli, milli).Obj()
}

// With the default args, a share goes only where it is delivered: a HAMi
// node, and only when the pod asks for the device plugin's slot.
func TestDelivery(t *testing.T) {
	tCtx := ktesting.Init(t)
	e := newEnv(tCtx, t, scheme.DefaultGPUFitArgs(), []*v1.Node{hamiNode("hami"), gpuNode("plain", "2").Obj()}, nil)
	tests := []struct {
		pod         *v1.Pod
		hami, plain string // "" fits
	}{
		{slotPod("slot", "500"), "", ErrReasonNoDelivery},
		{sharedPod("annotation-only", "500").Obj(), ErrReasonNoDelivery, ErrReasonNoDelivery},
		{wholePod("whole", "2").Obj(), "", ""},
		{wholePod("three", "3").Obj(), ErrReasonTooFewDevices, ErrReasonTooFewDevices},
		{st.MakePod().Name("dialect").Namespace("default").UID("dialect").SchedulerName(gpu.SchedulerName).
			Req(map[v1.ResourceName]string{gpuRes: "1", hami.ResourceMemory: "30000"}).Obj(), ErrReasonShareTooLarge, ErrReasonNoDelivery},
		{st.MakePod().Name("uuid").Namespace("default").UID("uuid").SchedulerName(gpu.SchedulerName).Annotation(gpu.AnnotationHAMiUseUUID, "GPU-z").
			Req(map[v1.ResourceName]string{gpuRes: "1"}).Obj(), ErrReasonDeviceNotAllowed, ErrReasonDeviceNotAllowed},
	}
	for _, tc := range tests {
		cs := framework.NewCycleState()
		if _, s := e.pl.PreFilter(tCtx, cs, tc.pod, nil); !s.IsSuccess() {
			t.Fatalf("%s: %v", tc.pod.Name, s)
		}
		for node, want := range map[string]string{"hami": tc.hami, "plain": tc.plain} {
			got := ""
			if s := e.pl.Filter(tCtx, cs, tc.pod, e.nodeInfo(t, node)); s != nil {
				got = strings.Join(s.Reasons(), "")
			}
			if got != want {
				t.Errorf("%s on %s: got %q, want %q", tc.pod.Name, node, got, want)
			}
		}
	}
}

// On a HAMi node, Bind takes the node's lock and the binding carries the
// device plugin's annotations with the devices reserved; a choice another
// scheduler took meanwhile (its pod labelled for the node, not yet in the
// informer) fails the bind, and Unreserve releases the lock.
func TestHAMiBind(t *testing.T) {
	tCtx := ktesting.Init(t)
	node := hamiNode("hami")
	e := newEnv(tCtx, t, scheme.DefaultGPUFitArgs(), []*v1.Node{node}, nil)
	if _, err := e.client.CoreV1().Nodes().Create(tCtx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	lock := func() string {
		n, _ := e.client.CoreV1().Nodes().Get(tCtx, "hami", metav1.GetOptions{})
		return n.Annotations[hami.AnnotationNodeLock]
	}
	run := func(pod *v1.Pod) (*v1.Binding, bool) {
		t.Helper()
		if _, err := e.client.CoreV1().Pods("default").Create(tCtx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		e.factory.Core().V1().Pods().Informer().GetStore().Add(pod)
		cs := framework.NewCycleState()
		if _, s := e.pl.PreFilter(tCtx, cs, pod, nil); !s.IsSuccess() {
			t.Fatal(s)
		}
		if s := e.pl.Reserve(tCtx, cs, pod, "hami"); !s.IsSuccess() {
			t.Fatal(s)
		}
		// The lock is taken in Bind, after every PreBind: none here.
		if _, s := e.pl.PreBindPreFlight(tCtx, cs, pod, "hami"); !s.IsSkip() {
			t.Fatalf("PreBindPreFlight: %v, want Skip (the lock is taken in Bind)", s)
		}
		if s := e.pl.Bind(tCtx, cs, pod, "hami"); !s.IsSuccess() {
			e.pl.Unreserve(tCtx, cs, pod, "hami")
			return nil, false
		}
		if !strings.HasSuffix(lock(), ",default,"+pod.Name) {
			t.Fatalf("lock %q", lock())
		}
		for _, a := range e.client.Actions() {
			if c, ok := a.(clienttesting.CreateAction); ok {
				if b, ok := c.GetObject().(*v1.Binding); ok && b.Name == pod.Name {
					return b, true
				}
			}
		}
		t.Fatal("no binding")
		return nil, false
	}
	b, ok := run(slotPod("s", "500"))
	if !ok {
		t.Fatal("PreBind failed")
	}
	want := "GPU-a,NVIDIA,10000,50:;"
	if a := b.Annotations; a[hami.AnnotationAllocated] != want || a[hami.AnnotationToAllocate] != want || a[hami.AnnotationVGPUNode] != "hami" ||
		a[hami.AnnotationBindPhase] != hami.BindAllocating || a[hami.AnnotationBindTime] == "" || a[gpu.AnnotationAssignment] != "hami:0=500" {
		t.Errorf("binding annotations %v", a)
	}

	// HAMi's scheduler gives GPU-b whole to a pod it has not bound yet
	// (GPU-a holds our share); our informer has not seen the pod.
	taken := st.MakePod().Name("by-hami").Namespace("default").UID("by-hami").Label(hami.AnnotationVGPUNode, "hami").
		Annotation(hami.AnnotationVGPUNode, "hami").Annotation(hami.AnnotationAllocated, "GPU-b,NVIDIA,20000,100:;").
		Req(map[v1.ResourceName]string{gpuRes: "1"}).Obj()
	if _, err := e.client.CoreV1().Pods("default").Create(tCtx, taken, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The first pod's lock is the device plugin's to release.
	n, _ := e.client.CoreV1().Nodes().Get(tCtx, "hami", metav1.GetOptions{})
	delete(n.Annotations, hami.AnnotationNodeLock)
	e.client.CoreV1().Nodes().Update(tCtx, n, metav1.UpdateOptions{})
	if _, ok := run(wholePod("w", "1").Obj()); ok {
		t.Errorf("bound a whole GPU onto the device HAMi's scheduler took")
	}
	// Unreserve releases it in the background.
	if err := wait.PollUntilContextTimeout(tCtx, 10*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		return lock() == "", nil
	}); err != nil {
		t.Errorf("lock left after the failed bind: %q", lock())
	}
}

// With assignmentWrite: PreBind, the same annotations and HAMi's label are
// patched onto the pod before the default binder binds it.
func TestHAMiPreBindMode(t *testing.T) {
	tCtx := ktesting.Init(t)
	node := hamiNode("hami")
	args := scheme.DefaultGPUFitArgs()
	args.AssignmentWrite = config.WriteAtPreBind
	e := newEnv(tCtx, t, args, []*v1.Node{node}, nil)
	if _, err := e.client.CoreV1().Nodes().Create(tCtx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := st.MakePod().Name("h").Namespace("default").UID("h").SchedulerName(gpu.SchedulerName).
		Req(map[v1.ResourceName]string{gpuRes: "1", hami.ResourceMemoryPercent: "25", hami.ResourceCores: "20"}).Obj()
	if _, err := e.client.CoreV1().Pods("default").Create(tCtx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cs := framework.NewCycleState()
	if _, s := e.pl.PreFilter(tCtx, cs, pod, nil); !s.IsSuccess() {
		t.Fatal(s)
	}
	if s := e.pl.Reserve(tCtx, cs, pod, "hami"); !s.IsSuccess() {
		t.Fatal(s)
	}
	// After VolumeBinding and DynamicResources, never beside them: the
	// lock must not wait out their binds.
	if r, s := e.pl.PreBindPreFlight(tCtx, cs, pod, "hami"); !s.IsSuccess() || r.AllowParallel {
		t.Fatalf("PreBindPreFlight: %v %+v, want sequential", s, r)
	}
	if s := e.pl.PreBind(tCtx, cs, pod, "hami"); !s.IsSuccess() {
		t.Fatal(s)
	}
	got, err := e.client.CoreV1().Pods("default").Get(tCtx, "h", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := "GPU-a,NVIDIA,5000,20:;"; got.Annotations[hami.AnnotationAllocated] != want || got.Annotations[hami.AnnotationToAllocate] != want ||
		got.Labels[hami.AnnotationVGPUNode] != "hami" || got.Annotations[hami.AnnotationBindPhase] != hami.BindAllocating {
		t.Errorf("patched %v %v", got.Labels, got.Annotations)
	}
	if s := e.pl.Bind(tCtx, cs, pod, "hami"); !s.IsSkip() {
		t.Errorf("Bind: %v, want Skip (the default binder binds)", s)
	}
}

// The lock taken over between the hold and the binding (it expired, and
// another scheduler took it): the bind fails before any Binding is sent,
// and the other holder's lock is left alone.
func TestHAMiBindVerifiesTheLock(t *testing.T) {
	tCtx := ktesting.Init(t)
	node := hamiNode("hami")
	e := newEnv(tCtx, t, scheme.DefaultGPUFitArgs(), []*v1.Node{node}, nil)
	if _, err := e.client.CoreV1().Nodes().Create(tCtx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	other := hami.NodeLockValue(time.Now(), "else", "where")
	locked := false
	// Once our lock is written, the next read of the node finds another's.
	e.client.PrependReactor("get", "nodes", func(clienttesting.Action) (bool, runtime.Object, error) {
		n, err := e.client.Tracker().Get(v1.SchemeGroupVersion.WithResource("nodes"), "", "hami")
		if err != nil {
			return false, nil, nil
		}
		nd := n.(*v1.Node)
		if v := nd.Annotations[hami.AnnotationNodeLock]; strings.HasSuffix(v, ",default,s") && !locked {
			locked = true
			nd = nd.DeepCopy()
			nd.Annotations[hami.AnnotationNodeLock] = other
			if err := e.client.Tracker().Update(v1.SchemeGroupVersion.WithResource("nodes"), nd, ""); err != nil {
				t.Error(err)
			}
		}
		return false, nil, nil
	})
	pod := slotPod("s", "500")
	if _, err := e.client.CoreV1().Pods("default").Create(tCtx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cs := framework.NewCycleState()
	if _, s := e.pl.PreFilter(tCtx, cs, pod, nil); !s.IsSuccess() {
		t.Fatal(s)
	}
	if s := e.pl.Reserve(tCtx, cs, pod, "hami"); !s.IsSuccess() {
		t.Fatal(s)
	}
	if s := e.pl.Bind(tCtx, cs, pod, "hami"); s.IsSuccess() {
		t.Fatal("bound while another pod held the node's lock")
	}
	e.pl.Unreserve(tCtx, cs, pod, "hami")
	for _, a := range e.client.Actions() {
		if c, ok := a.(clienttesting.CreateAction); ok {
			if _, ok := c.GetObject().(*v1.Binding); ok {
				t.Fatal("a Binding was sent")
			}
		}
	}
	time.Sleep(100 * time.Millisecond) // Unreserve's release runs in the background
	n, _ := e.client.CoreV1().Nodes().Get(tCtx, "hami", metav1.GetOptions{})
	if got := n.Annotations[hami.AnnotationNodeLock]; got != other {
		t.Errorf("the other holder's lock became %q", got)
	}
}

// With assignmentWrite: PreBind on a node whose name no label value can
// hold, the pod's own labels survive (a null map in the merge patch would
// remove them all, taking the pod out of its ReplicaSet and Services).
func TestHAMiPreBindModeKeepsLabels(t *testing.T) {
	tCtx := ktesting.Init(t)
	name := strings.Repeat("h", 70)
	node := hamiNode(name)
	args := scheme.DefaultGPUFitArgs()
	args.AssignmentWrite = config.WriteAtPreBind
	e := newEnv(tCtx, t, args, []*v1.Node{node}, nil)
	if _, err := e.client.CoreV1().Nodes().Create(tCtx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := slotPod("l", "500")
	pod.Labels = map[string]string{"app": "train"}
	if _, err := e.client.CoreV1().Pods("default").Create(tCtx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cs := framework.NewCycleState()
	if _, s := e.pl.PreFilter(tCtx, cs, pod, nil); !s.IsSuccess() {
		t.Fatal(s)
	}
	if s := e.pl.Reserve(tCtx, cs, pod, name); !s.IsSuccess() {
		t.Fatal(s)
	}
	if s := e.pl.PreBind(tCtx, cs, pod, name); !s.IsSuccess() {
		t.Fatal(s)
	}
	got, err := e.client.CoreV1().Pods("default").Get(tCtx, "l", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Labels["app"] != "train" || got.Annotations[hami.AnnotationAllocated] == "" {
		t.Errorf("labels %v, annotations %v", got.Labels, got.Annotations)
	}
}
