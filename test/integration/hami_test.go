package integration

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpu-scheduler/gpu-scheduler/manifests"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/agent/hami"
	ourconfig "github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/fakehami"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/fleet"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/test/harness"
)

// hamiUUIDs reads the devices a node registered.
func hamiUUIDs(t *testing.T, s *harness.Scope, node string) []string {
	n, err := s.C.Client.CoreV1().Nodes().Get(s.Ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ds, err := hami.ParseRegister(n.Annotations[hami.AnnotationRegister])
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range ds {
		out = append(out, d.ID)
	}
	return out
}

// waitEnv waits until the fake device plugin has admitted the pod, and
// returns the environment its container got.
func waitEnv(t *testing.T, s *harness.Scope, name string) map[string]string {
	t.Helper()
	var env map[string]string
	err := wait.PollUntilContextTimeout(s.Ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		p := s.Get(name)
		if p.Status.Phase == v1.PodFailed {
			return false, fmt.Errorf("pod %s failed admission: %s", name, p.Status.Message)
		}
		v, ok := p.Annotations[fakehami.EnvPrefix+"main"]
		if ok {
			env = fakehami.Env(v)
		}
		return ok, nil
	})
	if err != nil {
		t.Fatalf("%s: no device environment: %v", name, err)
	}
	return env
}

// A fleet with a HAMi node and a plain node. Shares land only on the HAMi
// node, each container gets exactly the device and limits chosen, the pod
// HAMi's own scheduler placed is counted, and no device gets more memory,
// cores or containers than it has.
func TestHAMiDelivery(t *testing.T) {
	sched, err := harness.StartInProcess(context.Background(), cluster.Config, manifests.SchedulerConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer sched.Stop()
	s := cluster.NewScope(t)
	s.AddNodes(
		fleet.Node{Name: "hami", CPU: "64", Memory: "256Gi", GPUs: 3, Model: "NVIDIA-A100-SXM4-80GB", MemoryMiB: 81920, HAMiSplit: 4},
		fleet.Node{Name: "plain", CPU: "64", Memory: "256Gi", GPUs: 2, Model: "NVIDIA-A100-SXM4-80GB", MemoryMiB: 81920},
	)
	hamiNode, plainNode := s.Node("hami"), s.Node("plain")
	uuids := hamiUUIDs(t, s, hamiNode)

	// HAMi's scheduler placed a whole GPU on device 0 (its webhook makes
	// it 100% of the cores): written as HAMi's scheduler writes it.
	foreign := harness.WithLimits(s.Pod(harness.PodSpec{Name: "by-hami", Scheduler: "hami-scheduler", GPUs: 1}), map[v1.ResourceName]string{hami.ResourceCores: "100"})
	foreign.Spec.NodeName = hamiNode
	list := uuids[0] + ",NVIDIA,81920,100:;"
	now := strconv.FormatInt(time.Now().Unix(), 10)
	foreign.Annotations = map[string]string{hami.AnnotationVGPUNode: hamiNode, hami.AnnotationVGPUTime: now,
		hami.AnnotationToAllocate: list, hami.AnnotationAllocated: list, hami.AnnotationBindPhase: hami.BindAllocating, hami.AnnotationBindTime: now}
	s.Create(foreign)
	if env := waitEnv(t, s, "by-hami"); env["NVIDIA_VISIBLE_DEVICES"] != uuids[0] {
		t.Fatalf("HAMi's pod got %v", env)
	}

	slot := map[v1.ResourceName]string{gpu.ResourceNvidiaGPU: "1"}
	s.Create(
		// A share by annotation alone: no device plugin is asked for it.
		s.Pod(harness.PodSpec{Name: "undelivered", Milli: 500}),
		harness.WithLimits(s.Pod(harness.PodSpec{Name: "half-a", Milli: 500}), slot),
		harness.WithLimits(s.Pod(harness.PodSpec{Name: "half-b", Milli: 500}), slot),
		harness.WithLimits(s.Pod(harness.PodSpec{Name: "hami-share"}), map[v1.ResourceName]string{gpu.ResourceNvidiaGPU: "1", hami.ResourceMemory: "30000", hami.ResourceCores: "30"}),
		harness.WithLimits(s.Pod(harness.PodSpec{Name: "by-memory", Annotations: map[string]string{gpu.AnnotationMemory: "50000"}}), slot),
		s.Pod(harness.PodSpec{Name: "whole", GPUs: 2}),
	)
	bound := s.WaitBound(60*time.Second, "half-a", "half-b", "hami-share", "by-memory", "whole")
	for _, n := range []string{"half-a", "half-b", "hami-share", "by-memory"} {
		if bound[n].Spec.NodeName != hamiNode {
			t.Errorf("%s: a share on %s, which does not deliver shares", n, bound[n].Spec.NodeName)
		}
	}
	if bound["whole"].Spec.NodeName != plainNode {
		t.Errorf("whole: on %s; the HAMi node has no 2 idle GPUs left", bound["whole"].Spec.NodeName)
	}
	if msg := s.WaitUnschedulable(30*time.Second, "undelivered"); !strings.Contains(msg, gpufitNoDelivery) {
		t.Errorf("undelivered: %q", msg)
	}

	// What each container got is what was chosen for it.
	want := map[string]struct{ mem, cores string }{
		"half-a": {"40960m", "50"}, "half-b": {"40960m", "50"}, "hami-share": {"30000m", "30"}, "by-memory": {"50000m", "0"},
	}
	type use struct{ mem, cores, slots int }
	used := map[string]*use{uuids[0]: {81920, 100, 1}}
	for name, w := range want {
		env := waitEnv(t, s, name)
		p := s.Get(name)
		pd, err := hami.DecodePodDevices(p.Annotations[hami.AnnotationAllocated])
		if err != nil || len(pd) == 0 || len(pd[0]) != 1 {
			t.Fatalf("%s: allocated %q: %v", name, p.Annotations[hami.AnnotationAllocated], err)
		}
		if env["NVIDIA_VISIBLE_DEVICES"] != pd[0][0].UUID || env["CUDA_DEVICE_MEMORY_LIMIT_0"] != w.mem || env["CUDA_DEVICE_SM_LIMIT"] != w.cores {
			t.Errorf("%s: got %v, want device %s with %s and %s%% of the SMs", name, env, pd[0][0].UUID, w.mem, w.cores)
		}
		if p.Annotations[hami.AnnotationBindPhase] != hami.BindSuccess {
			t.Errorf("%s: bind phase %q", name, p.Annotations[hami.AnnotationBindPhase])
		}
		id := env["NVIDIA_VISIBLE_DEVICES"]
		if used[id] == nil {
			used[id] = &use{}
		}
		mem, _ := strconv.Atoi(strings.TrimSuffix(w.mem, "m"))
		cores, _ := strconv.Atoi(w.cores)
		used[id].mem += mem
		used[id].cores += cores
		used[id].slots++
	}
	for id, u := range used {
		if u.mem > 81920 || u.cores > 100 || u.slots > 4 {
			t.Errorf("device %s holds %d MiB, %d%% of the cores, %d containers", id, u.mem, u.cores, u.slots)
		}
	}
	if used[uuids[0]].slots != 1 {
		t.Errorf("a share was put on the GPU HAMi's scheduler gave a pod whole: %+v", used[uuids[0]])
	}
	n, err := s.C.Client.CoreV1().Nodes().Get(s.Ctx, hamiNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := n.Annotations[hami.AnnotationNodeLock]; ok {
		t.Errorf("the node lock is still held: %s", v)
	}

	// The HAMi node's memory is taken: device 1 holds two halves, device 2
	// 80000 MiB. Another half fits nowhere, and says why.
	s.Create(harness.WithLimits(s.Pod(harness.PodSpec{Name: "third", Milli: 500}), slot))
	// (The plain node's slots went to the whole GPUs.)
	if msg := s.WaitUnschedulable(30*time.Second, "third"); !strings.Contains(msg, "1 node(s) had no single GPU with enough free milli-GPU") {
		t.Errorf("third: %q", msg)
	}
}

const gpufitNoDelivery = "node(s) had no device plugin that delivers GPU shares"

// A lock held by a pod whose bind never reaches the device plugin blocks
// the node until it expires; then the next bind takes it over, and the
// plugin releases it.
func TestHAMiLockExpiry(t *testing.T) {
	const expiry = 3
	sched, err := harness.StartInProcessWith(context.Background(), cluster.Config, manifests.SchedulerConfig, harness.InProcessOptions{
		FitArgs: func(a *ourconfig.GPUFitArgs) { a.HAMi.NodeLockExpirySeconds, a.HAMi.LockWaitSeconds = expiry, 20 }})
	if err != nil {
		t.Fatal(err)
	}
	defer sched.Stop()
	s := cluster.NewScope(t)
	s.AddNodes(fleet.Node{Name: "hami", CPU: "64", Memory: "256Gi", GPUs: 1, Model: "NVIDIA-L4", MemoryMiB: 23034, HAMiSplit: 4})
	node := s.Node("hami")
	// The holder exists but is never bound (no scheduler has its name).
	s.Create(s.Pod(harness.PodSpec{Name: "stuck", Scheduler: "nobody"}))
	taken := time.Now().UTC().Truncate(time.Second)
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, hami.AnnotationNodeLock, hami.NodeLockValue(taken, s.NS, "stuck"))
	if _, err := s.C.Client.CoreV1().Nodes().Patch(s.Ctx, node, "application/merge-patch+json", []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	// Three binds wait for it (each woken when the lock changes), then go
	// one at a time: the device plugin serves whichever pod holds the lock,
	// so each container getting its own size shows that no two overlapped.
	names := []string{"next-200", "next-300", "next-400"}
	for _, n := range names {
		milli, _ := strconv.Atoi(strings.TrimPrefix(n, "next-"))
		s.Create(harness.WithLimits(s.Pod(harness.PodSpec{Name: n, Milli: milli}), map[v1.ResourceName]string{gpu.ResourceNvidiaGPU: "1"}))
	}
	bound := s.WaitBound(90*time.Second, names...)
	for _, n := range names {
		p := bound[n]
		bt, err := strconv.ParseInt(p.Annotations[hami.AnnotationBindTime], 10, 64)
		if err != nil {
			t.Fatalf("%s: bind time %q: %v", n, p.Annotations[hami.AnnotationBindTime], err)
		}
		if bt < taken.Unix()+expiry {
			t.Errorf("%s: bound at %d, while the lock taken at %d was fresh (expiry %ds)", n, bt, taken.Unix(), expiry)
		}
		milli, _ := strconv.Atoi(strings.TrimPrefix(n, "next-"))
		if env := waitEnv(t, s, n); env["CUDA_DEVICE_MEMORY_LIMIT_0"] != strconv.Itoa(23034*milli/1000)+"m" || env["CUDA_DEVICE_SM_LIMIT"] != strconv.Itoa(milli/10) {
			t.Errorf("%s: got %v, not its own share", n, env)
		}
	}
	err = wait.PollUntilContextTimeout(s.Ctx, 100*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := s.C.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		_, held := n.Annotations[hami.AnnotationNodeLock]
		return err == nil && !held, nil
	})
	if err != nil {
		t.Errorf("the plugin did not release the lock: %v", err)
	}
}
