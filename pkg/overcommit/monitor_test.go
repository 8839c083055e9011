package overcommit

import (
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/agent/hami"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu/gputest"
)

type source struct {
	tracker *gpu.Tracker
	pods    cache.Store
}

func (s *source) Tracker() *gpu.Tracker                 { return s.tracker }
func (s *source) PodsOnNode(n string) ([]*v1.Pod, bool) { return gputest.PodsOn(s.pods, n), true }

// newMonitor is a monitor over informers that are not started: tests put
// objects in their stores and call check.
func newMonitor(t *testing.T, active func() bool) (*Monitor, cache.SharedIndexInformer, cache.SharedIndexInformer, *events.FakeRecorder) {
	t.Helper()
	f := informers.NewSharedInformerFactory(fake.NewClientset(), 0)
	pods, nodes := f.Core().V1().Pods().Informer(), f.Core().V1().Nodes().Informer()
	rec := events.NewFakeRecorder(10)
	m, err := New(&source{tracker: gpu.NewTracker(gpu.DefaultNodeOptions), pods: pods.GetIndexer()}, pods, nodes, rec,
		active, gpu.DefaultRequestOptions, time.Minute, HandshakeTimeout)
	if err != nil {
		t.Fatal(err)
	}
	m.grace = 0
	return m, pods, nodes, rec
}

func gpuNode(name string, gpus int64) *v1.Node {
	q := *resource.NewQuantity(gpus, resource.DecimalSI)
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: v1.NodeStatus{Allocatable: v1.ResourceList{gpu.ResourceNvidiaGPU: q}, Capacity: v1.ResourceList{gpu.ResourceNvidiaGPU: q}}}
}

func drain(r *events.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-r.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// Our shares sit on all four devices; the default scheduler binds a 4-GPU pod
// there. The monitor reports the node once (gauge, Event naming the pod, log),
// and reports it resolved once the pod leaves.
func TestMonitorReportsOvercommit(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	m, pods, nodes, rec := newMonitor(t, func() bool { return true })
	nodes.GetStore().Add(gpuNode("n1", 4))
	for i, a := range []string{"n1:0=300", "n1:1=300", "n1:2=300", "n1:3=300"} {
		pods.GetStore().Add(gputest.BoundPod("ns", "share-"+string(rune('a'+i)), "n1", a))
	}
	if err := m.check(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	if got := m.Overcommitted(); len(got) != 0 || len(drain(rec)) != 0 {
		t.Fatalf("shares alone are not an overcommit: %v", got)
	}
	other := gputest.BoundPod("ns", "training", "n1", "")
	other.Spec.Containers[0].Resources.Requests = v1.ResourceList{gpu.ResourceNvidiaGPU: resource.MustParse("4")}
	pods.GetStore().Add(other)
	for i := 0; i < 3; i++ { // judged again and again, reported once
		if err := m.check(ctx, "n1"); err != nil {
			t.Fatal(err)
		}
	}
	if got := m.Overcommitted(); len(got) != 1 || got[0] != "n1" {
		t.Fatalf("want n1 overcommitted, got %v", got)
	}
	evs := drain(rec)
	if len(evs) != 1 || !strings.Contains(evs[0], ReasonOvercommitted) || !strings.Contains(evs[0], "ns/training") {
		t.Errorf("want one %s event naming ns/training, got %q", ReasonOvercommitted, evs)
	}
	if v, err := testutil.GetGaugeMetricValue(overcommittedNodes); err != nil || v != 1 {
		t.Errorf("gauge: %v %v", v, err)
	}
	pods.GetStore().Delete(other)
	if err := m.check(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	evs = drain(rec)
	if len(m.Overcommitted()) != 0 || len(evs) != 1 || !strings.Contains(evs[0], ReasonResolved) {
		t.Errorf("want resolved once, got %v %q", m.Overcommitted(), evs)
	}
	if v, _ := testutil.GetGaugeMetricValue(overcommittedNodes); v != 0 {
		t.Errorf("gauge after: %v", v)
	}
}

// A standby keeps the gauge but leaves Events to the leader; once it leads,
// it reports what it already knows, the refused node included.
func TestMonitorStandby(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	leading := false
	m, pods, nodes, rec := newMonitor(t, func() bool { return leading })
	nodes.GetStore().Add(gpuNode("n1", 1))
	nodes.GetStore().Add(gpuNode("big", gpu.MaxDevices+8))
	for _, n := range []string{"a", "b"} {
		p := gputest.BoundPod("ns", n, "n1", "")
		p.Spec.Containers[0].Resources.Requests = v1.ResourceList{gpu.ResourceNvidiaGPU: resource.MustParse("1")}
		pods.GetStore().Add(p)
		// Another scheduler's pods on a node we do not track are not ours
		// to judge: refused, not overcommitted.
		q := p.DeepCopy()
		q.Name, q.UID, q.Spec.NodeName = "big-"+n, types.UID("big-"+n), "big"
		pods.GetStore().Add(q)
	}
	m.check(ctx, "n1")
	m.check(ctx, "big")
	if got := m.Overcommitted(); len(got) != 1 || got[0] != "n1" || len(drain(rec)) != 0 {
		t.Fatalf("standby: want n1 judged and nothing told, got %v", got)
	}
	leading = true
	for i := 0; i < 2; i++ {
		m.check(ctx, "n1")
		m.check(ctx, "big")
	}
	evs := drain(rec)
	if len(evs) != 2 || !strings.Contains(strings.Join(evs, "|"), ReasonOvercommitted) || !strings.Contains(strings.Join(evs, "|"), ReasonTooManyGPUs) {
		t.Errorf("new leader: want one %s and one %s event, got %q", ReasonOvercommitted, ReasonTooManyGPUs, evs)
	}
}

// A node that reports no devices for a moment (a device plugin restarting)
// is overcommitted at once for placement and the gauge, but reported only if
// it lasts.
func TestMonitorGrace(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	m, pods, nodes, rec := newMonitor(t, func() bool { return true })
	m.grace = 300 * time.Millisecond
	n := gpuNode("n1", 2)
	n.Status.Allocatable[gpu.ResourceNvidiaGPU] = resource.MustParse("0")
	nodes.GetStore().Add(n)
	pods.GetStore().Add(gputest.BoundPod("ns", "a", "n1", "n1:0=1000"))
	m.check(ctx, "n1")
	if len(m.Overcommitted()) != 1 || len(drain(rec)) != 0 {
		t.Fatalf("want judged at once, told only if it lasts")
	}
	time.Sleep(350 * time.Millisecond)
	m.check(ctx, "n1")
	if evs := drain(rec); len(evs) != 1 {
		t.Errorf("after the grace: want one event, got %q", evs)
	}
}

// An assignment that does not count (edited, forged on a CPU pod) is told
// once, on the pod.
func TestMonitorTellsIgnoredAssignments(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	m, pods, nodes, rec := newMonitor(t, func() bool { return true })
	nodes.GetStore().Add(gpuNode("n1", 2))
	edited := gputest.BoundPod("ns", "edited", "n1", "n1:0=500")
	edited.Annotations[gpu.AnnotationAssignment] = "n1:0=1"
	forged := gputest.BoundPod("ns", "forged", "n1", "")
	forged.Annotations[gpu.AnnotationAssignment] = "n1:1=1000"
	honest := gputest.BoundPod("ns", "honest", "n1", "n1:1=300")
	for _, p := range []*v1.Pod{edited, forged, honest} {
		pods.GetStore().Add(p)
	}
	m.check(ctx, "n1")
	m.check(ctx, "n1")
	evs := drain(rec)
	all := strings.Join(evs, "|")
	if len(evs) != 2 || !strings.Contains(all, `"n1:0=1" does not match`) || !strings.Contains(all, "requests no GPU") {
		t.Errorf("want one event for each of edited and forged, got %q", evs)
	}
}

// A handshake HAMi's device plugin failed, or never answered, is reported
// once per pod: an Event and the counter.
func TestMonitorHandshake(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	m, pods, nodes, rec := newMonitor(t, func() bool { return true })
	nodes.GetStore().Add(gpuNode("n1", 40))
	old := strconv.FormatInt(time.Now().Add(-HandshakeTimeout-time.Minute).Unix(), 10)
	fresh := strconv.FormatInt(time.Now().Unix(), 10)
	pod := func(name, phase, at string) *v1.Pod {
		p := gputest.BoundPod("ns", name, "n1", "")
		p.Annotations = map[string]string{hami.AnnotationVGPUNode: "n1", hami.AnnotationBindPhase: phase, hami.AnnotationBindTime: at}
		p.Status.Phase = v1.PodPending
		return p
	}
	// The counters are global: other tests (and -count) add to them.
	before := map[string]float64{}
	for _, reason := range []string{"failed", "expired"} {
		before[reason], _ = testutil.GetCounterMetricValue(handshakeFailures.WithLabelValues(reason))
	}
	failed := pod("refused", hami.BindFailed, fresh)
	failed.Status.Phase, failed.Status.Message = v1.PodFailed, "Allocate failed due to device number not matched"
	for _, p := range []*v1.Pod{pod("fine", hami.BindSuccess, old), pod("waiting", hami.BindAllocating, fresh), pod("stuck", hami.BindAllocating, old)} {
		pods.GetStore().Add(p)
	}
	m.onPod(nil, failed)
	// Rejected by the kubelet before the plugin saw it.
	rejected := pod("rejected", hami.BindAllocating, fresh)
	rejected.Status.Phase, rejected.Status.Reason = v1.PodFailed, "OutOfcpu"
	m.onPod(nil, rejected)
	for i := 0; i < 2; i++ {
		if err := m.check(ctx, "n1"); err != nil {
			t.Fatal(err)
		}
	}
	evs := drain(rec)
	all := strings.Join(evs, "\n")
	if len(evs) != 3 || !strings.Contains(all, "device number not matched") || !strings.Contains(all, "has not taken") || !strings.Contains(all, "OutOfcpu") {
		t.Errorf("want one Event each for the refused, the rejected and the stuck pod, got %q", evs)
	}
	for reason, want := range map[string]float64{"failed": 2, "expired": 1} {
		if v, err := testutil.GetCounterMetricValue(handshakeFailures.WithLabelValues(reason)); err != nil || v-before[reason] != want {
			t.Errorf("%s: %v more, want %v (%v)", reason, v-before[reason], want, err)
		}
	}
}

// TestMonitorIgnoresLabelChurn: GPU Feature Discovery rewrites a timestamp
// label on every node every minute; that is no reason to judge a node
// again. What the inventory is read from is.
func TestMonitorIgnoresLabelChurn(t *testing.T) {
	m, _, _, _ := newMonitor(t, nil)
	base := gpuNode("n", 4)
	base.Labels = map[string]string{gpu.LabelGPUProduct: "A100", "nvidia.com/gfd.timestamp": "1"}
	for _, tc := range []struct {
		name string
		edit func(*v1.Node)
		want bool
	}{
		{"the GFD timestamp", func(n *v1.Node) { n.Labels["nvidia.com/gfd.timestamp"] = "2" }, false},
		{"another label", func(n *v1.Node) { n.Labels["team"] = "a" }, false},
		{"a heartbeat", func(n *v1.Node) {
			n.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}}
		}, false},
		{"the product", func(n *v1.Node) { n.Labels[gpu.LabelGPUProduct] = "H100" }, true},
		{"the memory", func(n *v1.Node) { n.Labels[gpu.LabelGPUMemory] = "81920" }, true},
		{"fewer GPUs", func(n *v1.Node) { n.Status.Allocatable[gpu.ResourceNvidiaGPU] = resource.MustParse("3") }, true},
		{"HAMi's registration", func(n *v1.Node) { n.Annotations = map[string]string{hami.AnnotationRegister: "[]"} }, true},
		{"HAMi's cordon", func(n *v1.Node) { n.Annotations = map[string]string{hami.AnnotationCordon: "x"} }, true},
	} {
		n := base.DeepCopy()
		tc.edit(n)
		m.onNodeUpdate(base, n)
		if got := m.queue.Len() == 1; got != tc.want {
			t.Errorf("%s: judged again: %v, want %v", tc.name, got, tc.want)
		}
		for m.queue.Len() > 0 {
			k, _ := m.queue.Get()
			m.queue.Done(k)
		}
	}
}

// A node's HAMi lock whose holder ended before the device plugin served it
// (the kubelet rejected the pod while the plugin was down) is released by
// the leader when it judges the node; a live holder's lock is left alone,
// and a standby releases nothing.
func TestMonitorReleasesEndedLocks(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	for _, tc := range []struct {
		name      string
		phase     v1.PodPhase
		gone      bool
		active    bool
		abandoned bool // unbound, ours, and nobody binds it: its bind died
		release   bool
		bindPhase string // allocating unless set
	}{
		{"failed holder", v1.PodFailed, false, true, false, true, ""},
		{"holder gone", "", true, true, false, true, ""},
		{"holder still binding", v1.PodPending, false, true, false, false, ""},
		{"holder running", v1.PodRunning, false, true, false, false, ""},
		{"standby", v1.PodFailed, false, false, false, false, ""},
		{"abandoned bind", v1.PodPending, false, true, true, true, ""},
		{"abandoned a moment ago", v1.PodPending, false, true, true, false, ""},
		// The plugin served it and lost the write of its release.
		{"holder served and running", v1.PodRunning, false, true, false, true, hami.BindSuccess},
		// Success on a pod the kubelet has not started: its owner may have
		// written it; the lock stays until the pod runs or ends.
		{"success on a pending holder", v1.PodPending, false, true, false, false, hami.BindSuccess},
		// Refused: the kubelet fails the pod, which releases it then.
		{"holder refused, not failed yet", v1.PodPending, false, true, false, false, hami.BindFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, pods, nodes, _ := newMonitor(t, func() bool { return tc.active })
			age := 2 * time.Minute
			if strings.Contains(tc.name, "moment") {
				age = 10 * time.Second // a Binding sent then could still land
			}
			lock := hami.NodeLockValue(time.Now().Add(-age), "ns", "holder")
			n := gpuNode("n1", 40)
			n.Annotations = map[string]string{hami.AnnotationNodeLock: lock}
			client := fake.NewClientset(n)
			m.ReleaseStaleLocks(client, func(*v1.Pod) bool { return tc.abandoned }, time.Minute)
			nodes.GetStore().Add(n)
			if !tc.gone {
				p := gputest.BoundPod("ns", "holder", "n1", "")
				if tc.abandoned {
					p.Spec.NodeName = ""
				}
				phase := hami.BindAllocating
				if tc.bindPhase != "" {
					phase = tc.bindPhase
				}
				p.Annotations = map[string]string{hami.AnnotationVGPUNode: "n1", hami.AnnotationBindPhase: phase,
					hami.AnnotationBindTime: strconv.FormatInt(time.Now().Unix(), 10)}
				p.Status.Phase = tc.phase
				pods.GetStore().Add(p)
				if _, err := client.CoreV1().Pods("ns").Create(ctx, p, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			if err := m.check(ctx, "n1"); err != nil {
				t.Fatal(err)
			}
			got, _ := client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
			if _, held := got.Annotations[hami.AnnotationNodeLock]; held == tc.release {
				t.Errorf("lock held %v, want released %v", held, tc.release)
			}
		})
	}
}

// A pod's update judges its node again only when what it holds may have
// changed: not when a GPU pod starts (Pending to Running: every GPU pod's
// node would be judged twice), but when it ends, moves or changes its
// assignment, and when a pod in HAMi's handshake starts (its start is what
// lets a lock it left behind be released).
func TestMonitorPodUpdates(t *testing.T) {
	m, _, _, _ := newMonitor(t, nil)
	base := gputest.BoundPod("ns", "p", "n", "n:0=1000")
	base.Status.Phase = v1.PodPending
	handshake := base.DeepCopy()
	handshake.Annotations[hami.AnnotationVGPUNode] = "n"
	handshake.Annotations[hami.AnnotationBindPhase] = hami.BindSuccess
	for _, tc := range []struct {
		name string
		old  *v1.Pod
		edit func(*v1.Pod)
		want bool
	}{
		{"a GPU pod starts", base, func(p *v1.Pod) { p.Status.Phase = v1.PodRunning }, false},
		{"a condition", base, func(p *v1.Pod) { p.Status.Conditions = []v1.PodCondition{{Type: v1.PodReady}} }, false},
		{"a GPU pod succeeds", base, func(p *v1.Pod) { p.Status.Phase = v1.PodSucceeded }, true},
		{"a GPU pod fails", base, func(p *v1.Pod) { p.Status.Phase = v1.PodFailed }, true},
		{"its assignment", base, func(p *v1.Pod) { p.Annotations[gpu.AnnotationAssignment] = "n:1=1000" }, true},
		{"a pod in HAMi's handshake starts", handshake, func(p *v1.Pod) { p.Status.Phase = v1.PodRunning }, true},
	} {
		p := tc.old.DeepCopy()
		tc.edit(p)
		m.onPod(tc.old, p)
		if got := m.queue.Len() == 1; got != tc.want {
			t.Errorf("%s: judged again: %v, want %v", tc.name, got, tc.want)
		}
		for m.queue.Len() > 0 {
			k, _ := m.queue.Get()
			m.queue.Done(k)
		}
	}
}
