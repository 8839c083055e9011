package e2e

// The tests on kind's real workers (make e2e-kind): real kubelets call real
// device plugins (test/images/nvidia-plugin on the worker labelled
// gpu-scheduler.io/e2e-agent=nvidia, test/images/hami-plugin on the one
// labelled hami), and each GPU pod runs test/images/gpu-workload, which
// prints the environment its device plugin gave it. The tests check that
// environment against the scheduler's assignment: the decision as the node
// delivered it.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/agent/hami"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/fakehami"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/test/harness"
)

const (
	labelAgent    = "gpu-scheduler.io/e2e-agent"
	agentNVIDIA   = "nvidia"
	agentHAMi     = "hami"
	workloadImage = "gpu-scheduler-e2e/gpu-workload:e2e"
	// What hack/kind/manifests/device-plugins.yaml gives each worker.
	plainGPUs, plainMiB = 4, 81920
	plainModel          = "NVIDIA-A100-SXM4-80GB"
	hamiGPUs, hamiMiB   = 4, 23034
	hamiSplit           = 10
)

// onKind skips a test unless the suite runs on make e2e-kind's cluster.
func onKind(t *testing.T) {
	t.Helper()
	if os.Getenv("E2E_KIND") == "" {
		t.Skip("needs real kubelets and device plugins: make e2e-kind")
	}
}

// figures collects what the kind tests measure; TestMain writes them to
// $E2E_FIGURES as JSON.
var figures = struct {
	sync.Mutex
	m map[string]any
}{m: map[string]any{}}

// envChecks counts what the tests compared between a container's
// environment and the scheduler's decision, over the whole run.
var envChecks = struct {
	sync.Mutex
	pods, devices, limits int
}{}

func countEnvCheck(devices, limits int) {
	envChecks.Lock()
	defer envChecks.Unlock()
	envChecks.pods++
	envChecks.devices += devices
	envChecks.limits += limits
	figures.Lock()
	figures.m["env_checks"] = map[string]int{"pods": envChecks.pods, "devices": envChecks.devices, "limits": envChecks.limits}
	figures.Unlock()
}

func recordFigure(name string, v any) {
	figures.Lock()
	defer figures.Unlock()
	figures.m[name] = v
}

func writeFigures() {
	path := os.Getenv("E2E_FIGURES")
	figures.Lock()
	defer figures.Unlock()
	if path == "" || len(figures.m) == 0 {
		return
	}
	b, _ := json.MarshalIndent(figures.m, "", "  ")
	_ = os.WriteFile(path, append(b, '\n'), 0o644)
}

func kindWorker(t *testing.T, agent string) *v1.Node {
	t.Helper()
	list, err := cluster.Client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{LabelSelector: labelAgent + "=" + agent})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("want one worker labelled %s=%s: %v (%d)", labelAgent, agent, err, len(list.Items))
	}
	return &list.Items[0]
}

// workload is a pod of the scope that runs gpu-workload on the worker of
// the given agent.
func workload(s *harness.Scope, spec harness.PodSpec, agent string) *v1.Pod {
	spec.AnyNode = true
	spec.NodeSelector = map[string]string{labelAgent: agent}
	if spec.CPU == "" {
		spec.CPU = "10m"
	}
	if spec.Memory == "" {
		spec.Memory = "16Mi"
	}
	p := s.Pod(spec)
	p.Spec.Containers[0].Image = workloadImage
	p.Spec.Containers[0].ImagePullPolicy = v1.PullNever
	return p
}

// waitRunning waits until the pods run; a pod that fails ends the test.
func waitRunning(t *testing.T, s *harness.Scope, timeout time.Duration, names ...string) map[string]*v1.Pod {
	t.Helper()
	out := map[string]*v1.Pod{}
	var last string
	err := wait.PollUntilContextTimeout(s.Ctx, 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		for _, n := range names {
			if out[n] != nil {
				continue
			}
			p, err := cluster.Client.CoreV1().Pods(s.NS).Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				last = err.Error()
				return false, nil
			}
			switch p.Status.Phase {
			case v1.PodRunning:
				out[n] = p
			case v1.PodFailed:
				return false, fmt.Errorf("pod %s failed: %s: %s", n, p.Status.Reason, p.Status.Message)
			default:
				last = fmt.Sprintf("%s: %s on %q (%s)", n, p.Status.Phase, p.Spec.NodeName, harness.Unschedulable(p))
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("pods not running: %v; last: %s", err, last)
	}
	return out
}

// printedEnv reads the environment the pod's container printed.
func printedEnv(t *testing.T, s *harness.Scope, name string) map[string]string {
	t.Helper()
	var out map[string]string
	err := wait.PollUntilContextTimeout(s.Ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		b, err := cluster.Client.CoreV1().Pods(s.NS).GetLogs(name, &v1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			return false, nil
		}
		env, ok := parseEnv(string(b))
		out = env
		return ok, nil
	})
	if err != nil {
		t.Fatalf("pod %s printed no environment: %v", name, err)
	}
	return out
}

// parseEnv reads gpu-workload's lines between its markers.
func parseEnv(log string) (map[string]string, bool) {
	env := map[string]string{}
	in := false
	for _, l := range strings.Split(log, "\n") {
		switch {
		case l == "--- gpu-workload env ---":
			in = true
		case l == "--- gpu-workload end ---":
			return env, in
		case in:
			if k, v, ok := strings.Cut(l, "="); ok {
				env[k] = v
			}
		}
	}
	return nil, false
}

// plainIndex maps the plain worker's device UUIDs (the plugin names them as
// fakehami.Devices does) to their indices.
func plainIndex(node string) map[string]int {
	out := map[string]int{}
	for _, d := range fakehami.Devices(node, plainGPUs, plainMiB, 1, plainModel) {
		out[d.UUID] = d.Index
	}
	return out
}

// assigned is the pod's assignment, which must name its node.
func assigned(t *testing.T, p *v1.Pod) gpu.Assignment {
	t.Helper()
	a, err := gpu.ParseAssignment(p.Annotations[gpu.AnnotationAssignment])
	if err != nil || a.Node != p.Spec.NodeName {
		t.Fatalf("pod %s on %s: assignment %q: %v", p.Name, p.Spec.NodeName, p.Annotations[gpu.AnnotationAssignment], err)
	}
	return a
}

// kubeletDevices is the sorted device indices the plain worker's kubelet
// gave the container, from its NVIDIA_VISIBLE_DEVICES.
func kubeletDevices(t *testing.T, node string, env map[string]string) []int {
	t.Helper()
	idx := plainIndex(node)
	var out []int
	for _, id := range strings.Split(env["NVIDIA_VISIBLE_DEVICES"], ",") {
		i, ok := idx[id]
		if !ok {
			t.Fatalf("device %q is not one of %s's", id, node)
		}
		out = append(out, i)
	}
	sort.Ints(out)
	countEnvCheck(len(out), 0)
	return out
}

func shareIndices(a gpu.Assignment) []int {
	var out []int
	for _, sh := range a.Shares {
		out = append(out, sh.Index)
	}
	sort.Ints(out)
	return out
}

// checkHAMiEnv checks a HAMi worker's container against the decision: the
// devices and limits the plugin wrote into its environment are the ones
// recorded in hami.io/vgpu-devices-allocated, and those are the devices of
// the assignment (by the registration's index), with the share's memory
// and SMs. It returns the per-device use, keyed by UUID.
func checkHAMiEnv(t *testing.T, node *v1.Node, p *v1.Pod, env map[string]string) map[string]hami.ContainerDevice {
	t.Helper()
	a := assigned(t, p)
	reg, err := hami.ParseRegister(node.Annotations[hami.AnnotationRegister])
	if err != nil {
		t.Fatalf("%s's registration: %v", node.Name, err)
	}
	byIndex := map[int]hami.Device{}
	for _, d := range reg {
		byIndex[int(d.Index)] = d
	}
	rec, err := hami.DecodePodDevices(p.Annotations[hami.AnnotationAllocated])
	if err != nil || len(rec) == 0 {
		t.Fatalf("%s: record %q: %v", p.Name, p.Annotations[hami.AnnotationAllocated], err)
	}
	ctr := rec[len(rec)-1]
	for _, seg := range rec {
		if len(seg) > 0 {
			ctr = seg
			break
		}
	}
	if len(ctr) != len(a.Shares) {
		t.Fatalf("%s: assignment %s names %d devices, the record %d", p.Name, a, len(a.Shares), len(ctr))
	}
	var uuids []string
	out := map[string]hami.ContainerDevice{}
	for i, sh := range a.Shares {
		d, ok := byIndex[sh.Index]
		if !ok {
			t.Fatalf("%s: device %d is not in %s's registration", p.Name, sh.Index, node.Name)
		}
		if ctr[i].UUID != d.ID {
			t.Errorf("%s: assignment device %d is %s, the record says %s", p.Name, sh.Index, d.ID, ctr[i].UUID)
		}
		// The share's memory: a milli share takes its part of the
		// device's memory; a whole GPU all of it.
		want := int32(int64(d.Devmem) * int64(sh.Milli) / gpu.MilliPerGPU)
		if q, ok := p.Spec.Containers[0].Resources.Limits[hami.ResourceMemory]; ok {
			want = int32(q.Value())
		}
		if ctr[i].Usedmem != want {
			t.Errorf("%s: device %s: %d MiB recorded, the share is %d MiB", p.Name, d.ID, ctr[i].Usedmem, want)
		}
		if got := env[fmt.Sprintf("CUDA_DEVICE_MEMORY_LIMIT_%d", i)]; got != fmt.Sprintf("%dm", ctr[i].Usedmem) {
			t.Errorf("%s: CUDA_DEVICE_MEMORY_LIMIT_%d=%q, recorded %d MiB", p.Name, i, got, ctr[i].Usedmem)
		}
		uuids = append(uuids, ctr[i].UUID)
		out[ctr[i].UUID] = ctr[i]
	}
	if got := env["NVIDIA_VISIBLE_DEVICES"]; got != strings.Join(uuids, ",") {
		t.Errorf("%s: NVIDIA_VISIBLE_DEVICES=%q, recorded %q", p.Name, got, strings.Join(uuids, ","))
	}
	if got := env["CUDA_DEVICE_SM_LIMIT"]; got != strconv.Itoa(int(ctr[0].Usedcores)) {
		t.Errorf("%s: CUDA_DEVICE_SM_LIMIT=%q, recorded %d%%", p.Name, got, ctr[0].Usedcores)
	}
	if ph := p.Annotations[hami.AnnotationBindPhase]; ph != "success" {
		t.Errorf("%s: bind phase %q, want success", p.Name, ph)
	}
	// Per device its memory limit, and the SM limit once.
	countEnvCheck(len(ctr), len(ctr)+1)
	return out
}

// checkNoLock fails if the HAMi worker's lock is still held. A bind the
// killed leader left between its lock and its binding holds it until its
// successor judges it abandoned (90 s after it was written) and releases
// it (at its next look at the node, every 30 s at the latest): the wait
// covers that.
func checkNoLock(t *testing.T, node string) {
	t.Helper()
	var v string
	err := wait.PollUntilContextTimeout(context.Background(), 250*time.Millisecond, 150*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := cluster.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		var held bool
		v, held = n.Annotations[hami.AnnotationNodeLock]
		return !held, nil
	})
	if err != nil {
		t.Errorf("%s: node lock still held: %s", node, v)
	}
}

// waitGone waits until the scope's pods are gone, so that the next round
// finds the devices free on the node (the kubelet frees them when the
// containers are gone).
func waitGone(t *testing.T, s *harness.Scope) {
	t.Helper()
	_ = cluster.Client.CoreV1().Pods(s.NS).DeleteCollection(s.Ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, metav1.ListOptions{})
	err := wait.PollUntilContextTimeout(s.Ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := cluster.Client.CoreV1().Pods(s.NS).List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 0, nil
	})
	if err != nil {
		t.Fatalf("pods not gone: %v", err)
	}
}

// Whole GPUs on the plain worker, where the kubelet, not the scheduler,
// picks the device IDs. The test measures how often its choice differs
// from the assignment, and shows what does depend on the assignment does
// not depend on the index: the node holds exactly as many GPU pods as it
// has devices (the kubelet admits every pod the scheduler binds, and the
// scheduler binds no pod beyond the devices), whichever devices the kubelet
// picked.
func TestKindWholeGPUs(t *testing.T) {
	onKind(t)
	s := cluster.NewScope(t)
	node := kindWorker(t, agentNVIDIA).Name
	const rounds = 5
	pods, differ, devices, devicesDiffer := 0, 0, 0, 0
	for r := 0; r < rounds; r++ {
		// 1 + 1 + 2 GPUs fill the node; a fourth pod waits.
		specs := []harness.PodSpec{{Name: fmt.Sprintf("r%d-a", r), GPUs: 1}, {Name: fmt.Sprintf("r%d-b", r), GPUs: 1}, {Name: fmt.Sprintf("r%d-c", r), GPUs: 2}}
		var names []string
		for _, sp := range specs {
			s.Create(workload(s, sp, agentNVIDIA))
			names = append(names, sp.Name)
		}
		running := waitRunning(t, s, 2*time.Minute, names...)
		s.Create(workload(s, harness.PodSpec{Name: fmt.Sprintf("r%d-wait", r), GPUs: 1}, agentNVIDIA))
		s.WaitReason(time.Minute, fmt.Sprintf("r%d-wait", r), "")
		seen := map[int]string{}
		for _, n := range names {
			p := running[n]
			a := assigned(t, p)
			got := kubeletDevices(t, node, printedEnv(t, s, n))
			if len(got) != len(a.Shares) {
				t.Errorf("%s: the kubelet gave %d devices, the assignment names %d", n, len(got), len(a.Shares))
			}
			for _, i := range got {
				if other, dup := seen[i]; dup {
					t.Errorf("device %d given to %s and %s", i, other, n)
				}
				seen[i] = n
			}
			want := shareIndices(a)
			pods++
			devices += len(want)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				differ++
			}
			for _, i := range want {
				if !containsInt(got, i) {
					devicesDiffer++
				}
			}
		}
		// The waiting pod binds once one GPU frees up, and the kubelet
		// admits it on whichever device is free.
		s.Delete(names[0])
		waitRunning(t, s, 2*time.Minute, fmt.Sprintf("r%d-wait", r))
		waitGone(t, s)
	}
	t.Logf("the kubelet's devices differed from the assignment for %d of %d pods (%d of %d devices)", differ, pods, devicesDiffer, devices)
	recordFigure("plain_kubelet_vs_assignment", map[string]int{"pods": pods, "pods_differing": differ, "devices": devices, "devices_differing": devicesDiffer})
	if _, err := harness.CheckDevices(s.Ctx, cluster.Client); err != nil {
		t.Error(err)
	}
}

func containsInt(xs []int, x int) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// A share never goes to the plain worker: nothing there would limit it.
func TestKindShareRefusedOnPlainNode(t *testing.T) {
	onKind(t)
	s := cluster.NewScope(t)
	p := workload(s, harness.PodSpec{Name: "share", Milli: 500}, agentNVIDIA)
	harness.WithLimits(p, map[v1.ResourceName]string{gpu.ResourceNvidiaGPU: "1"})
	s.Create(p)
	s.WaitReason(time.Minute, "share", "no device plugin that delivers GPU shares")
}

// Shares and whole GPUs on the HAMi worker: each container gets, from the
// real kubelet through the HAMi plugin, the devices the scheduler chose
// (by UUID) with the share's memory and SM limits; no device holds more
// than it has; the lock is free after every bind.
func TestKindHAMiShares(t *testing.T) {
	onKind(t)
	s := cluster.NewScope(t)
	node := kindWorker(t, agentHAMi)
	type spec struct {
		name   string
		milli  int
		limits map[v1.ResourceName]string
	}
	// Whole GPUs first (three of the four, exclusive), then four shares
	// that fill the last device: 997 milli, 22,971 of its 23,034 MiB, four
	// containers on one device.
	specs := []spec{
		{"two", 0, map[v1.ResourceName]string{gpu.ResourceNvidiaGPU: "2"}},
		{"whole", 0, map[v1.ResourceName]string{gpu.ResourceNvidiaGPU: "1"}},
		{"third", 300, map[v1.ResourceName]string{gpu.ResourceNvidiaGPU: "1"}},
		{"quarter", 250, map[v1.ResourceName]string{gpu.ResourceNvidiaGPU: "1"}},
		{"tenth", 100, map[v1.ResourceName]string{gpu.ResourceNvidiaGPU: "1"}},
		{"hami-mem", 0, map[v1.ResourceName]string{gpu.ResourceNvidiaGPU: "1", hami.ResourceMemory: "8000", hami.ResourceCores: "30"}},
	}
	var names []string
	for i, sp := range specs {
		p := workload(s, harness.PodSpec{Name: sp.name, Milli: sp.milli}, agentHAMi)
		harness.WithLimits(p, sp.limits)
		s.Create(p)
		names = append(names, sp.name)
		if i == 1 {
			waitRunning(t, s, 2*time.Minute, names...)
		}
	}
	running := waitRunning(t, s, 3*time.Minute, names...)
	node = kindWorker(t, agentHAMi)
	mem, ctrs := map[string]int32{}, map[string]int{}
	compared := 0
	for _, n := range names {
		for id, d := range checkHAMiEnv(t, node, running[n], printedEnv(t, s, n)) {
			mem[id] += d.Usedmem
			ctrs[id]++
			compared++
		}
	}
	for id, m := range mem {
		if m > hamiMiB || ctrs[id] > hamiSplit {
			t.Errorf("device %s holds %d MiB in %d containers", id, m, ctrs[id])
		}
	}
	t.Logf("%d pods, %d devices compared with their containers' environment", len(names), compared)
	recordFigure("hami_env_checked", map[string]int{"pods": len(names), "devices": compared})
	checkNoLock(t, node.Name)
	if _, err := harness.CheckDevices(s.Ctx, cluster.Client); err != nil {
		t.Error(err)
	}
}

// helm runs the chart's helm against the cluster.
func helm(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(harness.BinDir(), "helm"), args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+cluster.Kubeconfig)
	cmd.Dir = harness.RepoRoot()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return string(out)
}

// observedTimes watches the scope's pods and records, per pod, when it was
// first seen bound and first seen running (wall clock, not the API's
// second-resolution timestamps).
type observedTimes struct {
	mu             sync.Mutex
	bound, running map[string]time.Time
	stop           func()
}

func watchTimes(t *testing.T, s *harness.Scope) *observedTimes {
	t.Helper()
	w, err := cluster.Client.CoreV1().Pods(s.NS).Watch(s.Ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	o := &observedTimes{bound: map[string]time.Time{}, running: map[string]time.Time{}, stop: w.Stop}
	go func() {
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*v1.Pod)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			now := time.Now()
			o.mu.Lock()
			if _, seen := o.bound[p.Name]; !seen && p.Spec.NodeName != "" {
				o.bound[p.Name] = now
			}
			if _, seen := o.running[p.Name]; !seen && p.Status.Phase == v1.PodRunning {
				o.running[p.Name] = now
			}
			o.mu.Unlock()
		}
	}()
	return o
}

// latencies is bind → running per pod, in seconds.
func (o *observedTimes) latencies(names []string) []float64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []float64
	for _, n := range names {
		b, ok1 := o.bound[n]
		r, ok2 := o.running[n]
		if ok1 && ok2 {
			out = append(out, r.Sub(b).Seconds())
		}
	}
	sort.Float64s(out)
	return out
}

func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// Bind → container running on real kubelets, for whole GPUs (the plain
// worker) and HAMi shares; and the pods per second one HAMi node takes,
// whose lock lets one bind through at a time. Figures, not assertions:
// they go to $E2E_FIGURES and docs/benchmarks.md.
func TestKindTimings(t *testing.T) {
	onKind(t)
	s := cluster.NewScope(t)
	o := watchTimes(t, s)
	defer o.stop()
	var whole, shares []string
	for r := 0; r < 5; r++ {
		var names []string
		for i := 0; i < plainGPUs; i++ {
			n := fmt.Sprintf("whole-%d-%d", r, i)
			s.Create(workload(s, harness.PodSpec{Name: n, GPUs: 1}, agentNVIDIA))
			names = append(names, n)
		}
		waitRunning(t, s, 2*time.Minute, names...)
		whole = append(whole, names...)
		waitGone(t, s)
	}
	for r := 0; r < 3; r++ {
		var names []string
		for i := 0; i < 8; i++ {
			n := fmt.Sprintf("share-%d-%d", r, i)
			p := workload(s, harness.PodSpec{Name: n, Milli: 250}, agentHAMi)
			harness.WithLimits(p, map[v1.ResourceName]string{gpu.ResourceNvidiaGPU: "1"})
			s.Create(p)
			names = append(names, n)
		}
		waitRunning(t, s, 3*time.Minute, names...)
		shares = append(shares, names...)
		waitGone(t, s)
	}
	// One HAMi node's rate: as many tenth-GPU pods as it has slots, at once.
	var burst []string
	start := time.Now()
	for i := 0; i < hamiGPUs*hamiSplit; i++ {
		n := fmt.Sprintf("burst-%02d", i)
		p := workload(s, harness.PodSpec{Name: n, Milli: 100, CPU: "1m", Memory: "8Mi"}, agentHAMi)
		harness.WithLimits(p, map[v1.ResourceName]string{gpu.ResourceNvidiaGPU: "1"})
		s.Create(p)
		burst = append(burst, n)
	}
	created := time.Since(start)
	waitRunning(t, s, 10*time.Minute, burst...)
	o.mu.Lock()
	var first, lastBound, lastRunning time.Time
	for _, n := range burst {
		b, r := o.bound[n], o.running[n]
		if first.IsZero() || b.Before(first) {
			first = b
		}
		if b.After(lastBound) {
			lastBound = b
		}
		if r.After(lastRunning) {
			lastRunning = r
		}
	}
	o.mu.Unlock()
	wl, sl := o.latencies(whole), o.latencies(shares)
	fig := map[string]any{
		"whole_bind_to_running_p50_s": percentile(wl, 0.5), "whole_bind_to_running_p99_s": percentile(wl, 0.99), "whole_samples": len(wl),
		"share_bind_to_running_p50_s": percentile(sl, 0.5), "share_bind_to_running_p99_s": percentile(sl, 0.99), "share_samples": len(sl),
		"hami_node_burst_pods":           len(burst),
		"hami_node_burst_created_s":      created.Seconds(),
		"hami_node_binds_per_s":          float64(len(burst)-1) / lastBound.Sub(first).Seconds(),
		"hami_node_running_per_s":        float64(len(burst)) / lastRunning.Sub(start).Seconds(),
		"hami_node_first_to_last_bind_s": lastBound.Sub(first).Seconds(),
	}
	b, _ := json.Marshal(fig)
	t.Logf("timings: %s", b)
	recordFigure("timings", fig)
	checkNoLock(t, kindWorker(t, agentHAMi).Name)
}

// The leader's pod is deleted in the middle of a burst on the real
// workers: the standby takes over, every pod is bound or explained, every
// bound pod runs with the devices it was assigned, and no device is
// booked twice.
func TestKindLeaderKilledMidBurst(t *testing.T) {
	onKind(t)
	s := cluster.NewScope(t)
	var pods []*v1.Pod
	var names []string
	for i := 0; i < 30; i++ {
		n := fmt.Sprintf("p%02d", i)
		var p *v1.Pod
		if i%3 == 0 {
			p = workload(s, harness.PodSpec{Name: n, GPUs: 1}, agentNVIDIA) // 4 of 10 fit
		} else {
			p = workload(s, harness.PodSpec{Name: n, Milli: 200 + 100*(i%4)}, agentHAMi)
			harness.WithLimits(p, map[v1.ResourceName]string{gpu.ResourceNvidiaGPU: "1"})
		}
		pods = append(pods, p)
		names = append(names, n)
	}
	before, _ := scheds.Leader(s.Ctx)
	burstAndKill(t, s, pods, names, 100*time.Millisecond, 5)
	after, _ := scheds.Leader(s.Ctx)
	if after == before {
		t.Errorf("leadership did not move: %s", after)
	}
	checkDelivered(t, s, names)
}

// checkDelivered checks every bound pod of the scope: it runs (or the test
// waits until it does), the plain worker's pods hold distinct devices and
// no more than it has, and the HAMi worker's containers got what was
// recorded for them, within each device's memory and slots.
func checkDelivered(t *testing.T, s *harness.Scope, names []string) {
	t.Helper()
	plain, hn := kindWorker(t, agentNVIDIA), kindWorker(t, agentHAMi)
	var bound []string
	for _, n := range names {
		if p := s.GetOrNil(n); p != nil && p.Spec.NodeName != "" {
			bound = append(bound, n)
		}
	}
	running := waitRunning(t, s, 3*time.Minute, bound...)
	wholeUsed := 0
	mem, ctrs := map[string]int32{}, map[string]int{}
	for _, n := range bound {
		p := running[n]
		switch p.Spec.NodeName {
		case plain.Name:
			wholeUsed += len(kubeletDevices(t, plain.Name, printedEnv(t, s, n)))
		case hn.Name:
			for id, d := range checkHAMiEnv(t, hn, p, printedEnv(t, s, n)) {
				mem[id] += d.Usedmem
				ctrs[id]++
			}
		default:
			t.Errorf("%s on %s, not a GPU worker", n, p.Spec.NodeName)
		}
	}
	if wholeUsed > plainGPUs {
		t.Errorf("%d whole GPUs in use on %s, which has %d", wholeUsed, plain.Name, plainGPUs)
	}
	for id, m := range mem {
		if m > hamiMiB || ctrs[id] > hamiSplit {
			t.Errorf("device %s holds %d MiB in %d containers", id, m, ctrs[id])
		}
	}
	checkNoLock(t, hn.Name)
	if _, err := harness.CheckDevices(s.Ctx, cluster.Client); err != nil {
		t.Error(err)
	}
	t.Logf("%d of %d pods bound and delivered; %d whole GPUs, %d HAMi devices in use", len(bound), len(names), wholeUsed, len(mem))
}

// helm upgrade with a changed plugin arg while pods arrive: the Deployment
// rolls to the new configuration, every pod is bound or explained, and no
// device is booked twice. helm rollback restores the release for the tests
// after.
func TestKindHelmUpgradeUnderLoad(t *testing.T) {
	onKind(t)
	s := cluster.NewScope(t)
	var names []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 24; i++ {
			n := fmt.Sprintf("p%02d", i)
			var p *v1.Pod
			if i%3 == 0 {
				p = workload(s, harness.PodSpec{Name: n, GPUs: 1}, agentNVIDIA)
			} else {
				p = workload(s, harness.PodSpec{Name: n, Milli: 300}, agentHAMi)
				harness.WithLimits(p, map[v1.ResourceName]string{gpu.ResourceNvidiaGPU: "1"})
			}
			if _, err := cluster.Client.CoreV1().Pods(s.NS).Create(s.Ctx, p, metav1.CreateOptions{}); err != nil {
				t.Errorf("creating %s: %v", n, err)
				return
			}
			names = append(names, n)
			time.Sleep(500 * time.Millisecond)
		}
	}()
	time.Sleep(2 * time.Second)
	gen := deploymentGeneration(t)
	// Rolled back to the revision before, whatever happens, for the tests
	// after this one.
	var status struct {
		Version int `json:"version"`
	}
	if err := json.Unmarshal([]byte(helm(t, "status", "gpu-scheduler", "--namespace", "kube-system", "-o", "json")), &status); err != nil || status.Version == 0 {
		t.Fatalf("the release's revision: %v", err)
	}
	defer helm(t, "rollback", "gpu-scheduler", strconv.Itoa(status.Version), "--namespace", "kube-system", "--wait", "--timeout", "5m")
	helm(t, "upgrade", "gpu-scheduler", "manifests/charts/gpu-scheduler", "--namespace", "kube-system", "--reuse-values",
		"--set", "pluginArgs.GPUScore.policy=BestFit", "--wait", "--timeout", "5m")
	<-done
	if g := deploymentGeneration(t); g <= gen {
		t.Errorf("the Deployment did not roll: generation %d, before %d", g, gen)
	}
	cm, err := cluster.Client.CoreV1().ConfigMaps("kube-system").Get(s.Ctx, "gpu-scheduler-config", metav1.GetOptions{})
	if err != nil || !strings.Contains(cm.Data["scheduler-config.yaml"], "policy: BestFit") {
		t.Errorf("the configuration does not carry the new arg: %v", err)
	}
	settle(t, s, names, 3*time.Minute)
	checkDelivered(t, s, names)
}

func deploymentGeneration(t *testing.T) int64 {
	t.Helper()
	d, err := cluster.Client.AppsV1().Deployments("kube-system").Get(context.Background(), "gpu-scheduler", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return d.Generation
}

// The HAMi plugin's pod is deleted while shares are being bound on its
// node: each pod either runs with what it was assigned, or fails the
// kubelet's admission cleanly (no lock left, nothing held); once the
// DaemonSet's new plugin registers, the node takes a full load again.
func TestKindHAMiPluginRestart(t *testing.T) {
	onKind(t)
	s := cluster.NewScope(t)
	hn := kindWorker(t, agentHAMi)
	var names []string
	for i := 0; i < 8; i++ {
		n := fmt.Sprintf("inflight-%d", i)
		p := workload(s, harness.PodSpec{Name: n, Milli: 500}, agentHAMi)
		harness.WithLimits(p, map[v1.ResourceName]string{gpu.ResourceNvidiaGPU: "1"})
		s.Create(p)
		names = append(names, n)
	}
	// Delete the plugin once the first bind is through.
	s.WaitBound(time.Minute, names[0])
	plugins, err := cluster.Client.CoreV1().Pods("kube-system").List(s.Ctx, metav1.ListOptions{LabelSelector: "app=hami-device-plugin"})
	if err != nil || len(plugins.Items) != 1 {
		t.Fatalf("the HAMi plugin's pod: %v", err)
	}
	if err := cluster.Client.CoreV1().Pods("kube-system").Delete(s.Ctx, plugins.Items[0].Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	// Every pod ends up running or failed by the kubelet.
	outcome := map[string]v1.PodPhase{}
	err = wait.PollUntilContextTimeout(s.Ctx, 500*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, n := range names {
			p := s.GetOrNil(n)
			if p != nil && (p.Status.Phase == v1.PodRunning || p.Status.Phase == v1.PodFailed) {
				outcome[n] = p.Status.Phase
			}
		}
		return len(outcome) == len(names), nil
	})
	if err != nil {
		t.Fatalf("pods neither running nor failed: %v (%v)", err, outcome)
	}
	failed := 0
	for _, n := range names {
		p := s.Get(n)
		if outcome[n] == v1.PodFailed {
			failed++
			if p.Status.Reason != "UnexpectedAdmissionError" {
				t.Errorf("%s failed for %s (%s), not the kubelet's admission", n, p.Status.Reason, p.Status.Message)
			}
			continue
		}
		checkHAMiEnv(t, kindWorker(t, agentHAMi), p, printedEnv(t, s, n))
	}
	t.Logf("%d of %d in-flight pods failed admission while the plugin restarted", failed, len(names))
	recordFigure("hami_plugin_restart", map[string]int{"pods": len(names), "failed_admission": failed})
	checkNoLock(t, hn.Name)
	// Nothing leaked: with those pods gone, the node takes its full
	// capacity of half-GPU shares again (two per device).
	waitGone(t, s)
	var full []string
	for i := 0; i < 2*hamiGPUs; i++ {
		n := fmt.Sprintf("after-%d", i)
		p := workload(s, harness.PodSpec{Name: n, Milli: 500}, agentHAMi)
		harness.WithLimits(p, map[v1.ResourceName]string{gpu.ResourceNvidiaGPU: "1"})
		s.Create(p)
		full = append(full, n)
	}
	waitRunning(t, s, 3*time.Minute, full...)
	checkDelivered(t, s, full)
}

// HAMi's plugin registers with the kubelet (which then advertises its 40
// slots) before it writes its registration; until then the node is not a
// plain node with 40 GPUs: a GPU pod waits, says why, and binds through
// HAMi's protocol once the registration is there.
func TestKindHAMiNodeBeforeRegistration(t *testing.T) {
	onKind(t)
	s := cluster.NewScope(t)
	hn := kindWorker(t, agentHAMi).Name
	ds := cluster.Client.AppsV1().DaemonSets("kube-system")
	setArgs := func(extra ...string) {
		t.Helper()
		d, err := ds.Get(s.Ctx, "hami-device-plugin", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c := &d.Spec.Template.Spec.Containers[0]
		var args []string
		for _, a := range c.Args {
			if !strings.HasPrefix(a, "--register-delay") {
				args = append(args, a)
			}
		}
		c.Args = append(args, extra...)
		if _, err := ds.Update(s.Ctx, d, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPluginRolled(t, s, d.Generation+1)
	}
	setArgs("--register-delay=45s")
	defer setArgs()
	// The new plugin registered with the kubelet; its registration is
	// not written yet: take away the old one.
	remove := fmt.Sprintf(`{"metadata":{"annotations":{%q:null}}}`, hami.AnnotationRegister)
	if _, err := cluster.Client.CoreV1().Nodes().Patch(s.Ctx, hn, types.MergePatchType, []byte(remove), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	p := workload(s, harness.PodSpec{Name: "early"}, agentHAMi)
	harness.WithLimits(p, map[v1.ResourceName]string{gpu.ResourceNvidiaGPU: "1"})
	s.Create(p)
	s.WaitReason(30*time.Second, "early", "has not registered its GPUs yet")
	running := waitRunning(t, s, 2*time.Minute, "early")
	checkHAMiEnv(t, kindWorker(t, agentHAMi), running["early"], printedEnv(t, s, "early"))
	checkNoLock(t, hn)
}

// waitPluginRolled waits until the HAMi plugin's DaemonSet runs its new
// template.
func waitPluginRolled(t *testing.T, s *harness.Scope, gen int64) {
	t.Helper()
	err := wait.PollUntilContextTimeout(s.Ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		d, err := cluster.Client.AppsV1().DaemonSets("kube-system").Get(ctx, "hami-device-plugin", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		st := d.Status
		return st.ObservedGeneration >= gen && st.UpdatedNumberScheduled == st.DesiredNumberScheduled && st.NumberReady == st.DesiredNumberScheduled &&
			st.NumberUnavailable == 0, nil
	})
	if err != nil {
		t.Fatalf("the HAMi plugin did not roll: %v", err)
	}
	// And its new pod has registered with the kubelet.
	time.Sleep(3 * time.Second)
}
