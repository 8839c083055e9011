package gpufit

import (
	"context"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	"k8s.io/kubernetes/test/utils/ktesting"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu/gputest"
)

// Two profiles of one scheduler share its informers; they must share the
// device accounting too. Profile A has reserved a share on a device and its
// pod is assumed (in the snapshot, without an assignment yet); profile B's
// cycle must see which device, or it books the same one. With one tracker
// per profile, B laid A's pod down on the highest free device and put its own
// share on top of A's.
func TestProfilesShareAccounting(t *testing.T) {
	tCtx := ktesting.Init(t)
	node := gpuNode("n", "2").Obj()
	client := fake.NewClientset()
	factory := informers.NewSharedInformerFactory(client, 0)
	a := sharedPod("a", "600").Obj()
	b := sharedPod("b", "600").Obj()
	newProfile := func(snapshot *cache.Snapshot) *GPUFit {
		fh, err := frameworkruntime.NewFramework(tCtx, nil, nil, frameworkruntime.WithSnapshotSharedLister(snapshot), frameworkruntime.WithPodActivator(&gputest.Activator{}),
			frameworkruntime.WithClientSet(client), frameworkruntime.WithInformerFactory(factory))
		if err != nil {
			t.Fatal(err)
		}
		pl, err := New(tCtx, accountingArgs(), fh)
		if err != nil {
			t.Fatal(err)
		}
		return pl.(*GPUFit)
	}
	snapshotA := cache.NewSnapshot(nil, []*v1.Node{node})
	plA := newProfile(snapshotA)
	for _, p := range []*v1.Pod{a, b} {
		factory.Core().V1().Pods().Informer().GetStore().Add(p)
	}
	csA := framework.NewCycleState()
	plA.PreFilter(tCtx, csA, a, nil)
	if s := plA.Reserve(tCtx, csA, a, "n"); !s.IsSuccess() {
		t.Fatal(s)
	}
	_, ra, _ := plA.shared.Tracker().Reserved(a.UID)

	// B's cycle: A's pod is assumed on the node.
	assumed := a.DeepCopy()
	assumed.Spec.NodeName = "n"
	snapshotB := cache.NewSnapshot([]*v1.Pod{assumed}, []*v1.Node{node})
	plB := newProfile(snapshotB)
	if plB.shared.Tracker() != plA.shared.Tracker() {
		t.Fatal("two profiles of one scheduler have two device accountings")
	}
	csB := framework.NewCycleState()
	plB.PreFilter(tCtx, csB, b, nil)
	ni, _ := snapshotB.Get("n")
	if s := plB.Filter(tCtx, csB, b, ni); !s.IsSuccess() {
		t.Fatalf("one device is still free: %v", s)
	}
	if s := plB.Reserve(tCtx, csB, b, "n"); !s.IsSuccess() {
		t.Fatal(s)
	}
	_, rb, _ := plB.shared.Tracker().Reserved(b.UID)
	if ra.Choice.Mask&rb.Choice.Mask != 0 {
		t.Fatalf("both profiles booked device mask %b: 1200 milli on one GPU", ra.Choice.Mask&rb.Choice.Mask)
	}
	// A third 600m share fits nowhere, whichever profile asks.
	c := sharedPod("c", "600").Obj()
	cs := framework.NewCycleState()
	plA.PreFilter(tCtx, cs, c, nil)
	if s := plA.Filter(tCtx, cs, c, ni); s.IsSuccess() {
		t.Errorf("a third 600m share fitted two devices holding 600m each")
	}
}

// Profiles read devices the same way, or the scheduler does not start: one
// accounting cannot count GPUs two ways.
func TestProfilesMustAgree(t *testing.T) {
	tCtx := ktesting.Init(t)
	client := fake.NewClientset()
	factory := informers.NewSharedInformerFactory(client, 0)
	var errs []error
	for _, label := range []string{gpu.LabelGPUProduct, "example.com/gpu-model"} {
		fh, err := frameworkruntime.NewFramework(tCtx, nil, nil, frameworkruntime.WithClientSet(client), frameworkruntime.WithInformerFactory(factory))
		if err != nil {
			t.Fatal(err)
		}
		args := accountingArgs()
		args.GPUProductLabel = label
		_, err = New(tCtx, args, fh)
		errs = append(errs, err)
	}
	if errs[0] != nil || errs[1] == nil || !strings.Contains(errs[1].Error(), "one device accounting per scheduler") {
		t.Errorf("want the second profile refused, got %v", errs)
	}
}

// bindFault makes the fake API server answer a binding with err; if lands,
// the binding is applied anyway (the response was lost, not the request).
func bindFault(t *testing.T, e *testEnv, err error, lands bool) {
	e.client.PrependReactor("create", "pods", func(action clienttesting.Action) (bool, runtime.Object, error) {
		if action.GetSubresource() != "binding" {
			return false, nil, nil
		}
		if lands {
			b := action.(clienttesting.CreateAction).GetObject().(*v1.Binding)
			gvr := schema.GroupVersionResource{Version: "v1", Resource: "pods"}
			obj, gerr := e.client.Tracker().Get(gvr, b.Namespace, b.Name)
			if gerr != nil {
				t.Error(gerr)
				return true, nil, err
			}
			p := obj.(*v1.Pod).DeepCopy()
			p.Spec.NodeName = b.Target.Name
			if p.Annotations == nil {
				p.Annotations = map[string]string{}
			}
			for k, v := range b.Annotations {
				p.Annotations[k] = v
			}
			if uerr := e.client.Tracker().Update(gvr, p, p.Namespace); uerr != nil {
				t.Error(uerr)
			}
		}
		return true, nil, err
	})
}

// A bind whose answer is lost must not free the devices: the pod may be
// bound. Each case fails the bind with an error and checks, right after
// Unreserve, whether another pod can take the device.
func TestBindErrorKeepsDevices(t *testing.T) {
	timeout := apierrors.NewTimeoutError("request did not complete within the allotted timeout", 1)
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "p", nil)
	tests := map[string]struct {
		err   error
		lands bool
		// bound: Bind reports success (the read showed the pod bound).
		bound bool
		// held: the device stays held after Unreserve.
		held bool
	}{
		"timeout, landed":              {err: timeout, lands: true, bound: true, held: true},
		"timeout, still in flight":     {err: timeout, lands: false, held: true},
		"connection lost, in flight":   {err: context.DeadlineExceeded, lands: false, held: true},
		"refused by the server":        {err: forbidden, lands: false, held: false},
		"conflict, bound by the first": {err: apierrors.NewConflict(schema.GroupResource{Resource: "pods"}, "p", nil), lands: true, bound: true, held: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tCtx := ktesting.Init(t)
			node := gpuNode("n", "1").Obj()
			e := newEnv(tCtx, t, nil, []*v1.Node{node}, nil)
			e.pl.inFlight.Store(int64(time.Hour))
			pod := wholePod("p", "1").Obj()
			if _, err := e.client.CoreV1().Pods("default").Create(tCtx, pod, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			e.factory.Core().V1().Pods().Informer().GetStore().Add(pod)
			bindFault(t, e, tc.err, tc.lands)
			cs := framework.NewCycleState()
			e.pl.PreFilter(tCtx, cs, pod, nil)
			if s := e.pl.Reserve(tCtx, cs, pod, "n"); !s.IsSuccess() {
				t.Fatal(s)
			}
			s := e.pl.Bind(tCtx, cs, pod, "n")
			if s.IsSuccess() != tc.bound {
				t.Fatalf("Bind: %v, want success %v", s, tc.bound)
			}
			if !s.IsSuccess() {
				// The framework releases a failed cycle; the scheduler's
				// cache forgets the assumed pod.
				e.pl.Unreserve(tCtx, cs, pod, "n")
			}
			other := wholePod("q", "1").Obj()
			cs2 := framework.NewCycleState()
			e.pl.PreFilter(tCtx, cs2, other, nil)
			got := e.pl.Filter(tCtx, cs2, other, e.nodeInfo(t, "n"))
			if got.IsSuccess() == tc.held {
				t.Errorf("another pod fits: %v, want the device held: %v", got.IsSuccess(), tc.held)
			}
		})
	}
}

// The devices of a bind that failed without an answer are released once the
// pod is seen unbound after the window in which the request could still land,
// and kept if it landed. Meanwhile the pod is not scheduled again (that could
// bind it twice, or move its hold while the first bind lands); then it is
// activated.
func TestBindErrorVerifiedRelease(t *testing.T) {
	for _, landsLate := range []bool{false, true} {
		t.Run(map[bool]string{false: "never lands", true: "lands late"}[landsLate], func(t *testing.T) {
			tCtx := ktesting.Init(t)
			e := newEnv(tCtx, t, nil, []*v1.Node{gpuNode("n", "1").Obj(), gpuNode("m", "1").Obj()}, nil)
			e.pl.inFlight.Store(int64(300 * time.Millisecond))
			pod := wholePod("p", "1").Obj()
			if _, err := e.client.CoreV1().Pods("default").Create(tCtx, pod, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			e.factory.Core().V1().Pods().Informer().GetStore().Add(pod)
			bindFault(t, e, apierrors.NewTimeoutError("timeout", 1), false)
			cs := framework.NewCycleState()
			e.pl.PreFilter(tCtx, cs, pod, nil)
			e.pl.Reserve(tCtx, cs, pod, "n")
			if s := e.pl.Bind(tCtx, cs, pod, "n"); s.IsSuccess() {
				t.Fatal("bind must fail")
			}
			if landsLate {
				// It lands on the server before the read back (no timing
				// race with the 300 ms window).
				bound, _ := e.client.CoreV1().Pods("default").Get(tCtx, "p", metav1.GetOptions{})
				bound.Spec.NodeName = "n"
				bound.Annotations = map[string]string{gpu.AnnotationAssignment: "n:0=1000"}
				if _, err := e.client.CoreV1().Pods("default").Update(tCtx, bound, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			} else {
				e.pl.inFlight.Store(int64(time.Hour)) // released only once the test lets it
			}
			e.pl.Unreserve(tCtx, cs, pod, "n")
			if !landsLate {
				// A retry now could go to m and free n while the bind lands.
				if _, s := e.pl.PreFilter(tCtx, framework.NewCycleState(), pod, nil); s.Code() != fwk.UnschedulableAndUnresolvable {
					t.Errorf("retry while the bind is in doubt: %v", s)
				}
				if _, _, held := e.pl.shared.Tracker().Reserved(pod.UID); !held {
					t.Errorf("released while the bind may land")
				}
				e.pl.inFlight.Store(int64(300 * time.Millisecond))
			}
			deadline := time.Now().Add(10 * time.Second)
			for {
				_, doubt := e.pl.shared.InDoubt(pod.UID)
				done := !doubt && (landsLate || len(e.act.Activated()) > 0)
				if done || time.Now().After(deadline) {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			_, _, held := e.pl.shared.Tracker().Reserved(pod.UID)
			if held != landsLate {
				t.Errorf("reservation held %v, want %v", held, landsLate)
			}
			if got := e.act.Activated(); landsLate != (len(got) == 0) {
				t.Errorf("activated %v; want the pod activated only if it did not land", got)
			}
			if _, s := e.pl.PreFilter(tCtx, framework.NewCycleState(), pod, nil); !s.IsSuccess() {
				t.Errorf("after the verdict the pod schedules again: %v", s)
			}
		})
	}
}

// Unreserve of a cycle that never bound releases only that cycle's
// reservation, not a later one of the same pod.
func TestUnreserveOwnCycleOnly(t *testing.T) {
	tCtx := ktesting.Init(t)
	e := newEnv(tCtx, t, nil, []*v1.Node{gpuNode("n", "2").Obj()}, nil)
	pod := wholePod("p", "1").Obj()
	e.factory.Core().V1().Pods().Informer().GetStore().Add(pod)
	first, second := framework.NewCycleState(), framework.NewCycleState()
	for _, cs := range []fwk.CycleState{first, second} {
		e.pl.PreFilter(tCtx, cs, pod, nil)
		if s := e.pl.Reserve(tCtx, cs, pod, "n"); !s.IsSuccess() {
			t.Fatal(s)
		}
	}
	e.pl.Unreserve(tCtx, first, pod, "n")
	if _, _, ok := e.pl.shared.Tracker().Reserved(pod.UID); !ok {
		t.Fatal("a stale cycle's Unreserve dropped the newer reservation")
	}
	e.pl.Unreserve(tCtx, second, pod, "n")
	if _, _, ok := e.pl.shared.Tracker().Reserved(pod.UID); ok {
		t.Fatal("not released")
	}
}
