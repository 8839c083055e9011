package hami

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/agent"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
)

func bindPod(name, node string, phase v1.PodPhase) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"}, Spec: v1.PodSpec{NodeName: node,
		Containers: []v1.Container{{Name: "c", Resources: v1.ResourceRequirements{Limits: v1.ResourceList{ResourceGPU: resource.MustParse("1")}}}}},
		Status: v1.PodStatus{Phase: phase}}
}

func withPhase(p *v1.Pod, phase string) *v1.Pod {
	p.Annotations = map[string]string{AnnotationBindPhase: phase}
	return p
}

func lockOf(t *testing.T, client *fake.Clientset, node string) string {
	t.Helper()
	n, err := client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Annotations[AnnotationNodeLock]
}

func plan(t *testing.T, b *Binder, pod *v1.Pod, node string) *Delivery {
	t.Helper()
	d, err := b.Plan(pod, node, []gpu.Device{{UUID: "GPU-a", MemoryMiB: 20000, Cores: 100, Slots: 4, Healthy: true}}, gpu.DeviceShare{Permille: 500, Cores: 50})
	if err != nil {
		t.Fatal(err)
	}
	return d.(*Delivery)
}

// A delivery holds the node's lock, verifies it is still its own, writes
// the plugin's device list with the binding, and releases only its own
// hold.
func TestDeliveryHold(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}, bindPod("a", "", v1.PodPending))
	b := &Binder{Client: client, Expiry: NodeLockTimeout, Wait: time.Second, Poll: 10 * time.Millisecond}
	d := plan(t, b, bindPod("a", "", v1.PodPending), "n")
	if d.Held() {
		t.Fatal("held before Hold")
	}
	if err := d.Hold(ctx); err != nil || !strings.HasSuffix(lockOf(t, client, "n"), ",ns,a") || !d.Held() {
		t.Fatalf("hold: %v %q", err, lockOf(t, client, "n"))
	}
	if err := d.Verify(ctx); err != nil {
		t.Errorf("verify own hold: %v", err)
	}
	if a := d.Annotations(time.Unix(1787307330, 0)); a[AnnotationAllocated] != "GPU-a,NVIDIA,10000,50:;" || a[AnnotationVGPUNode] != "n" || a[AnnotationBindPhase] != BindAllocating {
		t.Errorf("annotations %v", a)
	}
	if l := d.Labels(); l[AnnotationVGPUNode] != "n" {
		t.Errorf("labels %v", l)
	}
	// Taken over meanwhile (it expired, say): Verify refuses, Release
	// leaves the new holder's lock alone.
	n, _ := client.CoreV1().Nodes().Get(ctx, "n", metav1.GetOptions{})
	n.Annotations[AnnotationNodeLock] = NodeLockValue(time.Now(), "ns", "other")
	client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
	if err := d.Verify(ctx); err == nil {
		t.Error("verified a lock another pod holds")
	}
	if err := d.Release(ctx); err != nil || !strings.HasSuffix(lockOf(t, client, "n"), ",ns,other") {
		t.Errorf("released another pod's lock: %v %q", err, lockOf(t, client, "n"))
	}
}

// A live holder keeps the lock: the bind waits, and gives up as busy after
// Wait; a holder that has ended, is gone or is bound elsewhere is taken over
// at once.
func TestDeliveryHoldWaits(t *testing.T) {
	ctx := context.Background()
	abandoned := func(p *v1.Pod) bool { return p.Labels["bind"] == "abandoned" }
	mine := bindPod("h", "", v1.PodPending)
	mine.Labels = map[string]string{"bind": "abandoned"}
	for _, tc := range []struct {
		name   string
		holder *v1.Pod
		age    time.Duration
		busy   bool
	}{
		{"binding here", bindPod("h", "n", v1.PodPending), 0, true},
		{"unbound", bindPod("h", "", v1.PodPending), 0, true},
		{"unbound, long ago", bindPod("h", "", v1.PodPending), 2 * time.Minute, true},
		{"failed", bindPod("h", "n", v1.PodFailed), 0, false},
		{"bound elsewhere", bindPod("h", "m", v1.PodRunning), 0, false},
		// The plugin ended its bind and lost the write of its release.
		{"served here", withPhase(bindPod("h", "n", v1.PodRunning), BindSuccess), 0, false},
		// Success written by the pod's owner before the plugin served it:
		// the kubelet has not started it, the lock stays.
		{"success but not started", withPhase(bindPod("h", "n", v1.PodPending), BindSuccess), 2 * time.Minute, true},
		{"allocating here", withPhase(bindPod("h", "n", v1.PodPending), BindAllocating), 2 * time.Minute, true},
		{"gone", nil, 0, false},
		// Ours, and nobody binds it now: its scheduler died holding the
		// lock. Taken over once a Binding sent before could land no more.
		{"abandoned", mine, 2 * time.Minute, false},
		{"abandoned a moment ago", mine, 10 * time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: map[string]string{AnnotationNodeLock: NodeLockValue(time.Now().Add(-tc.age), "ns", "h")}}}
			objs := []runtime.Object{node}
			if tc.holder != nil {
				objs = append(objs, tc.holder)
			}
			client := fake.NewClientset(objs...)
			b := &Binder{Client: client, Expiry: NodeLockTimeout, Wait: 100 * time.Millisecond, Poll: 10 * time.Millisecond,
				Abandoned: abandoned, InFlight: time.Minute}
			d := plan(t, b, bindPod("a", "", v1.PodPending), "n")
			start := time.Now()
			err := d.Hold(ctx)
			if agent.IsBusy(err) != tc.busy || (!tc.busy && err != nil) {
				t.Fatalf("hold: %v, want busy %v", err, tc.busy)
			}
			if tc.busy && time.Since(start) < b.Wait {
				t.Errorf("gave up after %v, before the wait of %v", time.Since(start), b.Wait)
			}
			if !tc.busy && !strings.HasSuffix(lockOf(t, client, "n"), ",ns,a") {
				t.Errorf("not taken over: %q", lockOf(t, client, "n"))
			}
		})
	}
}

// A bind waiting for the lock goes as soon as it changes, not at the next
// poll.
func TestDeliveryHoldWokenByRelease(t *testing.T) {
	ctx := context.Background()
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: map[string]string{AnnotationNodeLock: NodeLockValue(time.Now(), "ns", "h")}}}
	client := fake.NewClientset(node, bindPod("h", "n", v1.PodPending))
	b := &Binder{Client: client, Expiry: NodeLockTimeout, Wait: time.Minute, Poll: time.Minute}
	d := plan(t, b, bindPod("a", "", v1.PodPending), "n")
	done := make(chan error, 1)
	go func() { done <- d.Hold(ctx) }()
	time.Sleep(50 * time.Millisecond)
	n, _ := client.CoreV1().Nodes().Get(ctx, "n", metav1.GetOptions{})
	delete(n.Annotations, AnnotationNodeLock)
	client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
	NodeLockChanged("n")
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("not woken by the release")
	}
}

// A bind waiting for a node's lock is woken by a change of that node's lock,
// not of another's, and a wake-up is never lost between the attempt and
// the wait.
func TestLockWait(t *testing.T) {
	a, b := lockWait("node-a"), lockWait("node-b")
	NodeLockChanged("node-b")
	select {
	case <-a:
		t.Fatal("woken by another node's lock")
	case <-b:
	}
	NodeLockChanged("node-a")
	select {
	case <-a:
	case <-time.After(time.Second):
		t.Fatal("not woken")
	}
	// Taken before the attempt: a change in between still wakes it.
	c := lockWait("node-a")
	NodeLockChanged("node-a")
	select {
	case <-c:
	default:
		t.Fatal("a change after the attempt was lost")
	}
}

// The pods HAMi placed are read by its label; a node whose name no label
// value can hold (over 63 characters) has none, and its bound pods are read
// instead: a label selector with that name would fail every bind there.
func TestDeliveryOthers(t *testing.T) {
	ctx := context.Background()
	long := strings.Repeat("n", 70)
	for _, node := range []string{"n", long} {
		client := fake.NewClientset()
		d := plan(t, &Binder{Client: client}, bindPod("a", "", v1.PodPending), node)
		if _, err := d.Others(ctx); err != nil {
			t.Fatal(err)
		}
		var got clienttesting.ListRestrictions
		for _, a := range client.Actions() {
			if l, ok := a.(clienttesting.ListAction); ok {
				got = l.GetListRestrictions()
			}
		}
		label, field := got.Labels.String(), got.Fields.String()
		if node == long {
			if label != "" || field != "spec.nodeName="+long {
				t.Errorf("long name: label %q, field %q", label, field)
			}
			if l := d.Labels(); len(l) != 0 {
				t.Errorf("a label no API server takes: %v", l)
			}
		} else if label != AnnotationVGPUNode+"=n" || field != "" {
			t.Errorf("label %q, field %q", label, field)
		}
	}
}

// Binds of one process waiting for a node's lock take turns: one of them
// reads the node while it is held, not all (they would each poll it and
// race for it at every release).
func TestDeliveryHoldTakesTurns(t *testing.T) {
	ctx := context.Background()
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "turns", Annotations: map[string]string{AnnotationNodeLock: NodeLockValue(time.Now(), "ns", "h")}}}
	client := fake.NewClientset(node, bindPod("h", "turns", v1.PodPending))
	b := &Binder{Client: client, Expiry: NodeLockTimeout, Wait: 300 * time.Millisecond, Poll: 10 * time.Millisecond}
	done := make(chan error, 10)
	for i := 0; i < 10; i++ {
		d := plan(t, b, bindPod(fmt.Sprintf("p%d", i), "", v1.PodPending), "turns")
		go func() { done <- d.Hold(ctx) }()
	}
	for i := 0; i < 10; i++ {
		if err := <-done; !agent.IsBusy(err) {
			t.Fatalf("hold: %v, want busy", err)
		}
	}
	gets := 0
	for _, a := range client.Actions() {
		if a.GetVerb() == "get" && a.GetResource().Resource == "nodes" {
			gets++
		}
	}
	// One waiter polling every 10 ms for 300 ms: about 30 reads; ten
	// polling together would make about 300.
	if gets > 60 {
		t.Errorf("%d reads of the node while 10 binds waited 300 ms for its lock", gets)
	}
}

// Verify renews the lock with its own time, so that the lock's age counts
// from the binding, however long the bind took before it; Release then
// gives back the renewed hold. A zero wait still takes a free node at once.
func TestDeliveryVerifyRenews(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "renew"}})
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	b := &Binder{Client: client, Expiry: NodeLockTimeout, Wait: 0, Now: func() time.Time { return now }}
	for i := 0; i < 50; i++ {
		d := plan(t, b, bindPod(fmt.Sprintf("z%d", i), "", v1.PodPending), "renew")
		if err := d.Hold(ctx); err != nil {
			t.Fatalf("a free node with no wait: %v", err)
		}
		if err := d.Release(ctx); err != nil || lockOf(t, client, "renew") != "" {
			t.Fatalf("release: %v %q", err, lockOf(t, client, "renew"))
		}
	}
	d := plan(t, b, bindPod("a", "", v1.PodPending), "renew")
	if err := d.Hold(ctx); err != nil {
		t.Fatal(err)
	}
	now = now.Add(40 * time.Second) // a slow recheck
	if err := d.Verify(ctx); err != nil {
		t.Fatal(err)
	}
	at, _, name, err := ParseNodeLock(lockOf(t, client, "renew"))
	if err != nil || !at.Equal(now) || name != "a" || lockOf(t, client, "renew") != d.Lock() {
		t.Errorf("after Verify the lock is %q (%v), want a's at %v", lockOf(t, client, "renew"), err, now)
	}
	if err := d.Release(ctx); err != nil || lockOf(t, client, "renew") != "" {
		t.Errorf("the renewed hold was not released: %v %q", err, lockOf(t, client, "renew"))
	}
}
