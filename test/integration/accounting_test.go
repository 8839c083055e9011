package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-scheduler/gpu-scheduler/manifests"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/fleet"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/test/harness"
)

const bindTimeout = 30 * time.Second

func checkDevices(t *testing.T, s *harness.Scope, allowed ...string) harness.DeviceUse {
	t.Helper()
	use, err := harness.CheckDevices(s.Ctx, cluster.Client, allowed...)
	if err != nil {
		t.Fatal(err)
	}
	return use
}

func setAnnotation(t *testing.T, s *harness.Scope, pod, key string, value *string) {
	t.Helper()
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{key: value}}})
	if _, err := cluster.Client.CoreV1().Pods(s.NS).Patch(s.Ctx, pod, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// stillPending checks that a pod stays unbound for a while.
func stillPending(t *testing.T, s *harness.Scope, name string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if p := s.Get(name); p.Spec.NodeName != "" {
			t.Fatalf("%s was bound to %s", name, p.Spec.NodeName)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Without the admission policy, anyone who may edit a pod can write an
// assignment. The accounting still counts requests: a CPU pod's forged claim
// blocks nothing, and a share that rewrites or drops its assignment still
// holds its share.
func TestForgedAssignmentsWithoutPolicy(t *testing.T) {
	sched := startScheduler(t)
	defer sched.Stop()
	s := cluster.NewScope(t)
	s.AddNodes(fleet.Node{Name: "g", CPU: "32", Memory: "128Gi", GPUs: 2, Model: "Tesla-T4", MemoryMiB: 15360},
		fleet.Node{Name: "h", CPU: "32", Memory: "128Gi", GPUs: 1, Model: "Tesla-T4", MemoryMiB: 15360})
	g, h := s.Node("g"), s.Node("h")

	forger := s.Pod(harness.PodSpec{Name: "forger", Scheduler: "-", Annotations: map[string]string{gpu.AnnotationAssignment: g + ":0=1000,1=1000"}})
	forger.Spec.NodeName = g
	s.Create(forger)
	w := s.Pod(harness.PodSpec{Name: "w2", GPUs: 2})
	w.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": g}
	s.Create(w)
	if p := s.WaitBound(bindTimeout, "w2")["w2"]; p.Spec.NodeName != g {
		t.Fatalf("w2 on %s", p.Spec.NodeName)
	}

	s.Create(s.Pod(harness.PodSpec{Name: "share", Milli: 500, NodeSelector: map[string]string{"kubernetes.io/hostname": h}}))
	s.WaitBound(bindTimeout, "share")
	for _, forged := range []*string{ptr(h + ":0=1"), nil, ptr(g + ":0=500")} {
		setAnnotation(t, s, "share", gpu.AnnotationAssignment, forged)
		name := fmt.Sprintf("t-%d", time.Now().UnixNano()%100000)
		s.Create(s.Pod(harness.PodSpec{Name: name, Milli: 600, NodeSelector: map[string]string{"kubernetes.io/hostname": h}}))
		s.WaitUnschedulable(bindTimeout, name)
		stillPending(t, s, name, 2*time.Second)
		s.Delete(name)
	}
	// Free for real: the share goes, and a 600 fits.
	s.Delete("share")
	s.Create(s.Pod(harness.PodSpec{Name: "after", Milli: 600, NodeSelector: map[string]string{"kubernetes.io/hostname": h}}))
	s.WaitBound(bindTimeout, "after")
	checkDevices(t, s)
}

func ptr(s string) *string { return &s }

func setAllocatable(t *testing.T, s *harness.Scope, node string, gpus int64) {
	t.Helper()
	n, err := cluster.Client.CoreV1().Nodes().Get(s.Ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Status.Allocatable[gpu.ResourceNvidiaGPU] = *resource.NewQuantity(gpus, resource.DecimalSI)
	if _, err := cluster.Client.CoreV1().Nodes().UpdateStatus(s.Ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// A device goes unhealthy under running pods: allocatable shrinks. A pod
// whose assignment names a device index the node no longer has still holds a
// device. With one pod left on the higher index, the one remaining device is
// taken; with two, the node is overcommitted and says so.
func TestAllocatableShrinks(t *testing.T) {
	sched := startScheduler(t)
	defer sched.Stop()
	s := cluster.NewScope(t)
	s.AddNodes(fleet.Node{Name: "g", CPU: "32", Memory: "128Gi", GPUs: 2, Model: "Tesla-T4", MemoryMiB: 15360})
	g := s.Node("g")
	s.Create(s.Pod(harness.PodSpec{Name: "x", GPUs: 1}))
	s.WaitBound(bindTimeout, "x")
	s.Create(s.Pod(harness.PodSpec{Name: "a", GPUs: 1}))
	a := s.WaitBound(bindTimeout, "a")["a"]
	if !strings.HasSuffix(a.Annotations[gpu.AnnotationAssignment], ":1=1000") {
		t.Fatalf("want a on device 1, got %q", a.Annotations[gpu.AnnotationAssignment])
	}

	// Both pods on one healthy device: overcommitted.
	setAllocatable(t, s, g, 1)
	s.Create(s.Pod(harness.PodSpec{Name: "over", Milli: 100}))
	s.WaitReason(bindTimeout, "over", "overcommitted")
	checkDevices(t, s, g)
	if _, err := harness.CheckDevices(s.Ctx, cluster.Client); err == nil {
		t.Errorf("the invariant check must see the overcommit")
	}
	s.Delete("over")

	// One pod left, on the index that went away: it holds the last device.
	s.Delete("x")
	s.Create(s.Pod(harness.PodSpec{Name: "c", GPUs: 1}))
	s.WaitUnschedulable(bindTimeout, "c")
	stillPending(t, s, "c", 2*time.Second)
	// The device comes back: c fits.
	setAllocatable(t, s, g, 2)
	s.WaitBound(bindTimeout, "c")
	checkDevices(t, s)
}

// Two profiles of one scheduler place shares on the same node at once: one
// accounting, so no device holds more than 1000 milli.
func TestTwoProfilesOneNode(t *testing.T) {
	const second = "gpu-scheduler-b"
	sched, err := harness.StartInProcessWith(context.Background(), cluster.Config, manifests.SchedulerConfig,
		harness.InProcessOptions{FitArgs: harness.AccountingOnly, ExtraProfiles: []string{second}})
	if err != nil {
		t.Fatal(err)
	}
	defer sched.Stop()
	s := cluster.NewScope(t)
	s.AddNodes(fleet.Node{Name: "g", CPU: "64", Memory: "256Gi", GPUs: 2, Model: "Tesla-T4", MemoryMiB: 15360})
	for round := 0; round < 3; round++ {
		var names []string
		var pods []*v1.Pod
		for i := 0; i < 6; i++ {
			spec := harness.PodSpec{Name: fmt.Sprintf("r%d-%d", round, i), Milli: 600}
			if i%2 == 1 {
				spec.Scheduler = second
			}
			names = append(names, spec.Name)
			pods = append(pods, s.Pod(spec))
		}
		s.Create(pods...)
		bound := settleIntegration(t, s, names)
		use := checkDevices(t, s)
		if bound != 2 {
			t.Errorf("round %d: want 2 shares of 600 on 2 devices, got %d bound (%v)", round, bound, use[s.Node("g")])
		}
		for _, n := range names {
			s.Delete(n)
		}
		for deadline := time.Now().Add(bindTimeout); ; time.Sleep(100 * time.Millisecond) {
			list, err := cluster.Client.CoreV1().Pods(s.NS).List(s.Ctx, metav1.ListOptions{})
			if err == nil && len(list.Items) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("pods not gone")
			}
		}
	}
}

func settleIntegration(t *testing.T, s *harness.Scope, names []string) int {
	t.Helper()
	deadline := time.Now().Add(bindTimeout)
	for {
		bound, settled := 0, 0
		for _, n := range names {
			p := s.Get(n)
			if p.Spec.NodeName != "" {
				bound++
			}
			if p.Spec.NodeName != "" || harness.Unschedulable(p) != "" {
				settled++
			}
		}
		if settled == len(names) {
			return bound
		}
		if time.Now().After(deadline) {
			t.Fatalf("not settled: %d of %d", settled, len(names))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// lostBind is a transport that loses the answer to the first binding: the
// client gets an error after 500 ms, and the request reaches the API server
// 3 s later, as a request stuck in a slow network or server would.
type lostBind struct {
	next http.RoundTripper
	done atomic.Bool
	late chan struct{}
}

func (l *lostBind) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodPost || !strings.HasSuffix(req.URL.Path, "/binding") || !l.done.CompareAndSwap(false, true) {
		return l.next.RoundTrip(req)
	}
	body, _ := io.ReadAll(req.Body)
	go func() {
		defer close(l.late)
		time.Sleep(3 * time.Second)
		r := req.Clone(context.Background())
		r.Body = io.NopCloser(bytes.NewReader(body))
		if resp, err := l.next.RoundTrip(r); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	time.Sleep(500 * time.Millisecond)
	return nil, fmt.Errorf("injected: the answer to the binding was lost (%w)", context.DeadlineExceeded)
}

// A bind that fails on the client but lands on the server must not free the
// device in between: a pod waiting for it would be bound on top.
func TestBindResponseLost(t *testing.T) {
	lost := &lostBind{late: make(chan struct{})}
	sched, err := harness.StartInProcessWith(context.Background(), cluster.Config, manifests.SchedulerConfig,
		harness.InProcessOptions{FitArgs: harness.AccountingOnly, WrapTransport: func(rt http.RoundTripper) http.RoundTripper { lost.next = rt; return lost }})
	if err != nil {
		t.Fatal(err)
	}
	defer sched.Stop()
	s := cluster.NewScope(t)
	s.AddNodes(fleet.Node{Name: "one", CPU: "16", Memory: "64Gi", GPUs: 1, Model: "Tesla-T4", MemoryMiB: 15360},
		fleet.Node{Name: "two", CPU: "16", Memory: "64Gi", GPUs: 1, Model: "Tesla-T4", MemoryMiB: 15360})
	s.Create(s.Pod(harness.PodSpec{Name: "a", GPUs: 1}))
	time.Sleep(100 * time.Millisecond)
	s.Create(s.Pod(harness.PodSpec{Name: "b", GPUs: 1}), s.Pod(harness.PodSpec{Name: "c", GPUs: 1}))
	<-lost.late
	bound := s.WaitBound(bindTimeout, "a")
	t.Logf("a bound to %s", bound["a"].Spec.NodeName)
	// a holds one device, one of b and c the other; the third waits.
	deadline := time.Now().Add(bindTimeout)
	for countBoundIn(s, "b", "c") != 1 && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(3 * time.Second)
	if n := countBoundIn(s, "b", "c"); n != 1 {
		t.Errorf("two GPUs, three 1-GPU pods: %d of b and c bound, want 1", n)
	}
	checkDevices(t, s)
}

func countBoundIn(s *harness.Scope, names ...string) int {
	n := 0
	for _, name := range names {
		if s.Get(name).Spec.NodeName != "" {
			n++
		}
	}
	return n
}
