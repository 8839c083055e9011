package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/fleet"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/localcp"
	"github.com/gpu-scheduler/gpu-scheduler/test/harness"
)

// gangScheduler runs a gpu-scheduler with the GenericWorkload gate on (the
// GangScheduling plugin joins its profile) under its own scheduler name.
func gangScheduler(t *testing.T) (*localcp.Scheduler, string) {
	t.Helper()
	if !cluster.Local() {
		t.Skip("needs the local control plane (a deployed cluster would need the gates on its own kube-apiserver)")
	}
	needGangs(t)
	profile := "gpu-scheduler-gang"
	sched, err := harness.StartProfile(context.Background(), cluster, filepath.Join(harness.BinDir(), "gpu-scheduler"), profile, nil,
		harness.AccountingOnlySharing, "--feature-gates=GenericWorkload=true")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(sched.Tail(60))
		}
		sched.Stop(5 * time.Second)
	})
	return sched, profile
}

// needGangs skips a test of gangs before Kubernetes 1.37: the PodGroup API
// (scheduling.k8s.io/v1beta1) that GenericWorkload needs is new there.
func needGangs(t *testing.T) {
	t.Helper()
	if m := cluster.Minor(); m != 0 && m < 37 {
		t.Skipf("gangs need Kubernetes 1.37 (the PodGroup API, scheduling.k8s.io/v1beta1); the API server is 1.%d", m)
	}
}

func gang(t *testing.T, s *harness.Scope, name string, minCount int32) {
	t.Helper()
	pg := &schedulingv1beta1.PodGroup{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.NS},
		Spec: schedulingv1beta1.PodGroupSpec{SchedulingPolicy: schedulingv1beta1.PodGroupSchedulingPolicy{
			Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: minCount}}},
	}
	if _, err := cluster.Client.SchedulingV1beta1().PodGroups(s.NS).Create(s.Ctx, pg, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func gangPods(s *harness.Scope, sched, group string, n, gpus int) []string {
	var names []string
	for i := 0; i < n; i++ {
		names = append(names, gangPod(s, sched, group, i, gpus))
	}
	return names
}

func gangPod(s *harness.Scope, sched, group string, i, gpus int) string {
	name := fmt.Sprintf("%s-%d", group, i)
	s.Create(s.Pod(harness.PodSpec{Name: name, GPUs: gpus, Model: "NVIDIA-A100-SXM4-80GB", Scheduler: sched, PodGroup: group}))
	return name
}

func bound(s *harness.Scope, names ...string) int {
	n := 0
	for _, name := range names {
		if p := s.GetOrNil(name); p != nil && p.Spec.NodeName != "" {
			n++
		}
	}
	return n
}

// A gang of 4 pods x 2 GPUs binds all four at once where they fit.
func TestGangBindsAllOrNothing(t *testing.T) {
	_, sched := gangScheduler(t)
	s := cluster.NewScope(t)
	s.AddNodes(fleet.Node{Name: "a", CPU: "64", Memory: "256Gi", GPUs: 4, Model: "NVIDIA-A100-SXM4-80GB", MemoryMiB: 81920},
		fleet.Node{Name: "b", CPU: "64", Memory: "256Gi", GPUs: 4, Model: "NVIDIA-A100-SXM4-80GB", MemoryMiB: 81920})
	gang(t, s, "train", 4)
	names := gangPods(s, sched, "train", 4, 2)
	s.WaitBound(time.Minute, names...)
	checkDevices(t)
}

// With room for three of its four pods, a gang binds none and holds no
// device: once it has been tried, every GPU of the node still takes a pod.
func TestGangThatCannotFitHoldsNothing(t *testing.T) {
	proc, sched := gangScheduler(t)
	s := cluster.NewScope(t)
	s.AddNodes(fleet.Node{Name: "a", CPU: "64", Memory: "256Gi", GPUs: 6, Model: "NVIDIA-A100-SXM4-80GB", MemoryMiB: 81920})
	gang(t, s, "train", 4)
	names := gangPods(s, sched, "train", 4, 2)
	msg := s.WaitUnschedulable(time.Minute, names[0])
	t.Logf("gang pod pending: %s", msg)
	time.Sleep(3 * time.Second)
	if n := bound(s, names...); n != 0 {
		t.Fatalf("%d of the gang's pods bound with room for 3", n)
	}
	// The three pods that fitted reserved devices in the group's cycle;
	// the scheduler holds none of them now (the gauge is set every second).
	if err := waitFor(s, 10*time.Second, func() bool {
		v, ok := proc.Metric(s.Ctx, "gpu_scheduler_reservations ")
		return ok && v == "0"
	}); err != nil {
		v, _ := proc.Metric(s.Ctx, "gpu_scheduler_reservations ")
		t.Errorf("gpu_scheduler_reservations = %q after the gang failed, want 0", v)
	}
	var single []string
	for i := 0; i < 6; i++ {
		single = append(single, fmt.Sprintf("one-%d", i))
		s.Create(s.Pod(harness.PodSpec{Name: single[i], GPUs: 1, Model: "NVIDIA-A100-SXM4-80GB", Scheduler: sched}))
	}
	s.WaitBound(time.Minute, single...)
	if n := bound(s, names...); n != 0 {
		t.Errorf("%d of the gang's pods bound", n)
	}
	checkDevices(t)
}

// Two gangs race for the same GPUs: one completes, the other binds nothing
// and completes once the first is gone. Nothing is double-booked.
func TestGangsRace(t *testing.T) {
	_, sched := gangScheduler(t)
	s := cluster.NewScope(t)
	s.AddNodes(fleet.Node{Name: "a", CPU: "64", Memory: "256Gi", GPUs: 4, Model: "NVIDIA-A100-SXM4-80GB", MemoryMiB: 81920},
		fleet.Node{Name: "b", CPU: "64", Memory: "256Gi", GPUs: 4, Model: "NVIDIA-A100-SXM4-80GB", MemoryMiB: 81920})
	gang(t, s, "x", 4)
	gang(t, s, "y", 4)
	var xs, ys []string
	for i := 0; i < 4; i++ {
		// Interleaved, so that both gangs are in the queue together.
		xs = append(xs, gangPod(s, sched, "x", i, 2))
		ys = append(ys, gangPod(s, sched, "y", i, 2))
	}
	var first, second []string
	err := waitFor(s, time.Minute, func() bool {
		switch {
		case bound(s, xs...) == 4:
			first, second = xs, ys
		case bound(s, ys...) == 4:
			first, second = ys, xs
		default:
			return false
		}
		return true
	})
	if err != nil {
		t.Fatalf("no gang completed: %d of x and %d of y bound", bound(s, xs...), bound(s, ys...))
	}
	time.Sleep(3 * time.Second)
	if n := bound(s, second...); n != 0 {
		t.Fatalf("the second gang has %d pods bound beside a complete first", n)
	}
	checkDevices(t)
	for _, n := range first {
		s.Delete(n)
	}
	s.WaitBound(time.Minute, second...)
	checkDevices(t)
}

func waitFor(s *harness.Scope, timeout time.Duration, cond func() bool) error {
	return wait.PollUntilContextTimeout(s.Ctx, 200*time.Millisecond, timeout, true, func(context.Context) (bool, error) { return cond(), nil })
}

// A high-priority gang of two whole-GPU pods on a node of three devices
// that hold low-priority shares: a alone on one, b and c on another, d
// alone on the third. Each pod of the gang evicts the one share of a
// device: a and d, two pods. Upstream's pod group preemption reprieves the
// oldest first (a), then must evict b, c and d: three pods, where two were
// enough. The gang binds on the devices its victims freed.
func TestGangPreemptionEvictsByDevice(t *testing.T) {
	_, sched := gangScheduler(t)
	s := cluster.NewScope(t)
	high := highPriority(t, s)
	s.AddNodes(fleet.Node{Name: "n", CPU: "16", Memory: "64Gi", GPUs: 3, Model: "Tesla-T4", MemoryMiB: 15360})
	spec := func(name string, milli int) harness.PodSpec {
		return harness.PodSpec{Name: name, Milli: milli, Scheduler: sched}
	}
	at := createInOrder(s, spec("a", 500), spec("b", 600), spec("c", 400), spec("d", 600))
	dev := func(n string) int { return at[n].Shares[0].Index }
	if dev("b") != dev("c") || dev("a") == dev("b") || dev("d") == dev("b") || dev("d") == dev("a") {
		t.Fatalf("setup: want a, d alone and b, c together, got %v", at)
	}
	pg := &schedulingv1beta1.PodGroup{
		ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: s.NS},
		Spec: schedulingv1beta1.PodGroupSpec{PriorityClassName: high, SchedulingPolicy: schedulingv1beta1.PodGroupSchedulingPolicy{
			Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: 2}}},
	}
	created, err := cluster.Client.SchedulingV1beta1().PodGroups(s.NS).Create(s.Ctx, pg, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if created.Spec.Priority == nil || *created.Spec.Priority != 1000 {
		t.Fatalf("the pod group's priority was not resolved from its class: %v", created.Spec.Priority)
	}
	var members []string
	for i := range 2 {
		name := fmt.Sprintf("train-%d", i)
		members = append(members, name)
		s.Create(s.Pod(harness.PodSpec{Name: name, GPUs: 1, Scheduler: sched, PodGroup: "train", PriorityClass: high}))
	}
	s.WaitBound(2*time.Minute, members...)
	var got []string
	for _, n := range []string{"a", "b", "c", "d"} {
		if s.GetOrNil(n) == nil {
			got = append(got, n)
		}
	}
	if !slices.Equal(got, []string{"a", "d"}) {
		t.Errorf("evicted %v, want [a d]: the one share of each of two devices (upstream's order evicts [b c d])", got)
	}
	var on []int
	for _, m := range members {
		a, err := gpu.ParseAssignment(s.Get(m).Annotations[gpu.AnnotationAssignment])
		if err != nil || len(a.Shares) != 1 {
			t.Fatalf("%s: %v %v", m, a, err)
		}
		on = append(on, a.Shares[0].Index)
	}
	slices.Sort(on)
	want := []int{dev("a"), dev("d")}
	slices.Sort(want)
	if !slices.Equal(on, want) {
		t.Errorf("gang on devices %v, want the devices its victims held %v", on, want)
	}
	checkDevices(t)
}

// A gang member that fails after the gang was placed (its Reserve, with a
// fault switch of the faultinject build: as when the devices changed between
// the group's placement and its commit) leaves the members reserved before
// it waiting at Permit for their quorum. Upstream's GangScheduling lets them
// wait 5 minutes, each holding its GPU; GPUFit rejects them at once, so
// the GPUs are free for other pods while the gang is tried again.
func TestGangMemberFailureReleasesWaitingMembers(t *testing.T) {
	if !cluster.Local() {
		t.Skip("needs the faultinject build as a local process")
	}
	needGangs(t)
	profile := "gpu-scheduler-gang-fault"
	proc, err := harness.StartProfile(context.Background(), cluster, filepath.Join(harness.BinDir(), "gpu-scheduler-faultinject"), profile,
		[]string{"GPU_SCHEDULER_FAULT_FAIL_RESERVE=-1"}, harness.AccountingOnlySharing, "--feature-gates=GenericWorkload=true")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(proc.Tail(60))
		}
		proc.Stop(5 * time.Second)
	})
	s := cluster.NewScope(t)
	s.AddNodes(fleet.Node{Name: "a", CPU: "64", Memory: "256Gi", GPUs: 2, Model: "NVIDIA-A100-SXM4-80GB", MemoryMiB: 81920})
	gang(t, s, "g", 2)
	// g-1's Reserve fails each time the gang is committed; g-0 would wait.
	names := gangPods(s, profile, "g", 2, 1)
	t.Logf("g-1 pending: %s", s.WaitUnschedulable(time.Minute, names[1]))
	// A pod that needs both GPUs binds: nothing holds one for g-0.
	start := time.Now()
	s.Create(s.Pod(harness.PodSpec{Name: "both", GPUs: 2, Model: "NVIDIA-A100-SXM4-80GB", Scheduler: profile}))
	if err := waitFor(s, time.Minute, func() bool { return bound(s, "both") == 1 }); err != nil {
		t.Fatalf("a pod of both GPUs did not bind in a minute: g-0 holds one while it waits at Permit (g-0: %v)", s.Get(names[0]).Status.Conditions)
	}
	t.Logf("a pod of both GPUs bound %v after it was created", time.Since(start).Round(time.Millisecond))
	if n := bound(s, names...); n != 0 {
		t.Errorf("%d of the gang's pods bound", n)
	}
	checkDevices(t)
}
