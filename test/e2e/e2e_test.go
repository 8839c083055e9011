package e2e

import (
	"context"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/fleet"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/test/harness"
)

const bindTimeout = 30 * time.Second

func checkDevices(t *testing.T) harness.DeviceUse {
	t.Helper()
	use, err := harness.CheckDevices(context.Background(), cluster.Client)
	if err != nil {
		t.Fatal(err)
	}
	return use
}

// The reference scenario: five nodes, one pod; it lands on node-4, and a
// variant that fits nowhere explains each node.
func TestReferenceScenario(t *testing.T) {
	s := cluster.NewScope(t)
	gpuTaint := v1.Taint{Key: "gpu", Value: "true", Effect: v1.TaintEffectNoSchedule}
	gpuNode := func(name, cpu string) fleet.Node {
		return fleet.Node{Name: name, CPU: cpu, Memory: "64Gi", GPUs: 4, Model: "NVIDIA-A100-SXM4-80GB", MemoryMiB: 81920,
			Labels: map[string]string{"accelerator": "gpu"}, Taints: []v1.Taint{gpuTaint}}
	}
	n5 := gpuNode("node-5", "16")
	n5.NotReady = true
	s.AddNodes(gpuNode("node-1", "2"), fleet.Node{Name: "node-2", CPU: "16", Memory: "64Gi"},
		gpuNode("node-3", "16"), gpuNode("node-4", "16"), n5)
	// Memory requested: 70% on node-3, 30% on node-4 (bound directly).
	for name, node := range map[string]string{"mem70": "node-3", "mem30": "node-4"} {
		p := s.Pod(harness.PodSpec{Name: name, Scheduler: "-", Memory: map[string]string{"mem70": "44.8Gi", "mem30": "19.2Gi"}[name]})
		p.Spec.NodeName = s.Node(node)
		s.Create(p)
	}
	tol := []v1.Toleration{{Key: "gpu", Operator: v1.TolerationOpEqual, Value: "true", Effect: v1.TaintEffectNoSchedule}}
	ref := func(name string, gpus int) *v1.Pod {
		return s.Pod(harness.PodSpec{Name: name, CPU: "4", Memory: "16Gi", GPUs: gpus,
			NodeSelector: map[string]string{"accelerator": "gpu"}, Tolerations: tol})
	}
	// One at a time: each variant meets the same cluster. The GPU variant
	// goes first: once its kind is in the learned workload, node-3 (16Gi
	// would leave 3.2Gi, too little for it) loses for the CPU-only pod too,
	// whatever the order of the randomly prefixed node names.
	for _, v := range []struct {
		name string
		gpus int
	}{{"ref-gpu", 1}, {"ref", 0}} {
		s.Create(ref(v.name, v.gpus))
		p := s.WaitBound(bindTimeout, v.name)[v.name]
		if p.Spec.NodeName != s.Node("node-4") {
			t.Errorf("%s: want node-4, got %s", v.name, p.Spec.NodeName)
		}
		if a, ok := p.Annotations[gpu.AnnotationAssignment]; ok != (v.gpus > 0) || (ok && !strings.HasPrefix(a, s.Node("node-4")+":")) {
			t.Errorf("%s: assignment %q", v.name, a)
		}
		s.Delete(v.name)
	}

	s.Create(ref("ref-impossible", 8))
	msg := s.WaitEvent(bindTimeout, "ref-impossible", "FailedScheduling", "Insufficient cpu")
	// Counts cover every node of the cluster; ours are the ones named here.
	for _, want := range []string{"Insufficient cpu", "node(s) didn't match Pod's node affinity/selector",
		"node(s) had untolerated taint(s)", "Insufficient nvidia.com/gpu"} {
		if !strings.Contains(msg, want) {
			t.Errorf("FailedScheduling %q lacks %q", msg, want)
		}
	}
	checkDevices(t)
}

// The vanilla kube-scheduler and ours share the cluster: each places only
// its own pods.
func TestCoexistence(t *testing.T) {
	s := cluster.NewScope(t)
	s.AddNodes(fleet.Node{Name: "g0", CPU: "32", Memory: "128Gi", GPUs: 4, Model: "Tesla-T4", MemoryMiB: 15360},
		fleet.Node{Name: "c0", CPU: "32", Memory: "128Gi"})
	var ours, theirs []string
	for i := 0; i < 4; i++ {
		n := fmt.Sprintf("ours-%d", i)
		s.Create(s.Pod(harness.PodSpec{Name: n, Milli: 300}))
		ours = append(ours, n)
		n = fmt.Sprintf("default-%d", i)
		s.Create(s.Pod(harness.PodSpec{Name: n, Scheduler: "-", CPU: "500m"}))
		theirs = append(theirs, n)
	}
	bound := s.WaitBound(bindTimeout, append(ours, theirs...)...)
	for _, n := range ours {
		if _, ok := bound[n].Annotations[gpu.AnnotationAssignment]; !ok {
			t.Errorf("%s has no assignment: not placed by gpu-scheduler", n)
		}
		if c := scheduledBy(t, s, n); c != gpu.SchedulerName {
			t.Errorf("%s was scheduled by %q", n, c)
		}
	}
	for _, n := range theirs {
		if _, ok := bound[n].Annotations[gpu.AnnotationAssignment]; ok {
			t.Errorf("%s (default scheduler) got a GPU assignment", n)
		}
		if c := scheduledBy(t, s, n); c != v1.DefaultSchedulerName {
			t.Errorf("%s was scheduled by %q", n, c)
		}
	}
}

// scheduledBy is the reporting controller of the pod's Scheduled event.
func scheduledBy(t *testing.T, s *harness.Scope, pod string) string {
	t.Helper()
	var who string
	wait.PollUntilContextTimeout(s.Ctx, 200*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := cluster.Client.CoreV1().Events(s.NS).List(ctx, metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.name": pod, "reason": "Scheduled"}.String()})
		if err != nil || len(list.Items) == 0 {
			return false, nil
		}
		e := list.Items[0]
		who = e.ReportingController
		if who == "" {
			who = e.Source.Component
		}
		return true, nil
	})
	return who
}

// Whole and shared GPUs fill two nodes' devices to 85%: every assignment
// fits its device, none is booked twice. The whole GPUs go first: where the shares go among free devices depends
// on the learned target, that is on every pod the scheduler has seen (after
// a run of 600m shares, spreading 300m ones keeps devices that fit 600m,
// as FGD means it to), so the test does not rest on it.
func TestPacking(t *testing.T) {
	s := cluster.NewScope(t)
	s.AddNodes(fleet.Node{Name: "a", CPU: "64", Memory: "256Gi", GPUs: 4, Model: "NVIDIA-L4", MemoryMiB: 23034},
		fleet.Node{Name: "b", CPU: "64", Memory: "256Gi", GPUs: 4, Model: "NVIDIA-L4", MemoryMiB: 23034})
	// 3 x 1 GPU + 1 x 2 GPUs + 6 x 300m = 6.8 of 8 GPUs.
	var names []string
	for i := 0; i < 3; i++ {
		names = append(names, fmt.Sprintf("whole-%d", i))
		s.Create(s.Pod(harness.PodSpec{Name: names[len(names)-1], GPUs: 1}))
	}
	names = append(names, "pair")
	s.Create(s.Pod(harness.PodSpec{Name: "pair", GPUs: 2}))
	s.WaitBound(bindTimeout, names...)
	for i := 0; i < 6; i++ {
		names = append(names, fmt.Sprintf("share-%d", i))
		s.Create(s.Pod(harness.PodSpec{Name: names[len(names)-1], Milli: 300}))
	}
	s.WaitBound(bindTimeout, names...)
	use := checkDevices(t)
	var total int32
	for _, n := range s.NodeNames() {
		for _, m := range use[n] {
			total += m
		}
	}
	if total != 6800 {
		t.Errorf("booked %d milli, want 6800: %v", total, use)
	}
	// No share landed on a whole GPU's device.
	for _, name := range names[:4] {
		a, err := gpu.ParseAssignment(s.Get(name).Annotations[gpu.AnnotationAssignment])
		if err != nil || len(a.Shares) == 0 {
			t.Fatalf("%s: %v %v", name, a, err)
		}
		for _, sh := range a.Shares {
			if use[a.Node][sh.Index] != gpu.MilliPerGPU || sh.Milli != gpu.MilliPerGPU {
				t.Errorf("%s's device %d on %s is shared: %v", name, sh.Index, a.Node, use[a.Node])
			}
		}
	}
}

// A pending GPU pod binds once a pod on the full node is deleted.
func TestBindAfterDelete(t *testing.T) {
	s := cluster.NewScope(t)
	s.AddNodes(fleet.Node{Name: "one", CPU: "16", Memory: "64Gi", GPUs: 1, Model: "Tesla-T4", MemoryMiB: 15360})
	s.Create(s.Pod(harness.PodSpec{Name: "first", GPUs: 1}))
	s.WaitBound(bindTimeout, "first")
	s.Create(s.Pod(harness.PodSpec{Name: "second", GPUs: 1}))
	msg := s.WaitUnschedulable(bindTimeout, "second")
	if !strings.Contains(msg, "nvidia.com/gpu") && !strings.Contains(msg, "free GPUs") {
		t.Errorf("reason %q does not mention the GPU", msg)
	}
	start := time.Now()
	s.Delete("first")
	s.WaitBound(bindTimeout, "second")
	t.Logf("bound %v after the delete", time.Since(start).Round(time.Millisecond))
	checkDevices(t)
}

// Every invalid annotation gives a FailedScheduling event that names it; the
// scheduler keeps running and other pods still schedule.
func TestBadInput(t *testing.T) {
	s := cluster.NewScope(t)
	s.AddNodes(fleet.Node{Name: "g", CPU: "32", Memory: "128Gi", GPUs: 2, Model: "Tesla-T4", MemoryMiB: 15360})
	cases := []struct {
		name string
		spec harness.PodSpec
		want string
	}{
		{"milli-text", harness.PodSpec{Annotations: map[string]string{gpu.AnnotationMilli: "half"}}, `gpu-scheduler.io/gpu-milli="half": must be an integer from 1 to 999`},
		{"milli-range", harness.PodSpec{Annotations: map[string]string{gpu.AnnotationMilli: "1000"}}, `gpu-scheduler.io/gpu-milli="1000": must be an integer from 1 to 999`},
		{"fraction", harness.PodSpec{Annotations: map[string]string{gpu.AnnotationKAIFraction: "2"}}, `gpu-fraction="2": must be a decimal fraction greater than 0 and less than 1`},
		{"memory", harness.PodSpec{Annotations: map[string]string{gpu.AnnotationMemory: "lots"}}, `gpu-scheduler.io/gpu-memory="lots": must be a positive amount`},
		{"two-shares", harness.PodSpec{Annotations: map[string]string{gpu.AnnotationMilli: "100", gpu.AnnotationKAIFraction: "0.1"}}, `conflicts with gpu-scheduler.io/gpu-milli`},
		{"share-and-whole", harness.PodSpec{GPUs: 2, Milli: 500}, `a shared GPU takes one slot of the device plugin: request nvidia.com/gpu: 1 (delivered by a device plugin that enforces shares) or none (accounting only), not 2`},
		{"num-devices", harness.PodSpec{Annotations: map[string]string{gpu.AnnotationKAIFraction: "0.5", gpu.AnnotationKAIFractionNumDevices: "2"}}, `a fraction of more than one device is not supported`},
		{"model-empty", harness.PodSpec{GPUs: 1, Model: "|"}, `gpu-scheduler.io/gpu-model="|": must list at least one GPU model`},
		{"model-no-gpu", harness.PodSpec{Model: "Tesla-T4"}, `a GPU model constraint needs a GPU request`},
		{"two-models", harness.PodSpec{GPUs: 1, Model: "Tesla-T4", Annotations: map[string]string{gpu.AnnotationHAMiUseType: "t4"}}, `conflicts with nvidia.com/use-gputype`},
	}
	for _, c := range cases {
		c.spec.Name = c.name
		s.Create(s.Pod(c.spec))
	}
	s.Create(s.Pod(harness.PodSpec{Name: "valid", Milli: 500}))
	for _, c := range cases {
		msg := s.WaitEvent(bindTimeout, c.name, "FailedScheduling", c.want)
		if !strings.Contains(msg, "invalid annotation") && c.name != "share-and-whole" {
			t.Errorf("%s: %q", c.name, msg)
		}
	}
	s.WaitBound(bindTimeout, "valid")
	if active, _ := scheds.Active(s.Ctx); active != 1 {
		t.Errorf("want one active scheduler, got %d", active)
	}
}

// Kill the scheduler in the middle of a burst of 200 GPU pods and start it
// again: every pod ends bound or explained, and no device is double-booked.
func TestRestartSafety(t *testing.T) {
	s := cluster.NewScope(t)
	var nodes []fleet.Node
	for i := 0; i < 10; i++ {
		nodes = append(nodes, fleet.Node{Name: fmt.Sprintf("n%d", i), CPU: "96", Memory: "512Gi", GPUs: 8, Model: "NVIDIA-A100-SXM4-80GB", MemoryMiB: 81920})
	}
	s.AddNodes(nodes...)
	rng := rand.New(rand.NewSource(1))
	var names []string
	var pods []*v1.Pod
	for i := 0; i < 200; i++ {
		spec := harness.PodSpec{Name: fmt.Sprintf("p%03d", i)}
		if i%10 < 7 {
			spec.Milli = 250 + 50*rng.Intn(6)
		} else {
			spec.GPUs = 1 + rng.Intn(2)
		}
		names = append(names, spec.Name)
		pods = append(pods, s.Pod(spec))
	}
	burstAndKill(t, s, pods, names, 10*time.Millisecond, 40)
	use := checkDevices(t)
	bound := countBound(s.Ctx, s)
	var booked int32
	for _, n := range s.NodeNames() {
		for _, m := range use[n] {
			booked += m
		}
	}
	t.Logf("after restart: %d of 200 bound, %d explained; %d milli booked of 80000", bound, 200-bound, booked)
	if bound == 200 || bound < 100 {
		t.Errorf("the fleet holds some but not all pods: %d bound", bound)
	}
}

func countBound(ctx context.Context, s *harness.Scope) int {
	list, err := cluster.Client.CoreV1().Pods(s.NS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0
	}
	n := 0
	for _, p := range list.Items {
		if p.Spec.NodeName != "" {
			n++
		}
	}
	return n
}

// burstAndKill creates the pods one every interval, kills the leader once
// at least killAt are bound, and waits until every pod is bound or
// explained.
func burstAndKill(t *testing.T, s *harness.Scope, pods []*v1.Pod, names []string, interval time.Duration, killAt int) {
	t.Helper()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for _, p := range pods {
			s.Create(p)
			time.Sleep(interval)
		}
	}()
	// Wait until the burst is under way and some pods are bound.
	wait.PollUntilContextTimeout(s.Ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		return countBound(ctx, s) >= killAt, nil
	})
	before := countBound(s.Ctx, s)
	if err := scheds.KillLeader(s.Ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("killed the leader with %d pods bound", before)
	wg.Wait()
	settle(t, s, names, 3*time.Minute)
}

// settle waits until every pod is bound or carries an unschedulable reason.
func settle(t *testing.T, s *harness.Scope, names []string, timeout time.Duration) {
	t.Helper()
	var open []string
	err := wait.PollUntilContextTimeout(s.Ctx, 500*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		list, err := cluster.Client.CoreV1().Pods(s.NS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		state := map[string]bool{}
		for i := range list.Items {
			p := &list.Items[i]
			state[p.Name] = p.Spec.NodeName != "" || harness.Unschedulable(p) != ""
		}
		open = nil
		for _, n := range names {
			if !state[n] {
				open = append(open, n)
			}
		}
		return len(open) == 0, nil
	})
	if err != nil {
		// What the API server has of each: whether it exists, its
		// conditions and nomination, for the scheduler's log.
		for _, n := range open {
			p, err := cluster.Client.CoreV1().Pods(s.NS).Get(context.Background(), n, metav1.GetOptions{})
			if err != nil {
				t.Logf("%s: %v", n, err)
				continue
			}
			t.Logf("%s: uid %s, created %s, rv %s, scheduler %s, nominated %q, conditions %v", n, p.UID, p.CreationTimestamp.Format(time.RFC3339Nano),
				p.ResourceVersion, p.Spec.SchedulerName, p.Status.NominatedNodeName, p.Status.Conditions)
		}
		t.Fatalf("pods neither bound nor explained: %v", open)
	}
}

// Two instances, one active; when it dies, the other takes over and pods
// keep getting scheduled.
func TestLeaderElection(t *testing.T) {
	s := cluster.NewScope(t)
	s.AddNodes(fleet.Node{Name: "g", CPU: "32", Memory: "128Gi", GPUs: 4, Model: "Tesla-T4", MemoryMiB: 15360})
	if err := scheds.AddStandby(s.Ctx); err != nil {
		t.Fatal(err)
	}
	expectOneActive(t, s, 2)
	before, _ := scheds.Leader(s.Ctx)
	if err := scheds.KillLeader(s.Ctx); err != nil {
		t.Fatal(err)
	}
	s.Create(s.Pod(harness.PodSpec{Name: "after-failover", GPUs: 1}))
	s.WaitBound(time.Minute, "after-failover")
	after, _ := scheds.Leader(s.Ctx)
	if after == before {
		t.Errorf("leadership did not move: %s", after)
	}
	expectOneActive(t, s, 2)
	t.Logf("leader %s -> %s", before, after)
}

func expectOneActive(t *testing.T, s *harness.Scope, total int) {
	t.Helper()
	var active, n int
	err := wait.PollUntilContextTimeout(s.Ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		active, n = scheds.Active(ctx)
		return active == 1 && n >= total, nil
	})
	if err != nil {
		t.Fatalf("want exactly one active of %d instances, got %d active of %d\n%s", total, active, n, scheds.Logs())
	}
	// And it stays so: no second leader appears.
	for i := 0; i < 5; i++ {
		time.Sleep(300 * time.Millisecond)
		if a, _ := scheds.Active(s.Ctx); a != 1 {
			t.Fatalf("%d active instances", a)
		}
	}
}
