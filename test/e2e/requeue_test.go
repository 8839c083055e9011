package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	configv1 "k8s.io/kube-scheduler/config/v1"
	"k8s.io/utils/ptr"

	ourv1 "github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config/v1"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/fleet"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/localcp"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/requeue"
	"github.com/gpu-scheduler/gpu-scheduler/test/harness"
)

// A pending GPU pod carries a specific, current reason in a pod condition;
// once it binds, the condition is gone.
func TestPendingReason(t *testing.T) {
	s := cluster.NewScope(t)
	s.AddNodes(fleet.Node{Name: "t4", CPU: "16", Memory: "64Gi", GPUs: 2, Model: "Tesla-T4", MemoryMiB: 15360})
	s.Create(s.Pod(harness.PodSpec{Name: "a", Milli: 700}), s.Pod(harness.PodSpec{Name: "b", Milli: 650}))
	s.WaitBound(bindTimeout, "a", "b")
	s.Create(s.Pod(harness.PodSpec{Name: "p", Milli: 500}))
	// 700 and 650 on the two devices: 300 and 350 are left.
	// Stable: no node and no free amount, which change on every bind.
	want := "no node has a GPU with 500 milli free"
	var got string
	err := wait.PollUntilContextTimeout(s.Ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		got = pendingReason(s.Get("p"))
		return strings.Contains(got, want), nil
	})
	if err != nil {
		t.Fatalf("pending reason: want %q, got %q", want, got)
	}
	s.Delete("b")
	s.WaitBound(bindTimeout, "p")
	// The reason goes once the pod is bound (the reconciler removes it).
	err = wait.PollUntilContextTimeout(s.Ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		_, ok := requeue.PendingCondition(s.Get("p"))
		return !ok, nil
	})
	if err != nil {
		t.Errorf("a bound pod keeps its pending reason %q", pendingReason(s.Get("p")))
	}
	checkDevices(t)
}

func pendingReason(p *v1.Pod) string {
	if c, ok := requeue.PendingCondition(p); ok {
		return c.Message
	}
	return ""
}

// With the wake-up for a freed GPU dropped (a fault switch only in the
// faultinject build), the queue is never told; the reconciler's resync must
// catch the pod within one period.
func TestMissedEventResync(t *testing.T) {
	if !cluster.Local() {
		t.Skip("needs the faultinject build as a local process")
	}
	const resync = 5
	profile := "gpu-scheduler-fault"
	sched, err := harness.StartProfile(context.Background(), cluster, filepath.Join(harness.BinDir(), "gpu-scheduler-faultinject"), profile,
		[]string{"GPU_SCHEDULER_FAULT_DROP_FREED_GPU=1"}, func(cfg *configv1.KubeSchedulerConfiguration) {
			for i := range cfg.Profiles[0].PluginConfig {
				if a, ok := cfg.Profiles[0].PluginConfig[i].Args.Object.(*ourv1.GPUFitArgs); ok {
					if a.Requeue == nil {
						a.Requeue = &ourv1.RequeueArgs{}
					}
					a.Requeue.ResyncPeriodSeconds = ptr.To[int32](resync)
					a.AccountingOnlySharing = ptr.To(true) // shares on a plain node
				}
			}
		})
	if err != nil {
		t.Fatal(err)
	}
	defer sched.Stop(5 * time.Second)
	s := cluster.NewScope(t)
	s.AddNodes(fleet.Node{Name: "one", CPU: "16", Memory: "64Gi", GPUs: 1, Model: "Tesla-T4", MemoryMiB: 15360})
	a := s.Pod(harness.PodSpec{Name: "a", Milli: 600, Scheduler: profile})
	s.Create(a)
	s.WaitBound(bindTimeout, "a")
	s.Create(s.Pod(harness.PodSpec{Name: "b", Milli: 600, Scheduler: profile}))
	s.WaitUnschedulable(bindTimeout, "b")
	before := metric(t, sched, "gpu_scheduler_requeue_activations_total")

	deleted := time.Now()
	s.Delete("a")
	s.WaitBound(time.Duration(resync+5)*time.Second, "b")
	bound := time.Since(deleted)
	after := metric(t, sched, "gpu_scheduler_requeue_activations_total")
	t.Logf("timeline: t=0 bound pod deleted (wake-up dropped); t=%v pending pod bound; reconciler activations %v -> %v (resync period %ds)",
		bound.Round(time.Millisecond), before, after, resync)
	if bound > time.Duration(resync+2)*time.Second {
		t.Errorf("bound %v after the delete: more than one resync period", bound)
	}
	if after <= before {
		t.Errorf("the pod was not activated by the reconciler (activations %v -> %v): did the fault switch work?", before, after)
	}
	if os.Getenv("E2E_TIMELINE") != "" {
		os.WriteFile(os.Getenv("E2E_TIMELINE"), []byte(strconv.FormatInt(bound.Milliseconds(), 10)+"\n"), 0o644)
	}
}

// A GPU pod held by something other than GPUs (a required anti-affinity)
// is attempted no more often than the scheduler's own backoff allows, with
// the reconciler and without it, while GPU pods come and go on its node
// every half second (each wakes the reconciler, which sees the GPUs free).
func TestBlockedPodKeepsItsBackoff(t *testing.T) {
	if !cluster.Local() {
		t.Skip("starts its own scheduler processes")
	}
	const window = 2 * time.Minute
	s := cluster.NewScope(t)
	s.AddNodes(fleet.Node{Name: "n", CPU: "32", Memory: "64Gi", GPUs: 4, Model: "Tesla-T4", MemoryMiB: 15360})
	anchor := s.Pod(harness.PodSpec{Name: "anchor"})
	anchor.Labels = map[string]string{"app": "anchor"}
	s.Create(anchor)
	s.WaitBound(bindTimeout, "anchor")

	type variant struct {
		profile    string
		reconciler bool
		sched      *localcp.Scheduler
	}
	variants := []*variant{{profile: "gpu-scheduler-backoff-on", reconciler: true}, {profile: "gpu-scheduler-backoff-off"}}
	for _, v := range variants {
		sched, err := harness.StartProfile(context.Background(), cluster, filepath.Join(harness.BinDir(), "gpu-scheduler"), v.profile, nil,
			func(cfg *configv1.KubeSchedulerConfiguration) {
				for i := range cfg.Profiles[0].PluginConfig {
					if a, ok := cfg.Profiles[0].PluginConfig[i].Args.Object.(*ourv1.GPUFitArgs); ok {
						if a.Requeue == nil {
							a.Requeue = &ourv1.RequeueArgs{}
						}
						a.Requeue.Enabled = ptr.To(v.reconciler)
						a.Requeue.ResyncPeriodSeconds = ptr.To[int32](5)
					}
				}
			})
		if err != nil {
			t.Fatal(err)
		}
		defer sched.Stop(5 * time.Second)
		v.sched = sched
		p := s.Pod(harness.PodSpec{Name: "blocked-" + strconv.FormatBool(v.reconciler), GPUs: 1, Scheduler: v.profile})
		p.Spec.Affinity = &v1.Affinity{PodAntiAffinity: &v1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []v1.PodAffinityTerm{{
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "anchor"}}, TopologyKey: harness.LabelScope}}}}
		s.Create(p)
		s.WaitUnschedulable(bindTimeout, p.Name)
	}
	attempts := func(v *variant) float64 {
		return metric(t, v.sched, `scheduler_schedule_attempts_total{profile="`+v.profile+`",result="unschedulable"}`)
	}
	before := map[string]float64{}
	for _, v := range variants {
		if before[v.profile] = attempts(v); before[v.profile] < 1 {
			t.Fatalf("%s: no unschedulable attempt counted: is scheduler_schedule_attempts_total read right?", v.profile)
		}
	}
	// GPU pods come and go on the node: every deletion frees a GPU.
	start, prev := time.Now(), ""
	for i := 0; time.Since(start) < window; i++ {
		name := "churn-" + strconv.Itoa(i)
		s.Create(s.Pod(harness.PodSpec{Name: name, GPUs: 1}))
		s.WaitBound(bindTimeout, name)
		if prev != "" {
			s.Delete(prev)
		}
		prev = name
		time.Sleep(500 * time.Millisecond)
	}
	// The scheduler's own schedule: backoff from 1 s, doubled up to 10 s.
	allowed, backoff := 0, time.Second
	for t := time.Duration(0); t <= window; t += backoff {
		allowed++
		backoff = min(2*backoff, 10*time.Second)
	}
	for _, v := range variants {
		n := attempts(v) - before[v.profile]
		t.Logf("reconciler %v: %v attempts in %v (the backoff schedule allows %d); reconciles declined as blocked elsewhere: %v",
			v.reconciler, n, window, allowed, metric(t, v.sched, `gpu_scheduler_requeue_reconciles_total{result="blocked"}`))
		if n > float64(allowed) {
			t.Errorf("reconciler %v: %v attempts in %v, more than the %d its backoff allows", v.reconciler, n, window, allowed)
		}
	}
	if metric(t, variants[0].sched, `gpu_scheduler_requeue_reconciles_total{result="blocked"}`) == 0 {
		t.Errorf("the reconciler never judged the blocked pod: did the churn wake it?")
	}
}

func metric(t *testing.T, s interface {
	Metric(context.Context, string) (string, bool)
}, name string) float64 {
	t.Helper()
	v, ok := s.Metric(context.Background(), name)
	if !ok {
		return 0
	}
	f, _ := strconv.ParseFloat(v, 64)
	return f
}

// A backlog of GPU pods that only GPUFit rejected is left out of the queue's
// walk for bound pods that free no GPU (PreQueueingHint): a pod blocked on
// CPU still wakes when a CPU pod goes, and a share that waits for its device
// still wakes when the share on it goes.
func TestBacklogNarrowsBoundPodEvents(t *testing.T) {
	if !cluster.Local() {
		t.Skip("starts its own scheduler process")
	}
	const profile = "gpu-scheduler-narrow"
	sched, err := harness.StartProfile(context.Background(), cluster, filepath.Join(harness.BinDir(), "gpu-scheduler"), profile, nil,
		func(cfg *configv1.KubeSchedulerConfiguration) {
			harness.AccountingOnlySharing(cfg)
			for i := range cfg.Profiles[0].PluginConfig {
				if a, ok := cfg.Profiles[0].PluginConfig[i].Args.Object.(*ourv1.GPUFitArgs); ok {
					if a.Requeue == nil {
						a.Requeue = &ourv1.RequeueArgs{}
					}
					// The queue alone must wake them: no reconciler.
					a.Requeue.Enabled = ptr.To(false)
				}
			}
		})
	if err != nil {
		t.Fatal(err)
	}
	defer sched.Stop(5 * time.Second)
	s := cluster.NewScope(t)
	s.AddNodes(fleet.Node{Name: "n", CPU: "4", Memory: "64Gi", GPUs: 1, Model: "Tesla-T4", MemoryMiB: 15360})
	s.Create(s.Pod(harness.PodSpec{Name: "holder", Milli: 600, Scheduler: profile}), s.Pod(harness.PodSpec{Name: "hog", CPU: "3", Scheduler: profile}))
	s.WaitBound(bindTimeout, "holder", "hog")
	// More than the narrowing needs to pay: pods for a model no node has.
	var waiting []string
	for i := 0; i < 80; i++ {
		name := "backlog-" + strconv.Itoa(i)
		s.Create(s.Pod(harness.PodSpec{Name: name, GPUs: 1, Model: "NVIDIA-H100-80GB-HBM3", Scheduler: profile}))
		waiting = append(waiting, name)
	}
	s.Create(s.Pod(harness.PodSpec{Name: "share", Milli: 600, Scheduler: profile}), s.Pod(harness.PodSpec{Name: "cpu", CPU: "2", Scheduler: profile}))
	for _, p := range append(waiting, "share", "cpu") {
		s.WaitUnschedulable(bindTimeout, p)
	}
	// Past their backoff: every one of them sits in the unschedulable pool.
	time.Sleep(3 * time.Second)
	narrowed := func() float64 {
		return metric(t, sched, `scheduler_pre_queueing_hint_evaluations_total{plugin="GPUFit",result="narrowed"}`)
	}
	before := narrowed()
	s.Delete("hog") // frees CPU, no GPU
	s.WaitBound(bindTimeout, "cpu")
	// The queue's metrics are recorded asynchronously, flushed every second.
	var after float64
	wait.PollUntilContextTimeout(s.Ctx, 200*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		after = narrowed()
		return after > before, nil
	})
	if after <= before {
		t.Errorf("the CPU pod's deletion was not narrowed (%v -> %v): is SchedulerPreQueueingHints on?", before, after)
	}
	s.Delete("holder") // frees the device
	s.WaitBound(bindTimeout, "share")
}
