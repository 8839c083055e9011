package gpuscore

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
)

// The leader publishes its learned target on its lease, beside the other
// profiles' entries and the elector's holder; a standby, an unchanged
// target and a missing lease write nothing; a conflict (the elector
// renewed meanwhile) is read again.
func TestPublishLearnedTarget(t *testing.T) {
	ctx := context.Background()
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "gpu-scheduler",
		Annotations: map[string]string{gpu.AnnotationTargetWorkload: `{"other":{"at":"2026-12-01T00:00:00Z","tasks":[{"cpuMilli":1000,"gpuMilli":500,"gpuCount":1,"weight":1}]}}`}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("me")}}
	client := fake.NewClientset(lease)
	updates, conflicts := 0, 1
	client.PrependReactor("update", "leases", func(clienttesting.Action) (bool, runtime.Object, error) {
		updates++
		if conflicts > 0 {
			conflicts--
			return true, nil, apierrorsConflict()
		}
		return false, nil, nil
	})
	wl, err := gpu.NewWorkload([]gpu.Task{{CPU: 2000, Memory: 4096, Milli: 1000, Count: 2, Models: gpu.ModelSelector{Exact: []string{"A100"}, Exclude: []string{"MIG"}}, Weight: 3},
		{CPU: 1000, Milli: 250, Count: 1, Weight: 1}})
	if err != nil {
		t.Fatal(err)
	}
	leading := false
	current := wl
	var learner *gpu.Learner // once set, the target is its
	export := func(at time.Time) (*gpu.Workload, gpu.ExportedWorkload) {
		if learner != nil {
			return learner.Export(at)
		}
		return current, current.Export(at)
	}
	p := newPublisher(client, "kube-system/gpu-scheduler", "gpu-scheduler", true, func() bool { return leading }, export)
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	if err := p.publish(ctx, now); err != nil || updates != 0 {
		t.Fatalf("a standby published: %v, %d updates", err, updates)
	}
	leading = true
	if err := p.publish(ctx, now); err != nil {
		t.Fatal(err)
	}
	if updates != 2 {
		t.Errorf("%d updates, want 2 (one conflict, read again)", updates)
	}
	got, _ := client.CoordinationV1().Leases("kube-system").Get(ctx, "gpu-scheduler", metav1.GetOptions{})
	all, err := gpu.ExportedWorkloads(got.Annotations[gpu.AnnotationTargetWorkload])
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := all["other"]; !ok || ptr.Deref(got.Spec.HolderIdentity, "") != "me" {
		t.Errorf("the other profile's entry or the holder lost: %v", got)
	}
	back, err := all["gpu-scheduler"].Workload()
	if err != nil {
		t.Fatal(err)
	}
	if !all["gpu-scheduler"].At.Equal(now) || all["gpu-scheduler"].Holder != "me" || len(back.Tasks()) != 2 {
		t.Fatalf("published %+v", all["gpu-scheduler"])
	}
	for i, tk := range back.Tasks() {
		w := wl.Tasks()[i]
		if tk.CPU != w.CPU || tk.Memory != w.Memory || tk.Milli != w.Milli || tk.Count != w.Count || tk.Models.String() != w.Models.String() || tk.Weight != w.Weight {
			t.Errorf("task %d: %+v, want %+v", i, tk, w)
		}
	}
	// Unchanged: no write.
	if err := p.publish(ctx, now.Add(time.Minute)); err != nil || updates != 2 {
		t.Errorf("an unchanged target written again: %v, %d updates", err, updates)
	}
	// A rebuild to the same tasks (a new pointer): no write.
	current, _ = gpu.NewWorkload(wl.Tasks())
	if err := p.publish(ctx, now.Add(2*time.Minute)); err != nil || updates != 2 {
		t.Errorf("the same tasks written again: %v, %d updates", err, updates)
	}
	// The same tasks learned from more pods: written once the entry is
	// a minute old, so that a reader replays only the pods since.
	learner = gpu.NewLearner(1, 0)
	observe := func(from, to int) {
		for i := from; i < to; i++ {
			learner.Observe(fmt.Sprint("a", i), &gpu.Request{Milli: 500, CPU: 1000})
		}
	}
	observe(0, 10)
	at := now.Add(150 * time.Second)
	if err := p.publish(ctx, at); err != nil || updates != 3 {
		t.Fatalf("a learned target not written: %v, %d updates", err, updates)
	}
	observe(10, 13)
	if err := p.publish(ctx, at.Add(30*time.Second)); err != nil || updates != 3 {
		t.Errorf("the same tasks written again within a minute: %v, %d updates", err, updates)
	}
	if err := p.publish(ctx, at.Add(61*time.Second)); err != nil || updates != 4 {
		t.Errorf("the same tasks learned from more pods not written after a minute: %v, %d updates", err, updates)
	}
	got, _ = client.CoordinationV1().Leases("kube-system").Get(ctx, "gpu-scheduler", metav1.GetOptions{})
	if e := all0(got)["gpu-scheduler"]; e.SeenPods != 13 || len(e.Kinds) != 1 || e.Kinds[0].Weight != 13 || len(e.Recent) != 13 || e.Recent[12] != "a12" {
		t.Errorf("published %+v", e)
	}
	// Nothing learned since: nothing written, however old.
	if err := p.publish(ctx, at.Add(10*time.Minute)); err != nil || updates != 4 {
		t.Errorf("an unchanged target written again: %v, %d updates", err, updates)
	}
	// Other kinds of task: written at once. A share that moves by a
	// hundredth at most: once the entry is a minute old; by more: at once.
	learner = nil
	shifted := func(a, b float64) *gpu.Workload {
		ts := slices.Clone(wl.Tasks())
		ts[0].Weight, ts[1].Weight = b, a // ordered by milli-GPU: the share first
		w, err := gpu.NewWorkload(ts)
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	t0 := at.Add(11 * time.Minute)
	for i, step := range []struct {
		w       *gpu.Workload
		after   time.Duration
		written bool
	}{{wl, 0, true}, {shifted(0.755, 0.245), 10 * time.Second, false}, {shifted(0.745, 0.255), 20 * time.Second, false},
		{shifted(0.77, 0.23), 30 * time.Second, true}, {shifted(0.765, 0.235), 40 * time.Second, false},
		{shifted(0.765, 0.235), 91 * time.Second, true}} {
		current = step.w
		before := updates
		if err := p.publish(ctx, t0.Add(step.after)); err != nil || (updates > before) != step.written {
			t.Errorf("step %d: %v, written %v, want %v", i, err, updates > before, step.written)
		}
	}
	// A process of the same profile without leader election does not
	// overwrite the elected leader's entry.
	other, _ := gpu.NewWorkload([]gpu.Task{{CPU: 500, Milli: 100, Count: 1, Weight: 1}})
	q := newPublisher(client, "kube-system/gpu-scheduler", "gpu-scheduler", false, func() bool { return true },
		func(at time.Time) (*gpu.Workload, gpu.ExportedWorkload) { return other, other.Export(at) })
	before := updates
	if err := q.publish(ctx, now); err != nil || updates != before {
		t.Errorf("an unelected process overwrote the leader's entry: %v, %d updates", err, updates)
	}
	// A new leader with the same tasks writes its name.
	got.Spec.HolderIdentity = ptr.To("successor")
	if _, err := client.CoordinationV1().Leases("kube-system").Update(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	updates = 0
	p.last = nil
	if err := p.publish(ctx, now.Add(3*time.Minute)); err != nil || updates != 1 {
		t.Errorf("the new leader did not publish: %v, %d updates", err, updates)
	}
	got, _ = client.CoordinationV1().Leases("kube-system").Get(ctx, "gpu-scheduler", metav1.GetOptions{})
	if all, _ := gpu.ExportedWorkloads(got.Annotations[gpu.AnnotationTargetWorkload]); all["gpu-scheduler"].Holder != "successor" {
		t.Errorf("holder %q, want successor", all["gpu-scheduler"].Holder)
	}
	// No lease (no leader election): nothing, no error.
	updates = 0
	p = newPublisher(client, "kube-system/absent", "gpu-scheduler", true, func() bool { return true },
		func(at time.Time) (*gpu.Workload, gpu.ExportedWorkload) { return wl, wl.Export(at) })
	if err := p.publish(ctx, now); err != nil || updates != 0 {
		t.Errorf("without the lease: %v, %d updates", err, updates)
	}
}

func all0(l *coordinationv1.Lease) map[string]gpu.ExportedWorkload {
	all, _ := gpu.ExportedWorkloads(l.Annotations[gpu.AnnotationTargetWorkload])
	return all
}

func apierrorsConflict() error {
	return apierrors.NewConflict(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, "gpu-scheduler", nil)
}
