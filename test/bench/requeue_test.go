// Package bench holds the benchmarks that need a real control plane:
// requeue latency and cost (make bench-requeue) and scheduling throughput
// (make bench-throughput). They print tables and, with -json FILE, write
// the figures; they assert nothing about time.
package bench

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	configv1 "k8s.io/kube-scheduler/config/v1"
	"k8s.io/utils/ptr"

	ourv1 "github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config/v1"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/fleet"
	"github.com/gpu-scheduler/gpu-scheduler/test/harness"
)

var (
	jsonOut = flag.String("json", "", "write the results as JSON to this file")
	trials  = flag.Int("trials", 40, "deletions per variant")
	// Under churn the active queue is busy, so the queue no longer pops
	// backing-off pods early and the requeue path is what decides.
	rqChurn   = flag.Bool("requeue-churn", true, "also measure each variant under churn")
	rqBacklog = flag.Int("requeue-backlog", 2000, "GPU pods that fit nowhere, pending during the churn runs")
	rqOnly    = flag.String("requeue-variants", "", "comma-separated variants to run (full, no-hints, no-reconciler, baseline); all when empty")
	rqStream  = flag.Int("requeue-stream", 100, "CPU pods per second created through the scheduler (and deleted 3 s later) during the churn runs")
	cluster   *harness.Cluster
)

func TestMain(m *testing.M) {
	if kc := os.Getenv(floorEnv); kc != "" {
		// Run again as the floor process (floor_test.go).
		if err := informerFloorMain(kc); err != nil {
			fmt.Fprintln(os.Stderr, "informer floor:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	flag.Parse()
	ctx, cancel := context.WithCancel(context.Background())
	var err error
	cluster, err = harness.Setup(ctx, "")
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench setup:", err)
		os.Exit(1)
	}
	code := m.Run()
	cancel()
	cluster.Teardown()
	os.Exit(code)
}

// gpuFitArgs edits GPUFit's args in a rendered configuration. The bench's
// shares are on nodes without a device agent: accounting only.
func gpuFitArgs(cfg *configv1.KubeSchedulerConfiguration, edit func(*ourv1.RequeueArgs)) {
	harness.AccountingOnlySharing(cfg)
	for i := range cfg.Profiles[0].PluginConfig {
		if a, ok := cfg.Profiles[0].PluginConfig[i].Args.Object.(*ourv1.GPUFitArgs); ok {
			if a.Requeue == nil {
				a.Requeue = &ourv1.RequeueArgs{}
			}
			edit(a.Requeue)
		}
	}
}

type variant struct {
	Key        string `json:"-"`
	Hints      bool   `json:"queueing_hints"`
	Reconciler bool   `json:"reconciler"`
}

// LatencyStats is one variant's requeue latency.
type LatencyStats struct {
	variant
	N     int     `json:"trials"`
	P50ms float64 `json:"p50"`
	P99ms float64 `json:"p99"`
	MaxMs float64 `json:"max"`
	Lost  int     `json:"timeouts"`
	Churn bool    `json:"churn"`
	// Scheduling attempts per second while the trials ran: what the
	// requeue path costs the scheduler (under churn, mostly the backlog
	// being woken).
	AttemptsPerS float64 `json:"attempts_per_s"`
	// CPU pods of the churn stream bound per second during the trials.
	StreamPerS float64 `json:"stream_bound_per_s,omitempty"`
	AllMs      []int64 `json:"latencies_ms"`
	Unit       string  `json:"unit"`
	Sample     string  `json:"-"`
}

func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	// Nearest rank.
	i := int(p/100*float64(len(sorted))+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// BenchmarkRequeueLatency fills a fleet with shared pods (one 600m share per
// device), leaves 50 pods of 600m pending, then deletes bound pods one at a
// time and measures from each deletion to the next bind, for the full design
// and without hints, without the reconciler, and without both.
func BenchmarkRequeueLatency(b *testing.B) {
	variants := []variant{
		{"full", true, true},
		{"no-hints", false, true},
		{"no-reconciler", true, false},
		{"baseline", false, false},
	}
	modes := []bool{false}
	if *rqChurn {
		modes = append(modes, true)
	}
	results := map[string]*LatencyStats{}
	var keys []string
	for _, churn := range modes {
		for _, v := range variants {
			if *rqOnly != "" && !strings.Contains(","+*rqOnly+",", ","+v.Key+",") {
				continue
			}
			st, err := runLatency(b, v, *trials, churn)
			if err != nil {
				b.Fatalf("%s churn=%v: %v", v.Key, churn, err)
			}
			key := v.Key
			if churn {
				key += "-churn"
			}
			results[key] = st
			keys = append(keys, key)
		}
	}
	fmt.Printf("\nRequeue latency: deletion of a bound pod -> next bind of a pending pod (up to %d trials, one per filled device; 50 pending, 32 devices)\n", *trials)
	if *rqChurn {
		fmt.Printf("churn: %d pending GPU pods that fit nowhere, %d CPU pods/s scheduled and deleted 3 s later\n", *rqBacklog, *rqStream)
	}
	fmt.Printf("%-20s %6s %11s %6s %9s %9s %9s %8s %11s %11s %12s\n", "variant", "hints", "reconciler", "n", "p50 ms", "p99 ms", "max ms", "timeouts", "attempts/s", "stream/s", "p99/baseline")
	for _, k := range keys {
		r := results[k]
		if r == nil {
			continue
		}
		base := results[strings.Replace(k, r.Key, "baseline", 1)]
		ratio := 0.0
		if base != nil && base.P99ms > 0 {
			ratio = r.P99ms / base.P99ms
		}
		fmt.Printf("%-20s %6v %11v %6d %9.1f %9.1f %9.1f %8d %11.1f %11.1f %12.2f\n", k, r.Hints, r.Reconciler, r.N, r.P50ms, r.P99ms, r.MaxMs, r.Lost, r.AttemptsPerS, r.StreamPerS, ratio)
	}
	if *jsonOut != "" {
		for k, v := range results {
			writeJSON(b, *jsonOut, k, v)
		}
	}
}

func writeJSON(b testing.TB, path, key string, v any) {
	all := map[string]any{}
	if data, err := os.ReadFile(path); err == nil {
		json.Unmarshal(data, &all)
	}
	all[key] = v
	data, err := json.MarshalIndent(all, "", "  ")
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		b.Fatal(err)
	}
}

func runLatency(b *testing.B, v variant, trials int, churn bool) (*LatencyStats, error) {
	ctx := context.Background()
	profile := "bench-" + v.Key
	if churn {
		profile += "-churn"
	}
	sched, err := harness.StartProfile(ctx, cluster, filepath.Join(harness.BinDir(), "gpu-scheduler"), profile, nil,
		func(cfg *configv1.KubeSchedulerConfiguration) {
			gpuFitArgs(cfg, func(r *ourv1.RequeueArgs) {
				r.Enabled = ptr.To(v.Reconciler)
				r.QueueingHints = ptr.To(v.Hints)
			})
		})
	if err != nil {
		return nil, err
	}
	defer sched.Stop(5 * time.Second)
	s := cluster.NewScope(b)
	var nodes []fleet.Node
	for i := 0; i < 4; i++ {
		nodes = append(nodes, fleet.Node{Name: fmt.Sprintf("n%d", i), CPU: "128", Memory: "1Ti", GPUs: 8, Model: "NVIDIA-A100-SXM4-80GB", MemoryMiB: 81920})
	}
	s.AddNodes(nodes...)

	// Watch binds as they happen.
	var streamBound atomic.Int64
	var mu sync.Mutex
	boundAt := map[string]time.Time{}
	f := informers.NewSharedInformerFactoryWithOptions(cluster.Client, 0, informers.WithNamespace(s.NS))
	inf := f.Core().V1().Pods().Informer()
	inf.AddEventHandler(cache.ResourceEventHandlerFuncs{UpdateFunc: func(old, obj interface{}) {
		p := obj.(*v1.Pod)
		if p.Spec.NodeName != "" {
			if strings.HasPrefix(p.Name, "stream-") {
				if _, ok := old.(*v1.Pod); ok && old.(*v1.Pod).Spec.NodeName == "" {
					streamBound.Add(1)
				}
				return
			}
			mu.Lock()
			if _, ok := boundAt[p.Name]; !ok {
				boundAt[p.Name] = time.Now()
			}
			mu.Unlock()
		}
	}})
	stop := make(chan struct{})
	defer close(stop)
	f.Start(stop)
	f.WaitForCacheSync(stop)

	var filled []string
	for i := 0; i < 32; i++ {
		name := fmt.Sprintf("fill-%02d", i)
		s.Create(s.Pod(harness.PodSpec{Name: name, Milli: 600, Scheduler: profile}))
		filled = append(filled, name)
	}
	s.WaitBound(time.Minute, filled...)
	var pending []string
	for i := 0; i < 50; i++ {
		name := fmt.Sprintf("wait-%02d", i)
		s.Create(s.Pod(harness.PodSpec{Name: name, Milli: 600, Scheduler: profile}))
		pending = append(pending, name)
	}
	for _, p := range pending {
		s.WaitUnschedulable(time.Minute, p)
	}
	countBound := func() (int, time.Time) {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		var last time.Time
		for _, p := range pending {
			if t, ok := boundAt[p]; ok {
				n++
				if t.After(last) {
					last = t
				}
			}
		}
		return n, last
	}
	st := &LatencyStats{variant: v, Unit: "ms", Churn: churn}
	if churn {
		stopChurn, err := requeueChurn(ctx, b, s, profile)
		if err != nil {
			return nil, err
		}
		defer stopChurn()
	}
	attempts0 := scrape(ctx, sched).sum("scheduler_schedule_attempts_total")
	if *tpProfile != "" {
		go func() {
			code, body, err := sched.GetWithin(context.Background(), "/debug/pprof/profile?seconds=20", time.Minute)
			if err != nil || code != 200 {
				b.Logf("%s: CPU profile: %d %v", profile, code, err)
				return
			}
			os.MkdirAll(*tpProfile, 0o755)
			os.WriteFile(filepath.Join(*tpProfile, "cpu-"+profile+".pprof"), []byte(body), 0o644)
		}()
	}
	stream0 := streamBound.Load()
	began := time.Now()
	var lat []float64
	for i := 0; i < trials && i < len(filled) && i < len(pending); i++ {
		before, _ := countBound()
		t0 := time.Now()
		s.Delete(filled[i])
		var at time.Time
		err := wait.PollUntilContextTimeout(ctx, 2*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
			n, last := countBound()
			at = last
			return n > before, nil
		})
		if err != nil {
			st.Lost++
			continue
		}
		d := at.Sub(t0)
		lat = append(lat, float64(d.Microseconds())/1000)
		st.AllMs = append(st.AllMs, d.Milliseconds())
		time.Sleep(300 * time.Millisecond)
	}
	window := time.Since(began).Seconds()
	st.AttemptsPerS = (scrape(ctx, sched).sum("scheduler_schedule_attempts_total") - attempts0) / window
	st.StreamPerS = float64(streamBound.Load()-stream0) / window
	sort.Float64s(lat)
	st.N = len(lat)
	st.P50ms, st.P99ms = percentile(lat, 50), percentile(lat, 99)
	if len(lat) > 0 {
		st.MaxMs = lat[len(lat)-1]
	}
	b.Logf("%s: %v", v.Key, st.AllMs)
	return st, nil
}

// BenchmarkReconcilerCost runs 1000 GPU nodes and 5000 pending GPU pods that
// fit nowhere, with and without the reconciler, and reports the scheduler
// process's CPU seconds over the same steady window, and its peak RSS.
func BenchmarkReconcilerCost(b *testing.B) {
	window := 90 * time.Second
	if w := os.Getenv("COST_WINDOW"); w != "" {
		if d, err := time.ParseDuration(w); err == nil {
			window = d
		}
	}
	s := cluster.NewScope(b)
	var nodes []fleet.Node
	for i := 0; i < 1000; i++ {
		nodes = append(nodes, fleet.Node{Name: fmt.Sprintf("n%04d", i), CPU: "64", Memory: "512Gi", GPUs: 8, Model: "Tesla-T4", MemoryMiB: 15360})
	}
	s.AddNodes(nodes...)
	type cost struct {
		Reconciler   bool    `json:"reconciler"`
		CPUSeconds   float64 `json:"cpu_seconds_in_window"`
		CPUFraction  float64 `json:"cpu_cores_average"`
		PeakRSSMiB   float64 `json:"peak_rss_mib"`
		WindowSec    float64 `json:"window_seconds"`
		PendingPods  int     `json:"pending_pods"`
		Nodes        int     `json:"nodes"`
		ReasonWrites float64 `json:"pending_reason_writes"`
		Reconciles   float64 `json:"reconciles_total"`
	}
	var out []cost
	for _, rec := range []bool{true, false} {
		profile := fmt.Sprintf("cost-%v", rec)
		sched, err := harness.StartProfile(context.Background(), cluster, filepath.Join(harness.BinDir(), "gpu-scheduler"), profile, nil,
			func(cfg *configv1.KubeSchedulerConfiguration) {
				gpuFitArgs(cfg, func(r *ourv1.RequeueArgs) { r.Enabled = ptr.To(rec) })
			})
		if err != nil {
			b.Fatal(err)
		}
		ns := fmt.Sprintf("%s-%v", s.NS, rec)
		cluster.Client.CoreV1().Namespaces().Create(context.Background(), &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		// Pods that want an H100: none exists, every reconcile checks every node.
		for i := 0; i < 5000; i++ {
			p := s.Pod(harness.PodSpec{Name: fmt.Sprintf("p%04d", i), GPUs: 1, Model: "NVIDIA-H100-80GB-HBM3", Scheduler: profile})
			p.Namespace = ns
			if _, err := cluster.Client.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
		}
		// Let the scheduler try them all once, then measure the steady state.
		wait.PollUntilContextTimeout(context.Background(), time.Second, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
			list, _ := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			n := 0
			for i := range list.Items {
				if harness.Unschedulable(&list.Items[i]) != "" {
					n++
				}
			}
			return n == 5000, nil
		})
		time.Sleep(40 * time.Second) // past the first resync and its writes
		c0 := procCPU(sched.Pid())
		time.Sleep(window)
		c1 := procCPU(sched.Pid())
		writes, _ := sched.Metric(context.Background(), "gpu_scheduler_pending_reason_writes_total")
		recs, _ := sched.Metric(context.Background(), `gpu_scheduler_requeue_reconciles_total{result="pending"}`)
		c := cost{Reconciler: rec, CPUSeconds: c1 - c0, CPUFraction: (c1 - c0) / window.Seconds(), PeakRSSMiB: procPeakRSS(sched.Pid()),
			WindowSec: window.Seconds(), PendingPods: 5000, Nodes: 1000, ReasonWrites: atof(writes), Reconciles: atof(recs)}
		out = append(out, c)
		sched.Stop(5 * time.Second)
		if err := deleteAllPods(context.Background(), ns); err != nil {
			b.Fatal(err)
		}
	}
	fmt.Printf("\nReconciler cost: 1000 nodes, 5000 pending GPU pods that fit nowhere, resync 30s, %v window\n", window)
	fmt.Printf("%-11s %14s %12s %13s %15s %12s\n", "reconciler", "CPU s/window", "cores avg", "peak RSS MiB", "reason writes", "reconciles")
	for _, c := range out {
		fmt.Printf("%-11v %14.2f %12.3f %13.0f %15.0f %12.0f\n", c.Reconciler, c.CPUSeconds, c.CPUFraction, c.PeakRSSMiB, c.ReasonWrites, c.Reconciles)
	}
	if *jsonOut != "" {
		writeJSON(b, *jsonOut, "reconciler_cost", out)
	}
}

func atof(s string) float64 {
	var f float64
	fmt.Sscan(s, &f)
	return f
}

// procCPU is a process's user+system CPU seconds.
func procCPU(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command name (which may contain spaces).
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	var ut, st float64
	fmt.Sscan(f[11], &ut)
	fmt.Sscan(f[12], &st)
	return (ut + st) / 100 // USER_HZ
}

// procPeakRSS is a process's peak resident memory (VmHWM), in MiB.
func procPeakRSS(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			var kb float64
			fmt.Sscan(strings.TrimSpace(strings.TrimPrefix(line, "VmHWM:")), &kb)
			return kb / 1024
		}
	}
	return 0
}

// requeueChurn puts a backlog of GPU pods that fit nowhere in the scheduler's
// queue and streams CPU pods through it (each deleted 3 s after it was
// created), so the active queue is busy and bound pods come and go while
// the trials run. It returns once the backlog was tried.
func requeueChurn(ctx context.Context, b *testing.B, s *harness.Scope, profile string) (func(), error) {
	var backlog []*v1.Pod
	for i := 0; i < *rqBacklog; i++ {
		backlog = append(backlog, s.Pod(harness.PodSpec{Name: fmt.Sprintf("backlog-%05d", i), GPUs: 1, Model: "NVIDIA-H100-80GB-HBM3", Scheduler: profile}))
	}
	t0 := time.Now()
	if err := createPods(ctx, backlog); err != nil {
		return nil, err
	}
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := cluster.Client.CoreV1().Pods(s.NS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		n := 0
		for i := range list.Items {
			if strings.HasPrefix(list.Items[i].Name, "backlog-") && harness.Unschedulable(&list.Items[i]) != "" {
				n++
			}
		}
		return n == *rqBacklog, nil
	})
	if err != nil {
		return nil, fmt.Errorf("backlog not tried: %w", err)
	}
	b.Logf("%s: %d backlog pods unschedulable after %v", profile, *rqBacklog, time.Since(t0).Round(time.Second))
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if *rqStream <= 0 {
			return
		}
		tick := time.NewTicker(time.Second / time.Duration(*rqStream))
		defer tick.Stop()
		var alive []string
		for i := 0; ; i++ {
			select {
			case <-cctx.Done():
				return
			case <-tick.C:
			}
			p := s.Pod(harness.PodSpec{Name: fmt.Sprintf("stream-%07d", i), Scheduler: profile})
			var victim string
			alive = append(alive, p.Name)
			if len(alive) > 3**rqStream {
				victim, alive = alive[0], alive[1:]
			}
			go func() {
				cluster.Client.CoreV1().Pods(s.NS).Create(cctx, p, metav1.CreateOptions{})
				if victim != "" {
					cluster.Client.CoreV1().Pods(s.NS).Delete(cctx, victim, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
				}
			}()
		}
	}()
	time.Sleep(10 * time.Second) // the stream at its rate before the trials
	return func() {
		cancel()
		<-done
		if err := deleteAllPods(ctx, s.NS); err != nil {
			b.Log(err)
		}
	}, nil
}
