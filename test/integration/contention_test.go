package integration

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpu-scheduler/gpu-scheduler/manifests"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/agent/hami"
	ourconfig "github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/fleet"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/test/harness"
)

// A HAMi node whose name is longer than a label value may be: HAMi's
// scheduler cannot label pods for it, so there are none to read by label,
// and a label selector with its name is refused by the API server. Binds
// there go through, with the device plugin's handshake.
func TestHAMiLongNodeName(t *testing.T) {
	sched, err := harness.StartInProcess(context.Background(), cluster.Config, manifests.SchedulerConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer sched.Stop()
	s := cluster.NewScope(t)
	name := "a-gpu-node-whose-name-is-longer-than-any-label-value-may-be"
	s.AddNodes(fleet.Node{Name: name, CPU: "64", Memory: "256Gi", GPUs: 2, Model: "NVIDIA-L4", MemoryMiB: 23034, HAMiSplit: 4})
	if n := s.Node(name); len(n) <= 63 {
		t.Fatalf("node name %q is not over 63 characters", n)
	}
	slot := map[v1.ResourceName]string{gpu.ResourceNvidiaGPU: "1"}
	s.Create(harness.WithLimits(s.Pod(harness.PodSpec{Name: "half", Milli: 500}), slot), s.Pod(harness.PodSpec{Name: "whole", GPUs: 1}))
	bound := s.WaitBound(30*time.Second, "half", "whole")
	for _, n := range []string{"half", "whole"} {
		env := waitEnv(t, s, n)
		rec, err := hami.DecodePodDevices(bound[n].Annotations[hami.AnnotationAllocated])
		if err != nil || len(rec) == 0 || len(rec[0]) != 1 || env["NVIDIA_VISIBLE_DEVICES"] != rec[0][0].UUID {
			t.Errorf("%s: got %v, record %q (%v)", n, env, bound[n].Annotations[hami.AnnotationAllocated], err)
		}
	}
}

// contender plays HAMi's scheduler on one node, as HAMi v2.10 does it
// (hami-protocol.md §3, §5): Filter reads every pod's record for the node,
// chooses the first device with room, and writes its record and label on
// the pod without the lock; Bind takes the lock (another holder only once
// it is gone or expired), writes the bind phase and binds, and never
// checks its choice again. It remembers which pods each choice saw.
type contender struct {
	t      *testing.T
	s      *harness.Scope
	node   string
	devs   []hami.Device
	mu     sync.Mutex
	chosen map[string]contenderChoice // pod name ->
}

type contenderChoice struct {
	uuid string
	// rv is the resourceVersion of the write of its record: when the
	// choice became visible to others.
	rv uint64
}

func (c *contender) place(name string, mem, cores int32) {
	client := c.s.C.Client
	p := c.s.Pod(harness.PodSpec{Name: name, Scheduler: "hami-scheduler", CPU: "10m", Memory: "16Mi"})
	harness.WithLimits(p, map[v1.ResourceName]string{gpu.ResourceNvidiaGPU: "1", hami.ResourceMemory: strconv.Itoa(int(mem)), hami.ResourceCores: strconv.Itoa(int(cores))})
	p, err := client.CoreV1().Pods(c.s.NS).Create(c.s.Ctx, p, metav1.CreateOptions{})
	if err != nil {
		c.t.Errorf("contender: %v", err)
		return
	}
	// Filter: usage from every pod's record, whoever placed it.
	list, err := client.CoreV1().Pods("").List(c.s.Ctx, metav1.ListOptions{})
	if err != nil {
		c.t.Errorf("contender: %v", err)
		return
	}
	used := map[string]hami.Usage{}
	for i := range list.Items {
		q := &list.Items[i]
		if q.Annotations[hami.AnnotationVGPUNode] != c.node || q.Status.Phase == v1.PodSucceeded || q.Status.Phase == v1.PodFailed {
			continue
		}
		rec, err := hami.DecodePodDevices(q.Annotations[hami.AnnotationAllocated])
		if err != nil {
			continue
		}
		for id, u := range hami.PodUsage(q, rec) {
			t := used[id]
			t.Mem, t.Cores, t.Slots = t.Mem+u.Mem, t.Cores+u.Cores, t.Slots+u.Slots
			used[id] = t
		}
	}
	uuid := ""
	for _, d := range c.devs {
		u := used[d.ID]
		if u.Slots < d.Count && u.Mem+int64(mem) <= int64(d.Devmem) && u.Cores+int64(cores) <= 100 {
			uuid = d.ID
			break
		}
	}
	if uuid == "" {
		_ = client.CoreV1().Pods(c.s.NS).Delete(c.s.Ctx, name, metav1.DeleteOptions{})
		return
	}
	entry := fmt.Sprintf("%s,NVIDIA,%d,%d:;", uuid, mem, cores)
	now := strconv.FormatInt(time.Now().Unix(), 10)
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q},"annotations":{%q:%q,%q:%q,%q:%q,%q:%q}}}`, hami.AnnotationVGPUNode, c.node,
		hami.AnnotationVGPUNode, c.node, hami.AnnotationVGPUTime, now, hami.AnnotationToAllocate, entry, hami.AnnotationAllocated, entry)
	written, err := client.CoreV1().Pods(c.s.NS).Patch(c.s.Ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	if err != nil {
		c.t.Errorf("contender: %v", err)
		return
	}
	c.mu.Lock()
	c.chosen[name] = contenderChoice{uuid: uuid, rv: rv(written.ResourceVersion)}
	c.mu.Unlock()
	// Bind: HAMi releases another holder's lock only when its pod is not
	// found, or once it expired.
	gone := func(ctx context.Context, ns, n string, _ time.Time) (bool, error) {
		_, err := client.CoreV1().Pods(ns).Get(ctx, n, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}
	var lock string
	err = wait.PollUntilContextTimeout(c.s.Ctx, 20*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		v, err := hami.LockNode(ctx, client, c.node, c.s.NS, name, time.Now(), hami.NodeLockTimeout, gone, nil)
		lock = v
		return err == nil, nil
	})
	if err != nil {
		c.t.Errorf("contender: no lock for %s: %v", name, err)
		return
	}
	patch = fmt.Sprintf(`{"metadata":{"annotations":{%q:%q,%q:%q}}}`, hami.AnnotationBindPhase, hami.BindAllocating, hami.AnnotationBindTime, now)
	if _, err := client.CoreV1().Pods(c.s.NS).Patch(c.s.Ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		c.t.Errorf("contender: %v", err)
	}
	b := &v1.Binding{ObjectMeta: metav1.ObjectMeta{Namespace: c.s.NS, Name: name}, Target: v1.ObjectReference{Kind: "Node", Name: c.node}}
	if err := client.CoreV1().Pods(c.s.NS).Bind(c.s.Ctx, b, metav1.CreateOptions{}); err != nil {
		c.t.Errorf("contender: binding %s: %v", name, err)
		_ = hami.ReleaseNodeLock(c.s.Ctx, client, c.node, lock)
	}
}

// rv reads a resourceVersion: an etcd revision, ordered across objects.
func rv(s string) uint64 {
	v, _ := strconv.ParseUint(s, 10, 64)
	return v
}

// gpu-scheduler and a HAMi-scheduler-like contender bind on one HAMi node
// at once, more than it holds. The node's lock keeps every bind to itself:
// each container gets the devices recorded for its own pod, no bind waits
// for ever and no lock is left. And each of our binds fits what was known
// when it took the lock: the device's pods are replayed in the order their
// choices became visible (ours when it took the lock, after which it
// checks; the contender's when it wrote its record), and one of ours that
// does not fit those before it is an overcommit of ours. A contender's that
// does not fit is HAMi's own hazard (it chose without seeing our pod, and
// never checks again), reported, not failed.
func TestHAMiContention(t *testing.T) {
	sched, err := harness.StartInProcess(context.Background(), cluster.Config, manifests.SchedulerConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer sched.Stop()
	s := cluster.NewScope(t)
	s.AddNodes(fleet.Node{Name: "shared", CPU: "64", Memory: "256Gi", GPUs: 2, Model: "NVIDIA-L4", MemoryMiB: 23034, HAMiSplit: 8})
	node := s.Node("shared")
	n, err := s.C.Client.CoreV1().Nodes().Get(s.Ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	devs, err := hami.ParseRegister(n.Annotations[hami.AnnotationRegister])
	if err != nil {
		t.Fatal(err)
	}
	sort.Slice(devs, func(i, j int) bool { return devs[i].Index < devs[j].Index })
	c := &contender{t: t, s: s, node: node, devs: devs, chosen: map[string]contenderChoice{}}
	// The lock's history: when each of our pods took it.
	w, err := s.C.Client.CoreV1().Nodes().Watch(s.Ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + node, ResourceVersion: n.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var lockMu sync.Mutex
	lockedAt := map[string]uint64{} // our pod -> the last revision its lock was taken at
	go func() {
		last := ""
		for ev := range w.ResultChan() {
			nd, ok := ev.Object.(*v1.Node)
			if !ok {
				continue
			}
			v := nd.Annotations[hami.AnnotationNodeLock]
			if v != "" && v != last {
				if _, ns, name, err := hami.ParseNodeLock(v); err == nil && ns == s.NS {
					lockMu.Lock()
					lockedAt[name] = rv(nd.ResourceVersion)
					lockMu.Unlock()
				}
			}
			last = v
		}
	}()
	const rounds = 10
	var ours []string
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < rounds; i++ {
			// Every pod a size of its own: a container served another
			// pod's devices shows in its limits.
			c.place(fmt.Sprintf("hami-%d", i), 3000+int32(100*i), 10+int32(i))
		}
	}()
	for i := 0; i < rounds; i++ {
		name := fmt.Sprintf("ours-%d", i)
		s.Create(harness.WithLimits(s.Pod(harness.PodSpec{Name: name, Milli: 200 + 10*i, CPU: "10m", Memory: "16Mi"}), map[v1.ResourceName]string{gpu.ResourceNvidiaGPU: "1"}))
		ours = append(ours, name)
		time.Sleep(30 * time.Millisecond)
	}
	wg.Wait()
	settleInt(t, s, ours, 2*time.Minute)

	// Every bound pod is served, with its own record.
	list, err := s.C.Client.CoreV1().Pods(s.NS).List(s.Ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	type holder struct {
		pod  *v1.Pod
		ours bool
		mem  int32
	}
	onDevice := map[string][]holder{}
	bound := map[bool]int{}
	for i := range list.Items {
		p := &list.Items[i]
		if p.Spec.NodeName == "" {
			continue
		}
		env := waitEnv(t, s, p.Name)
		rec, err := hami.DecodePodDevices(p.Annotations[hami.AnnotationAllocated])
		if err != nil || len(rec) == 0 || len(rec[0]) != 1 {
			t.Fatalf("%s: record %q: %v", p.Name, p.Annotations[hami.AnnotationAllocated], err)
		}
		d := rec[0][0]
		if env["NVIDIA_VISIBLE_DEVICES"] != d.UUID || env["CUDA_DEVICE_MEMORY_LIMIT_0"] != fmt.Sprintf("%dm", d.Usedmem) ||
			env["CUDA_DEVICE_SM_LIMIT"] != strconv.Itoa(int(d.Usedcores)) {
			t.Errorf("%s was served %v; its record is %s with %d MiB: another bind's devices", p.Name, env, d.UUID, d.Usedmem)
		}
		ours := p.Spec.SchedulerName == gpu.SchedulerName
		bound[ours]++
		onDevice[d.UUID] = append(onDevice[d.UUID], holder{pod: p, ours: ours, mem: d.Usedmem})
	}
	err = wait.PollUntilContextTimeout(s.Ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := s.C.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		_, held := n.Annotations[hami.AnnotationNodeLock]
		return err == nil && !held, nil
	})
	if err != nil {
		t.Errorf("the node's lock is still held")
	}
	hazards := 0
	lockMu.Lock()
	defer lockMu.Unlock()
	for _, d := range devs {
		hs := onDevice[d.ID]
		at := func(h holder) uint64 {
			if h.ours {
				return lockedAt[h.pod.Name]
			}
			return c.chosen[h.pod.Name].rv
		}
		sort.Slice(hs, func(i, j int) bool { return at(hs[i]) < at(hs[j]) })
		var mem int32
		for i, h := range hs {
			if h.ours && at(h) == 0 {
				t.Errorf("%s: no lock of its bind was seen", h.pod.Name)
			}
			mem += h.mem
			if mem <= d.Devmem && int32(i+1) <= d.Count {
				continue
			}
			if h.ours {
				t.Errorf("device %s: %s took it at revision %d, past what it holds (%d of %d MiB, %d containers): overcommitted by gpu-scheduler",
					d.ID, h.pod.Name, at(h), mem, d.Devmem, i+1)
			} else {
				hazards++
				t.Logf("device %s: the contender's %s overcommitted it (HAMi's own hazard: chosen without seeing a pod of ours)", d.ID, h.pod.Name)
			}
		}
	}
	t.Logf("bound: %d of ours, %d of the contender's (%d chosen); %d device(s) overcommitted by HAMi's hazard", bound[true], bound[false], len(c.chosen), hazards)
	if bound[true] == 0 || bound[false] == 0 {
		t.Errorf("no contention: %d of ours and %d of the contender's bound", bound[true], bound[false])
	}
}

// settleInt waits until each of the pods is bound or explained.
func settleInt(t *testing.T, s *harness.Scope, names []string, timeout time.Duration) {
	t.Helper()
	var open []string
	err := wait.PollUntilContextTimeout(s.Ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		open = nil
		for _, n := range names {
			p := s.GetOrNil(n)
			if p == nil || (p.Spec.NodeName == "" && harness.Unschedulable(p) == "") {
				open = append(open, n)
			}
		}
		return len(open) == 0, nil
	})
	if err != nil {
		t.Fatalf("pods neither bound nor explained: %v", open)
	}
}

// A lock held by a pod of ours that nobody binds (the scheduler that took
// it died between the lock and the binding, its standby took over): once a
// Binding sent then could no longer land, the next bind takes it over,
// instead of waiting out HAMi's 5-minute expiry; a fresher one waits.
func TestHAMiAbandonedLock(t *testing.T) {
	sched, err := harness.StartInProcessWith(context.Background(), cluster.Config, manifests.SchedulerConfig, harness.InProcessOptions{
		FitArgs: func(a *ourconfig.GPUFitArgs) { a.HAMi.LockWaitSeconds = 5 }})
	if err != nil {
		t.Fatal(err)
	}
	defer sched.Stop()
	s := cluster.NewScope(t)
	s.AddNodes(fleet.Node{Name: "hami", CPU: "64", Memory: "256Gi", GPUs: 2, Model: "NVIDIA-L4", MemoryMiB: 23034, HAMiSplit: 4})
	node := s.Node("hami")
	// Ours, pending for good (a model no node has): the dead scheduler's
	// bind of it is what took the lock.
	s.Create(s.Pod(harness.PodSpec{Name: "orphan", GPUs: 1, Model: "NVIDIA-H200"}))
	slot := map[v1.ResourceName]string{gpu.ResourceNvidiaGPU: "1"}
	for _, tc := range []struct {
		name  string
		age   time.Duration
		binds bool
	}{{"fresh", 10 * time.Second, false}, {"abandoned", 2 * time.Minute, true}} {
		lock := hami.NodeLockValue(time.Now().Add(-tc.age), s.NS, "orphan")
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, hami.AnnotationNodeLock, lock)
		if _, err := s.C.Client.CoreV1().Nodes().Patch(s.Ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		name := "after-" + tc.name
		s.Create(harness.WithLimits(s.Pod(harness.PodSpec{Name: name, Milli: 500}), slot))
		if tc.binds {
			s.WaitBound(30*time.Second, name)
			waitEnv(t, s, name)
			continue
		}
		s.WaitReason(30*time.Second, name, "lock")
		if p := s.Get(name); p.Spec.NodeName != "" {
			t.Fatalf("%s bound while a bind sent %v ago could still land", name, tc.age)
		}
		s.Delete(name)
	}
}
