package e2e

import (
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/fleet"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/test/harness"
)

// highPriority creates a PriorityClass for the test's preemptors.
func highPriority(t *testing.T, s *harness.Scope) string {
	t.Helper()
	return priorityClass(t, s, "high", 1000)
}

func priorityClass(t *testing.T, s *harness.Scope, name string, value int32) string {
	t.Helper()
	pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: s.ID + "-" + name}, Value: value}
	if _, err := cluster.Client.SchedulingV1().PriorityClasses().Create(s.Ctx, pc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Client.SchedulingV1().PriorityClasses().Delete(s.Ctx, pc.Name, metav1.DeleteOptions{})
	})
	return pc.Name
}

// createInOrder creates pods one by one, each bound before the next, a
// second apart: the scheduler's own reprieve order is by start time.
func createInOrder(s *harness.Scope, specs ...harness.PodSpec) map[string]gpu.Assignment {
	s.T.Helper()
	out := map[string]gpu.Assignment{}
	for i, spec := range specs {
		if i > 0 {
			time.Sleep(1100 * time.Millisecond)
		}
		s.Create(s.Pod(spec))
		p := s.WaitBound(bindTimeout, spec.Name)[spec.Name]
		a, err := gpu.ParseAssignment(p.Annotations[gpu.AnnotationAssignment])
		if err != nil {
			s.T.Fatalf("%s: %v", spec.Name, err)
		}
		out[spec.Name] = a
	}
	return out
}

// evicted waits until the preemptor is bound and returns which of the pods
// were evicted.
func evicted(s *harness.Scope, preemptor string, pods ...string) []string {
	s.T.Helper()
	s.WaitBound(time.Minute, preemptor)
	var out []string
	for _, n := range pods {
		if s.GetOrNil(n) == nil {
			out = append(out, n)
		}
	}
	return out
}

// A high-priority whole-GPU pod on a node whose devices hold low-priority
// shares evicts the shares of one device: the cheapest to clear. Upstream's
// DefaultPreemption reprieves the oldest first and here evicts both shares
// of device B where the one share of device A was enough.
func TestPreemptionWholeGPUEvictsOneDevice(t *testing.T) {
	s := cluster.NewScope(t)
	high := highPriority(t, s)
	s.AddNodes(fleet.Node{Name: "n", CPU: "16", Memory: "64Gi", GPUs: 2, Model: "Tesla-T4", MemoryMiB: 15360})
	// a alone on one device (500 left), b and c on the other (full).
	at := createInOrder(s, harness.PodSpec{Name: "a", Milli: 500}, harness.PodSpec{Name: "b", Milli: 600}, harness.PodSpec{Name: "c", Milli: 400})
	if at["b"].Shares[0].Index != at["c"].Shares[0].Index || at["a"].Shares[0].Index == at["b"].Shares[0].Index {
		t.Fatalf("setup: want b and c on one device and a on the other, got %v", at)
	}
	s.Create(s.Pod(harness.PodSpec{Name: "p", GPUs: 1, PriorityClass: high}))
	got := evicted(s, "p", "a", "b", "c")
	if !slices.Equal(got, []string{"a"}) {
		t.Errorf("evicted %v, want [a]: the one share of its device", got)
	}
	p, _ := gpu.ParseAssignment(s.Get("p").Annotations[gpu.AnnotationAssignment])
	if len(p.Shares) != 1 || p.Shares[0].Index != at["a"].Shares[0].Index {
		t.Errorf("preemptor on %v, want the device a held (%d)", p, at["a"].Shares[0].Index)
	}
	checkDevices(t)
}

// A high-priority share evicts one pod, the smallest that frees enough, and
// preempts nothing where a device has room.
func TestPreemptionShareEvictsTheSmallest(t *testing.T) {
	s := cluster.NewScope(t)
	high := highPriority(t, s)
	s.AddNodes(fleet.Node{Name: "n", CPU: "16", Memory: "64Gi", GPUs: 2, Model: "Tesla-T4", MemoryMiB: 15360})
	// big and small on one device (100 left), c on the other (200 left).
	at := createInOrder(s, harness.PodSpec{Name: "big", Milli: 600}, harness.PodSpec{Name: "small", Milli: 300}, harness.PodSpec{Name: "c", Milli: 800})
	if at["big"].Shares[0].Index != at["small"].Shares[0].Index {
		t.Fatalf("setup: want big and small on one device, got %v", at)
	}
	s.Create(s.Pod(harness.PodSpec{Name: "p", Milli: 300, PriorityClass: high}))
	got := evicted(s, "p", "big", "small", "c")
	if !slices.Equal(got, []string{"small"}) {
		t.Errorf("evicted %v, want [small]: one pod, the smallest that frees 300", got)
	}
	checkDevices(t)

	// A second node with room: the next high-priority share goes there and
	// nothing is evicted.
	s.AddNodes(fleet.Node{Name: "m", CPU: "16", Memory: "64Gi", GPUs: 1, Model: "Tesla-T4", MemoryMiB: 15360})
	// Once the scheduler knows the new node (a pod only it can take binds
	// there): otherwise q rightly preempts on the only node it sees.
	probe := s.Pod(harness.PodSpec{Name: "probe"})
	probe.Spec.Affinity = &v1.Affinity{NodeAffinity: &v1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{
		NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchFields: []v1.NodeSelectorRequirement{{Key: "metadata.name", Operator: v1.NodeSelectorOpIn, Values: []string{s.Node("m")}}}}}}}}
	s.Create(probe)
	s.WaitBound(time.Minute, "probe")
	s.Delete("probe")
	s.Create(s.Pod(harness.PodSpec{Name: "q", Milli: 300, PriorityClass: high}))
	if got := evicted(s, "q", "big", "c", "p"); len(got) != 0 {
		t.Errorf("evicted %v with a free device on another node", got)
	}
	checkDevices(t)
}

// A PodDisruptionBudget that allows no disruption moves the preemption to
// another node.
func TestPreemptionKeepsBudgets(t *testing.T) {
	s := cluster.NewScope(t)
	high := highPriority(t, s)
	s.AddNodes(fleet.Node{Name: "n1", CPU: "16", Memory: "64Gi", GPUs: 1, Model: "Tesla-T4", MemoryMiB: 15360},
		fleet.Node{Name: "n2", CPU: "16", Memory: "64Gi", GPUs: 1, Model: "Tesla-T4", MemoryMiB: 15360})
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "guard", Namespace: s.NS},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: ptrIntOrString(1),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "guarded"}}},
	}
	if _, err := cluster.Client.PolicyV1().PodDisruptionBudgets(s.NS).Create(s.Ctx, pdb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// One share on each node (they do not fit one device); the guarded one
	// is the cheaper victim (600 against 700).
	at := createInOrder(s, harness.PodSpec{Name: "guarded", Milli: 600, Labels: map[string]string{"app": "guarded"}},
		harness.PodSpec{Name: "free", Milli: 700})
	if at["guarded"].Node == at["free"].Node {
		t.Fatalf("setup: both on %s", at["free"].Node)
	}
	s.Create(s.Pod(harness.PodSpec{Name: "p", GPUs: 1, PriorityClass: high}))
	if got := evicted(s, "p", "guarded", "free"); !slices.Equal(got, []string{"free"}) {
		t.Errorf("evicted %v, want [free]: the budget guards the other", got)
	}
	checkDevices(t)
}

func ptrIntOrString(i int) *intstr.IntOrString {
	v := intstr.FromInt(i)
	return &v
}

// While a preemptor's victim is still terminating (a finalizer holds it),
// the preemptor holds the device its victim frees, and nothing more: a
// lower-priority share still binds on the other device, and a
// lower-priority whole GPU does not take the preemptor's device once it is
// free. Counted greedily, the nominated preemptor found no free device and
// made the node "overcommitted", so the share waited too.
func TestPreemptorHoldsItsDevicesWhileVictimsTerminate(t *testing.T) {
	s := cluster.NewScope(t)
	high := priorityClass(t, s, "high", 1000)
	mid := priorityClass(t, s, "mid", 500)
	top := priorityClass(t, s, "top", 2000)
	s.AddNodes(fleet.Node{Name: "n", CPU: "16", Memory: "64Gi", GPUs: 2, Model: "Tesla-T4", MemoryMiB: 15360})
	const finalizer = "gpu-scheduler.io/e2e-hold"
	// v: a low-priority whole GPU that terminates slowly; w: a share the
	// preemptor may not evict.
	at := createInOrder(s, harness.PodSpec{Name: "v", GPUs: 1, Finalizers: []string{finalizer}},
		harness.PodSpec{Name: "w", Milli: 600, PriorityClass: top})
	release := func() {
		_, _ = s.C.Client.CoreV1().Pods(s.NS).Patch(s.Ctx, "v", types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	}
	t.Cleanup(release)
	s.Create(s.Pod(harness.PodSpec{Name: "p", GPUs: 1, PriorityClass: high}))
	if err := waitFor(s, time.Minute, func() bool {
		v := s.GetOrNil("v")
		return v != nil && v.DeletionTimestamp != nil && s.Get("p").Status.NominatedNodeName != ""
	}); err != nil {
		t.Fatalf("v not preempted, or p not nominated: %v", err)
	}
	// A share of lower priority than p: the other device has room.
	s.Create(s.Pod(harness.PodSpec{Name: "q", Milli: 300, PriorityClass: mid}))
	q := s.WaitBound(bindTimeout, "q")["q"]
	qa, _ := gpu.ParseAssignment(q.Annotations[gpu.AnnotationAssignment])
	if len(qa.Shares) != 1 || qa.Shares[0].Index != at["w"].Shares[0].Index {
		t.Errorf("q on %v, want w's device %d", qa, at["w"].Shares[0].Index)
	}
	// A whole GPU of lower priority than p waits: the only device that
	// will be free is p's.
	s.Create(s.Pod(harness.PodSpec{Name: "r", GPUs: 1, PriorityClass: mid}))
	release()
	p := s.WaitBound(time.Minute, "p")["p"]
	pa, _ := gpu.ParseAssignment(p.Annotations[gpu.AnnotationAssignment])
	if len(pa.Shares) != 1 || pa.Shares[0].Index != at["v"].Shares[0].Index {
		t.Errorf("p on %v, want v's device %d", pa, at["v"].Shares[0].Index)
	}
	if r := s.Get("r"); r.Spec.NodeName != "" {
		t.Errorf("r bound to %s: it took the preemptor's device", r.Spec.NodeName)
	}
	checkDevices(t)
}
