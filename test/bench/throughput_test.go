package bench

import (
	"context"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	configv1 "k8s.io/kube-scheduler/config/v1"
	"k8s.io/utils/ptr"

	"github.com/gpu-scheduler/gpu-scheduler/manifests"
	ourv1 "github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config/v1"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/fleet"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/localcp"
	"github.com/gpu-scheduler/gpu-scheduler/test/harness"
)

var (
	tpNodes   = flag.Int("nodes", 500, "nodes for the throughput benchmark")
	tpPods    = flag.Int("pods", 2000, "pods per variant")
	tpProfile = flag.String("pprof", "", "directory for CPU profiles of the schedulers under test")
	tpOnly    = flag.String("variants", "a,b,c,d", "which variants to run (e: the gpu mix on nodes running HAMi's device plugin; a2: the vanilla scheduler's (a) again, next to (b), for the spread of a ratio with no change)")
	tpWrite   = flag.String("assignment-write", "", "GPUFit assignmentWrite for gpu-scheduler (Bind, PreBind); empty: the shipped default")
	tpRounds  = flag.Int("rounds", 1, "run the variants this many times, interleaved (a b c d, then d c b a, ...: odd rounds reversed), and report means")
	tpWarmup  = flag.Bool("warmup", true, "run the first variant once, unrecorded, before measuring")
	tpProfSec = flag.Int("pprof-seconds", 0, "with -pprof: profile this many seconds from the scheduler's start (startup, resyncs and all); 0: from the first bind, for most of the run")
	tpMaxCPU  = flag.Float64("max-cpu-ratio", 0, "fail when gpu-scheduler's CPU seconds per pod exceed this multiple of the vanilla scheduler's in the same run (b/a, c/d); 0: no check")
)

// Throughput is one variant's result, as upstream's SchedulingThroughput
// (per-second samples of scheduled pods) plus the process's cost.
type Throughput struct {
	Variant    string  `json:"variant"`
	Scheduler  string  `json:"scheduler"`
	Workload   string  `json:"workload"`
	Nodes      int     `json:"nodes"`
	Pods       int     `json:"pods"`
	Average    float64 `json:"average_pods_per_s"`
	P50        float64 `json:"p50_pods_per_s"`
	P90        float64 `json:"p90_pods_per_s"`
	P99        float64 `json:"p99_pods_per_s"`
	Seconds    float64 `json:"seconds"`
	PeakRSSMiB float64 `json:"peak_rss_mib"`
	CPUSeconds float64 `json:"cpu_seconds"`
	// ControlPlaneCPU is kube-apiserver's and etcd's CPU seconds from just
	// before the scheduler starts to the end of the sampling (the last bind,
	// or 30 s without one): the same two cores serve them, so a scheduler
	// that makes them work more schedules fewer pods a second.
	ControlPlaneCPU float64 `json:"control_plane_cpu_seconds"`
	Unbound         int     `json:"unbound"`
}

// BenchmarkThroughput creates the nodes once, then for each variant submits
// the pods, starts the scheduler under test, and measures until all are
// bound: (a) vanilla kube-scheduler, CPU-only pods; (b) gpu-scheduler, the
// same pods; (c) gpu-scheduler, an openb-like mix of whole, shared and
// CPU-only pods; (d) vanilla, that mix with whole GPUs only; and, when
// asked for, (e) gpu-scheduler, the mix on as many nodes that run HAMi's
// device plugin (the fake one of the harness), its shares delivered: a node
// lock per bind, the device plugin's handshake, a recheck; and (a2), (a)
// again next to (b) (after it, before it in reversed rounds), a control:
// a2/a is a ratio with nothing changed.
func BenchmarkThroughput(b *testing.B) {
	ctx := context.Background()
	start := time.Now()
	createNodes(b, *tpNodes, false)
	if contains(*tpOnly, "e") {
		createNodes(b, *tpNodes, true)
	}
	b.Logf("%d nodes registered in %v", *tpNodes, time.Since(start).Round(time.Second))
	type variant struct{ key, sched, workload string }
	// a2, when asked for, is (a) again next to (b): vanilla against
	// itself in the same rounds, the spread a ratio shows with no change.
	all := []variant{{"a", "kube-scheduler", "cpu"}, {"b", "gpu-scheduler", "cpu"}, {"a2", "kube-scheduler", "cpu"},
		{"c", "gpu-scheduler", "gpu"}, {"d", "kube-scheduler", "gpu-whole"}, {"e", "gpu-scheduler", "gpu-hami"}}
	// Rounds interleave the variants, so that a slow spell of the shared
	// machine hits all of them; single runs of a ratio move by ±0.1 here.
	rounds := map[string][]*Throughput{}
	// The first pods a fresh apiserver and etcd take are faster than any
	// later ones (no history of earlier variants yet): without a warm-up
	// the first variant measured gets an edge (a at 208-217 pods/s first,
	// 165-175 later in the same runs).
	if *tpWarmup {
		for _, v := range all {
			if contains(*tpOnly, v.key) {
				if _, err := runThroughput(ctx, b, "warmup-"+v.key, v.sched, v.workload); err != nil {
					b.Fatalf("warm-up: %v", err)
				}
				break
			}
		}
	}
	for round := 0; round < max(*tpRounds, 1); round++ {
		// Odd rounds run the variants in reverse (a b a2 c d, then d c a2
		// b a, ...): what builds up in the control plane over a round
		// (etcd's history, the apiserver's heap) then weighs on each
		// variant from both sides, where a fixed order hands the later
		// variants of every round the same handicap. Pairs stay adjacent.
		// With an odd number of rounds the balance is partial (forward
		// twice in three), and the variant at a turn runs twice in a row.
		order := slices.Clone(all)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, v := range order {
			if !contains(*tpOnly, v.key) {
				continue
			}
			r, err := runThroughput(ctx, b, v.key, v.sched, v.workload)
			if err != nil {
				b.Fatalf("variant %s: %v", v.key, err)
			}
			rounds[v.key] = append(rounds[v.key], r)
		}
	}
	results := map[string]*Throughput{}
	for k, rs := range rounds {
		results[k] = meanThroughput(rs)
	}
	fmt.Printf("\nScheduling throughput: %d nodes, %d pods per variant (local kube-apiserver and etcd, 2 cores)\n", *tpNodes, *tpPods)
	if *tpRounds > 1 {
		fmt.Printf("means of %d interleaved rounds; peak RSS is the largest\n", *tpRounds)
	}
	fmt.Printf("%-3s %-15s %-10s %9s %7s %7s %7s %8s %10s %9s %9s\n", "", "scheduler", "workload", "avg pod/s", "p50", "p90", "p99", "seconds", "peak RSS", "CPU s", "ctl CPU s")
	for _, v := range all {
		r := results[v.key]
		if r == nil {
			continue
		}
		fmt.Printf("%-3s %-15s %-10s %9.1f %7.0f %7.0f %7.0f %8.1f %7.0fMiB %9.1f %9.1f\n", v.key, r.Scheduler, r.Workload, r.Average, r.P50, r.P90, r.P99, r.Seconds, r.PeakRSSMiB, r.CPUSeconds, r.ControlPlaneCPU)
	}
	out := map[string]any{}
	for k, r := range results {
		out[k] = r
	}
	var cpuFailures []string
	for _, pair := range [][2]string{{"b", "a"}, {"c", "d"}, {"e", "c"}, {"a2", "a"}, {"b", "a2"}} {
		ours, base := results[pair[0]], results[pair[1]]
		if ours == nil || base == nil {
			continue
		}
		name := pair[0] + "_" + pair[1]
		cpu := (ours.CPUSeconds / float64(ours.Pods)) / (base.CPUSeconds / float64(base.Pods))
		out["ratio_"+name] = ours.Average / base.Average
		out["rss_ratio_"+name] = ours.PeakRSSMiB / base.PeakRSSMiB
		out["cpu_ratio_"+name] = cpu
		fmt.Printf("%s/%s = %.3f (throughput), %.3f (CPU seconds per pod), %.2f (peak RSS)", pair[0], pair[1], ours.Average/base.Average, cpu, ours.PeakRSSMiB/base.PeakRSSMiB)
		if *tpMaxCPU > 0 && (name == "b_a" || name == "c_d") && cpu > *tpMaxCPU {
			cpuFailures = append(cpuFailures, fmt.Sprintf("%s/%s: CPU seconds per pod %.3f times the vanilla scheduler's, over the limit of %.2f", pair[0], pair[1], cpu, *tpMaxCPU))
		}
		if n := len(rounds[pair[0]]); n > 1 && len(rounds[pair[1]]) == n {
			per := make([]float64, n)
			for i := range per {
				per[i] = rounds[pair[0]][i].Average / rounds[pair[1]][i].Average
			}
			out["ratio_"+name+"_rounds"] = per
			fmt.Printf("; per round %s", fmtRatios(per))
		}
		fmt.Println()
	}
	if *jsonOut != "" {
		for k, v := range out {
			writeJSON(b, *jsonOut, k, v)
		}
	}
	for _, f := range cpuFailures {
		b.Error(f)
	}
}

// controlPlaneCPU is the CPU seconds kube-apiserver and etcd have used.
func controlPlaneCPU() float64 {
	if cluster.CP == nil {
		return 0
	}
	var s float64
	for _, p := range cluster.CP.Procs() {
		s += procCPU(p.Pid())
	}
	return s
}

// meanThroughput averages the rounds of one variant; peak RSS is the largest.
func meanThroughput(rs []*Throughput) *Throughput {
	m := *rs[0]
	if len(rs) == 1 {
		return &m
	}
	m.Average, m.P50, m.P90, m.P99, m.Seconds, m.CPUSeconds, m.ControlPlaneCPU, m.Unbound = 0, 0, 0, 0, 0, 0, 0, 0
	for _, r := range rs {
		n := float64(len(rs))
		m.Average += r.Average / n
		m.P50 += r.P50 / n
		m.P90 += r.P90 / n
		m.P99 += r.P99 / n
		m.Seconds += r.Seconds / n
		m.CPUSeconds += r.CPUSeconds / n
		m.ControlPlaneCPU += r.ControlPlaneCPU / n
		m.PeakRSSMiB = max(m.PeakRSSMiB, r.PeakRSSMiB)
		m.Unbound += r.Unbound
	}
	return &m
}

func fmtRatios(rs []float64) string {
	s := ""
	for i, r := range rs {
		if i > 0 {
			s += " "
		}
		s += fmt.Sprintf("%.3f", r)
	}
	return s
}

func contains(list, k string) bool {
	for _, x := range splitComma(list) {
		if x == k {
			return true
		}
	}
	return false
}

func splitComma(s string) []string {
	var out []string
	cur := ""
	for _, r := range s {
		if r == ',' {
			out = append(out, cur)
			cur = ""
		} else {
			cur += string(r)
		}
	}
	return append(out, cur)
}

// createNodes registers nodes with 8 GPUs each (a few models), Ready, with
// no kubelet, concurrently.
// hamiTaint keeps the other variants off the nodes of variant e.
var hamiTaint = v1.Taint{Key: "bench.gpu-scheduler.io/hami", Value: "true", Effect: v1.TaintEffectNoSchedule}

func createNodes(b *testing.B, n int, hami bool) {
	models := []string{"NVIDIA-A100-SXM4-80GB", "Tesla-T4", "NVIDIA-L4"}
	var wg sync.WaitGroup
	var failed atomic.Int32
	work := make(chan int)
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				nd := fleet.Node{Name: fmt.Sprintf("perf-%05d", i), CPU: "96", Memory: "768Gi", GPUs: 8,
					Model: models[i%len(models)], MemoryMiB: 81920}
				if hami {
					nd.Name, nd.HAMiSplit = fmt.Sprintf("hami-%05d", i), 10
					nd.Taints, nd.Labels = []v1.Taint{hamiTaint}, map[string]string{hamiTaint.Key: "true"}
				}
				if err := fleet.Create(context.Background(), cluster.Client, nd); err != nil {
					failed.Add(1)
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	if failed.Load() > 0 {
		b.Fatalf("%d nodes failed", failed.Load())
	}
}

// pods of a workload: cpu (100m, 500Mi, as scheduler_perf's default
// template), gpu (the openb mix: 13% CPU-only, 38% a share of one GPU, 48%
// one GPU, 1% 2/4/8 GPUs), gpu-whole (the same, shares as whole GPUs),
// gpu-hami (the same, on HAMi's nodes: shares ask for one device plugin
// slot, and are delivered).
func workloadPod(kind string, i int, rng *rand.Rand, ns, schedulerName string) *v1.Pod {
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%06d", i), Namespace: ns, Annotations: map[string]string{}},
		Spec: v1.PodSpec{SchedulerName: schedulerName, Containers: []v1.Container{{Name: "c", Image: "pause",
			Resources: v1.ResourceRequirements{Requests: v1.ResourceList{
				v1.ResourceCPU: resource.MustParse("100m"), v1.ResourceMemory: resource.MustParse("500Mi")}}}}},
	}
	if kind == "cpu" {
		return p
	}
	c := &p.Spec.Containers[0]
	if kind == "gpu-hami" {
		p.Spec.NodeSelector = map[string]string{hamiTaint.Key: "true"}
		p.Spec.Tolerations = []v1.Toleration{{Key: hamiTaint.Key, Operator: v1.TolerationOpEqual, Value: "true", Effect: v1.TaintEffectNoSchedule}}
	}
	whole := func(n int64) {
		q := *resource.NewQuantity(n, resource.DecimalSI)
		c.Resources.Requests[gpu.ResourceNvidiaGPU] = q
		c.Resources.Limits = v1.ResourceList{gpu.ResourceNvidiaGPU: q}
	}
	c.Resources.Requests[v1.ResourceCPU] = *resource.NewMilliQuantity(int64(1000+rng.Intn(8000)), resource.DecimalSI)
	switch x := rng.Intn(100); {
	case x < 13:
	case x < 51:
		switch kind {
		case "gpu-whole":
			whole(1)
		case "gpu-hami":
			whole(1) // the slot
			p.Annotations[gpu.AnnotationMilli] = fmt.Sprint([]int{810, 470, 320, 650, 230, 500}[rng.Intn(6)])
		default:
			p.Annotations[gpu.AnnotationMilli] = fmt.Sprint([]int{810, 470, 320, 650, 230, 500}[rng.Intn(6)])
		}
	case x < 99:
		whole(1)
	default:
		whole([]int64{2, 4, 8}[rng.Intn(3)])
	}
	return p
}

func runThroughput(ctx context.Context, b *testing.B, key, schedBin, workload string) (*Throughput, error) {
	ns := "tp-" + key
	client := cluster.Client
	client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	schedulerName := "tp-" + key
	rng := rand.New(rand.NewSource(1))
	var pods []*v1.Pod
	for i := 0; i < *tpPods; i++ {
		pods = append(pods, workloadPod(workload, i, rng, ns, schedulerName))
	}
	if err := createPods(ctx, pods); err != nil {
		return nil, err
	}

	// Count binds per second from the informer.
	var bound atomic.Int64
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns))
	inf := f.Core().V1().Pods().Informer()
	seen := sync.Map{}
	inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj interface{}) {
			if p := obj.(*v1.Pod); p.Spec.NodeName != "" {
				if _, dup := seen.LoadOrStore(p.Name, true); !dup {
					bound.Add(1)
				}
			}
		},
		UpdateFunc: func(_, obj interface{}) {
			if p := obj.(*v1.Pod); p.Spec.NodeName != "" {
				if _, dup := seen.LoadOrStore(p.Name, true); !dup {
					bound.Add(1)
				}
			}
		},
	})
	stop := make(chan struct{})
	defer close(stop)
	f.Start(stop)
	f.WaitForCacheSync(stop)

	cp0 := controlPlaneCPU()
	sched, err := startUnderTest(ctx, schedBin, schedulerName)
	if err != nil {
		return nil, err
	}
	defer sched.Stop(10 * time.Second)
	var profDone chan struct{}
	sampled := make(chan struct{})
	if *tpProfile != "" {
		profDone = make(chan struct{})
		go func() {
			defer close(profDone)
			secs := *tpProfSec
			if secs <= 0 {
				// Start once scheduling is under way, for most of the run.
				for bound.Load() == 0 {
					select {
					case <-sampled:
						return // nothing bound
					case <-time.After(50 * time.Millisecond):
					}
				}
				secs = max(2, int(float64(*tpPods)/400))
			}
			code, body, err := sched.GetWithin(context.Background(), fmt.Sprintf("/debug/pprof/profile?seconds=%d", secs), time.Duration(secs+30)*time.Second)
			if err != nil || code != 200 {
				b.Logf("variant %s: CPU profile: %d %v", key, code, err)
			} else {
				os.MkdirAll(*tpProfile, 0o755)
				os.WriteFile(filepath.Join(*tpProfile, fmt.Sprintf("cpu-%s-%s.pprof", key, schedBin)), []byte(body), 0o644)
			}
		}()
	}
	// When the peak RSS is reached: at start (informers' lists), or while
	// scheduling.
	var atFirstBind, lastGrew atomic.Value
	go func() {
		t0, peak, midHeap := time.Now(), 0.0, false
		for {
			select {
			case <-sampled:
				return
			case <-time.After(250 * time.Millisecond):
			}
			if p := procPeakRSS(sched.Pid()); p > peak {
				peak = p
				lastGrew.Store(time.Since(t0).Round(time.Second))
			}
			if bound.Load() > 0 && atFirstBind.Load() == nil {
				atFirstBind.Store(peak)
			}
			if *tpProfile != "" && !midHeap && bound.Load() >= int64(*tpPods)/2 {
				// What is live halfway, when the queue still holds half
				// the pods (the end's profile sees an idle scheduler).
				midHeap = true
				if code, body, err := sched.GetWithin(context.Background(), "/debug/pprof/heap", time.Minute); err == nil && code == 200 {
					os.MkdirAll(*tpProfile, 0o755)
					os.WriteFile(filepath.Join(*tpProfile, fmt.Sprintf("heap-mid-%s-%s.pprof", key, schedBin)), []byte(body), 0o644)
				}
			}
		}
	}()
	// CPU is read at the last second that bound a pod: a run that leaves
	// pods unbound waits 30 idle seconds, which are not the run's work.
	var schedCPU, cpCPU float64
	samples, elapsed := sampleBinds(&bound, *tpPods, 30*time.Minute, time.Now().Add(30*time.Minute), func() {
		schedCPU, cpCPU = procCPU(sched.Pid()), controlPlaneCPU()-cp0
	})
	close(sampled)
	if profDone != nil {
		<-profDone
	}
	res := &Throughput{Variant: key, Scheduler: schedBin, Workload: workload, Nodes: *tpNodes, Pods: *tpPods,
		Seconds: elapsed.Seconds(), PeakRSSMiB: procPeakRSS(sched.Pid()), CPUSeconds: schedCPU,
		ControlPlaneCPU: cpCPU, Unbound: *tpPods - int(bound.Load())}
	res.Average = float64(bound.Load()) / elapsed.Seconds()
	sorted := append([]float64(nil), samples...)
	sort.Float64s(sorted)
	res.P50, res.P90, res.P99 = percentile(sorted, 50), percentile(sorted, 90), percentile(sorted, 99)
	// Each run's figures on stdout: a benchmark's log keeps 10 lines.
	fmt.Printf("run %-9s %5d bound in %8v  %6.1f pods/s  CPU %5.1f s  control plane %5.1f s  peak RSS %4.0f MiB\n",
		key, bound.Load(), elapsed.Round(time.Millisecond), res.Average, res.CPUSeconds, cpCPU, res.PeakRSSMiB)
	b.Logf("%s: %d bound in %v; samples %v", key, bound.Load(), elapsed.Round(time.Millisecond), samples)
	b.Logf("%s: peak RSS %.0f MiB, %v MiB at the first bind, last grown %v after the scheduler was up", key, res.PeakRSSMiB, atFirstBind.Load(), lastGrew.Load())
	// How the binds spread over nodes: on HAMi's nodes, binds on one node
	// go one at a time (the node lock).
	perNode := map[string]int{}
	var unbound []string
	for _, o := range inf.GetStore().List() {
		if p := o.(*v1.Pod); p.Spec.NodeName != "" {
			perNode[p.Spec.NodeName]++
		} else if len(unbound) < 5 {
			why := "no PodScheduled condition"
			for _, c := range p.Status.Conditions {
				if c.Type == v1.PodScheduled {
					why = c.Reason + ": " + c.Message
				}
			}
			unbound = append(unbound, fmt.Sprintf("%s (%s, GPU %s, milli %q): %s", p.Name, p.Spec.Containers[0].Resources.Requests.Cpu(),
				p.Spec.Containers[0].Resources.Requests.Name(gpu.ResourceNvidiaGPU, resource.DecimalSI), p.Annotations[gpu.AnnotationMilli], why))
		}
	}
	for _, u := range unbound {
		fmt.Printf("run %-9s unbound: %s\n", key, u)
	}
	most := 0
	for _, n := range perNode {
		most = max(most, n)
	}
	b.Logf("%s: on %d nodes, at most %d on one", key, len(perNode), most)

	if *tpProfile != "" {
		// Allocations since the start, to see what each pod costs.
		if code, body, err := sched.GetWithin(ctx, "/debug/pprof/allocs", time.Minute); err == nil && code == 200 {
			os.WriteFile(filepath.Join(*tpProfile, fmt.Sprintf("allocs-%s-%s.pprof", key, schedBin)), []byte(body), 0o644)
		} else {
			b.Logf("variant %s: allocs profile: %d %v", key, code, err)
		}
	}

	// Clean up, so that the next variant meets empty nodes and a scheduler
	// cache of the same size.
	sched.Stop(10 * time.Second)
	if err := deleteAllPods(ctx, ns); err != nil {
		return nil, fmt.Errorf("variant %s: %w", key, err)
	}
	// The scheduler's events (one per pod bound) live an hour: 10,000 a
	// run would pile up in etcd over a set.
	if err := client.CoreV1().Events(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		b.Logf("variant %s: events not deleted: %v", key, err)
	}
	return res, nil
}

// sampleBinds counts binds per second, from the first bind to the last: it
// waits up to firstWithin for the first, then samples until want are bound,
// 30 seconds pass with none, or the deadline. The trailing idle seconds and
// the last partial second are dropped. Nothing bound: no samples.
// progress, if not nil, runs at each second that bound a pod.
func sampleBinds(bound *atomic.Int64, want int, firstWithin time.Duration, deadline time.Time, progress func()) ([]float64, time.Duration) {
	for start := time.Now(); bound.Load() == 0 && time.Since(start) < firstWithin; {
		time.Sleep(10 * time.Millisecond)
	}
	if bound.Load() == 0 {
		return nil, 0
	}
	var samples []float64
	var last int64
	t0 := time.Now()
	tick := time.NewTicker(time.Second)
	idle := 0
	for now := range tick.C {
		n := bound.Load()
		samples = append(samples, float64(n-last))
		if n == last {
			idle++
		} else {
			idle = 0
			if progress != nil {
				progress()
			}
		}
		last = n
		if n >= int64(want) || idle >= 30 || now.After(deadline) {
			break
		}
	}
	tick.Stop()
	elapsed := time.Since(t0)
	for len(samples) > 1 && samples[len(samples)-1] == 0 {
		samples = samples[:len(samples)-1]
		elapsed -= time.Second
	}
	return samples, elapsed
}

// deleteAllPods deletes a namespace's pods and waits until they are gone. A
// DeleteCollection of thousands of pods can end at the request timeout with
// only part deleted, so it is repeated.
func deleteAllPods(ctx context.Context, ns string) error {
	err := wait.PollUntilContextTimeout(ctx, time.Second, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods := cluster.Client.CoreV1().Pods(ns)
		pods.DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, metav1.ListOptions{})
		l, err := pods.List(ctx, metav1.ListOptions{Limit: 1})
		return err == nil && len(l.Items) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("pods of %s not deleted: %w", ns, err)
	}
	return nil
}

func createPods(ctx context.Context, pods []*v1.Pod) error {
	var wg sync.WaitGroup
	var firstErr atomic.Value
	work := make(chan *v1.Pod)
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := range work {
				if _, err := cluster.Client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
					firstErr.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	for _, p := range pods {
		work <- p
	}
	close(work)
	wg.Wait()
	if e, ok := firstErr.Load().(error); ok {
		return e
	}
	return nil
}

// startUnderTest runs a scheduler with one profile for the variant's pods,
// leader election off and client QPS raised as scheduler_perf does.
func startUnderTest(ctx context.Context, bin, schedulerName string) (*localcp.Scheduler, error) {
	var cfg []byte
	user := localcp.UserKubeScheduler
	if bin == "gpu-scheduler" {
		cfg = manifests.SchedulerConfig
		user = localcp.UserGPUScheduler
	} else {
		cfg = []byte("apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nprofiles:\n- schedulerName: default-scheduler\n")
	}
	kc, err := cluster.CP.WriteKubeconfig(user, filepath.Join(cluster.Dir, schedulerName+".kubeconfig"))
	if err != nil {
		return nil, err
	}
	var env []string
	schedCPUs, _ := pinCPUs()
	if *pin {
		if err := pinControlPlane(); err != nil {
			return nil, err
		}
		env = append(env, fmt.Sprintf("GOMAXPROCS=%d", len(schedCPUs)))
	}
	env = append(env, tpEnv...)
	s, err := localcp.StartScheduler(ctx, localcp.SchedulerOptions{
		Name: schedulerName, Binary: filepath.Join(harness.BinDir(), bin), Config: cfg, Kubeconfig: kc, Dir: cluster.Dir,
		Args: []string{"--v=1"}, Env: env,
		Mutate: func(c *configv1.KubeSchedulerConfiguration) {
			c.Profiles[0].SchedulerName = ptr.To(schedulerName)
			c.LeaderElection.LeaderElect = ptr.To(false)
			// The bench's shares are on nodes without a device agent.
			harness.AccountingOnlySharing(c)
			if *tpWrite != "" {
				for i := range c.Profiles[0].PluginConfig {
					if a, ok := c.Profiles[0].PluginConfig[i].Args.Object.(*ourv1.GPUFitArgs); ok {
						a.AssignmentWrite = ptr.To(*tpWrite)
					}
				}
			}
		},
	})
	if err != nil {
		return nil, err
	}
	s.Token = cluster.CP.Token(localcp.UserAdmin)
	if *pin {
		if err := pinProcess(s.Pid(), schedCPUs); err != nil {
			s.Stop(10 * time.Second)
			return nil, err
		}
	}
	if *cpuQuota > 0 {
		remove, err := capCPU(s.Pid(), *cpuQuota)
		if err != nil {
			s.Stop(10 * time.Second)
			return nil, err
		}
		go func() { <-s.Done(); remove() }()
	}
	return s, s.WaitHealthy(ctx, 2*time.Minute)
}
