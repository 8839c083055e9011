package bench

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"maps"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/localcp"
)

var (
	chBacklog     = flag.Int("backlog", 20000, "pending GPU pods that fit nowhere (churn runs)")
	chStream      = flag.Int("stream", 5000, "GPU pods that fit, submitted at once; their binds are measured")
	chCPUChurn    = flag.Int("cpu-churn", 50, "CPU pods created and deleted per second (churn runs)")
	chLabelPeriod = flag.Duration("label-period", 60*time.Second, "every node's GFD timestamp label is rewritten once per period (churn runs); 0: never")
	chSchedulers  = flag.String("schedulers", "gpu-scheduler,kube-scheduler", "schedulers to measure, each quiet and under churn")
	chMaxWait     = flag.Duration("max-wait", 5*time.Minute, "give up on the stream if nothing is bound this long after it was submitted")
)

// Churn is one run of BenchmarkChurn.
type Churn struct {
	Scheduler string  `json:"scheduler"`
	Churn     bool    `json:"churn"`
	Nodes     int     `json:"nodes"`
	Backlog   int     `json:"backlog"`
	Stream    int     `json:"stream"`
	Average   float64 `json:"average_pods_per_s"`
	P50       float64 `json:"p50_pods_per_s"`
	P99       float64 `json:"p99_pods_per_s"`
	Seconds   float64 `json:"seconds"`
	Unbound   int     `json:"unbound"`
	// The scheduler process while the stream ran.
	CPUSeconds float64 `json:"cpu_seconds"`
	PeakRSSMiB float64 `json:"peak_rss_mib"`
	// Requests the scheduler sent to the API server, per second.
	APIRequestsPerS float64 `json:"api_requests_per_s"`
	// Queueing hints of our plugins: calls per second and mean time per
	// call (the scheduler's own histogram; one call is one pending pod for
	// one event).
	HintCallsPerS float64 `json:"hint_calls_per_s,omitempty"`
	HintMeanUs    float64 `json:"hint_mean_us,omitempty"`
	// Bound-pod events for which GPUFit's PreQueueingHint named the pods to
	// visit, against those where every pod was visited.
	NarrowedPerS float64 `json:"narrowed_events_per_s,omitempty"`
	AllPodsPerS  float64 `json:"all_pods_events_per_s,omitempty"`
	// The requeue reconciler since the scheduler started: passes and their
	// mean duration; its work queue when the stream was bound; reason
	// writes per second during the stream.
	Passes          float64 `json:"reconciler_passes,omitempty"`
	PassMeanSeconds float64 `json:"reconciler_pass_mean_s,omitempty"`
	QueueDepth      float64 `json:"reconciler_queue_depth_at_end"`
	ReasonWritesPS  float64 `json:"reason_writes_per_s,omitempty"`
	// The churn the run was under, as sent.
	LabelUpdatesPS float64 `json:"label_updates_per_s,omitempty"`
	CPUPodOpsPS    float64 `json:"cpu_pod_ops_per_s,omitempty"`
	// The other processes on the machine (API server, etcd, the bench with
	// its fake kubelet and churn), CPU seconds while the stream ran; and
	// whether the scheduler had a CPU of its own (-pin).
	OthersCPUSeconds map[string]float64 `json:"others_cpu_seconds"`
	// The scheduler's CPU (cores) under the churn before the stream: what
	// the churn alone costs it.
	ChurnOnlyCores float64 `json:"churn_only_cores,omitempty"`
	// With -floor: the same for a process that keeps only the scheduler's
	// pod and node informers (no plugins, handlers that do nothing): what any scheduler
	// built on them pays to follow the churn; and that process's peak RSS.
	ChurnOnlyFloorCores float64 `json:"churn_only_floor_cores,omitempty"`
	FloorPeakRSSMiB     float64 `json:"floor_peak_rss_mib,omitempty"`
	// What each of them allocated per second in that window (MiB): the
	// garbage collector's work follows it.
	ChurnOnlyAllocMiBPS      float64 `json:"churn_only_alloc_mib_per_s,omitempty"`
	ChurnOnlyFloorAllocMiBPS float64 `json:"churn_only_floor_alloc_mib_per_s,omitempty"`
	// With -floor, the framework floor: the vanilla kube-scheduler with no
	// pod to schedule (startFrameworkFloor), in the same window.
	ChurnOnlyFrameworkCores    float64 `json:"churn_only_framework_floor_cores,omitempty"`
	ChurnOnlyFrameworkAllocMiB float64 `json:"churn_only_framework_floor_alloc_mib_per_s,omitempty"`
	FrameworkPeakRSSMiB        float64 `json:"framework_floor_peak_rss_mib,omitempty"`
	// The same for the other processes: the churn's load on the control
	// plane (and the bench's churn generator and fake kubelet).
	ChurnOnlyOthersCores map[string]float64 `json:"churn_only_others_cores,omitempty"`
	// The requests the API server served per second in that window, by
	// verb and resource: every client's, the churn's and the fake kubelet's
	// included.
	ChurnOnlyRequestsPS map[string]float64 `json:"churn_only_apiserver_requests_per_s,omitempty"`
	// Scheduling attempts per second while the stream ran that found no
	// node: the backlog's retries.
	UnschedulablePerS float64 `json:"unschedulable_attempts_per_s"`
	Pinned            bool    `json:"pinned"`
	CPUQuota          float64 `json:"cpu_quota,omitempty"`
	PinCPUs           int     `json:"pin_cpus,omitempty"`
	SchedulerEnv      string  `json:"scheduler_env,omitempty"`
}

// BenchmarkChurn measures the stream of GPU pods that fit, bound by each
// scheduler, on a quiet cluster and under churn: a backlog of GPU pods that
// fit nowhere, GPU Feature Discovery rewriting a timestamp label on every
// node once a minute (spread evenly), and CPU pods created and deleted on
// the nodes. ratio_churn is the stream's throughput under churn over quiet.
// gpu-scheduler places the openb-like mix (shares accounted); the vanilla
// kube-scheduler the same with whole GPUs, as the reference.
func BenchmarkChurn(b *testing.B) {
	ctx := context.Background()
	start := time.Now()
	createNodes(b, *tpNodes, false)
	b.Logf("%d nodes registered in %v", *tpNodes, time.Since(start).Round(time.Second))
	out := map[string]any{}
	var rows []*Churn
	for _, sched := range splitComma(*chSchedulers) {
		// -rounds: quiet and churn alternate; the ratio is of the means.
		var quiet, churn []*Churn
		var qSum, cSum float64
		var perRound []float64
		for round := 0; round < max(*tpRounds, 1); round++ {
			for _, withChurn := range []bool{false, true} {
				r, err := runChurn(ctx, b, sched, withChurn)
				if err != nil {
					b.Fatalf("%s churn=%v: %v", sched, withChurn, err)
				}
				rows = append(rows, r)
				if withChurn {
					churn, cSum = append(churn, r), cSum+r.Average
				} else {
					quiet, qSum = append(quiet, r), qSum+r.Average
				}
			}
			perRound = append(perRound, churn[round].Average/quiet[round].Average)
		}
		key := "ours"
		if sched == "kube-scheduler" {
			key = "vanilla"
		}
		if len(quiet) == 1 {
			out[key+"_quiet"], out[key+"_churn"] = quiet[0], churn[0]
		} else {
			out[key+"_quiet"], out[key+"_churn"] = quiet, churn
			out["ratio_churn_"+key+"_rounds"] = perRound
		}
		out["ratio_churn_"+key] = cSum / qSum
		if key == "ours" {
			out["ratio_churn"] = cSum / qSum
		}
	}
	fmt.Printf("\nGPU pods bound under churn: %d nodes, %d pending pods that fit nowhere, GFD label every %v per node, %d CPU pods/s created and deleted; stream of %d GPU pods\n",
		*tpNodes, *chBacklog, *chLabelPeriod, *chCPUChurn, *chStream)
	if *pin {
		sched, _ := pinCPUs()
		fmt.Printf("the scheduler under test alone on %d CPU(s), the API server, etcd and the bench on the others (-pin)\n", len(sched))
	}
	if *cpuQuota > 0 {
		fmt.Printf("the scheduler under test capped at %.2f CPUs (-cpu-quota)\n", *cpuQuota)
	}
	fmt.Printf("%-15s %-6s %9s %6s %6s %7s %7s %8s %9s %8s %10s %9s %10s %7s %9s %8s %9s\n", "scheduler", "churn", "avg pod/s", "p50", "p99", "seconds", "CPU s", "others s", "peak RSS",
		"API/s", "hints/s", "hint µs", "narrowed/s", "passes", "pass s", "queue", "reasons/s")
	for _, r := range rows {
		others := 0.0
		for _, v := range r.OthersCPUSeconds {
			others += v
		}
		fmt.Printf("%-15s %-6v %9.1f %6.0f %6.0f %7.1f %7.1f %8.1f %6.0fMiB %8.1f %10.0f %9.3f %10.1f %7.0f %9.3f %8.0f %9.2f\n", r.Scheduler, r.Churn, r.Average, r.P50, r.P99, r.Seconds,
			r.CPUSeconds, others, r.PeakRSSMiB, r.APIRequestsPerS, r.HintCallsPerS, r.HintMeanUs, r.NarrowedPerS, r.Passes, r.PassMeanSeconds, r.QueueDepth, r.ReasonWritesPS)
	}
	for _, k := range []string{"ours", "vanilla"} {
		if v, ok := out["ratio_churn_"+k]; ok {
			fmt.Printf("ratio_churn %s = %.3f", k, v)
			if r, ok := out["ratio_churn_"+k+"_rounds"]; ok {
				fmt.Printf(" (mean churn over mean quiet; per round %.3f)", r)
			}
			fmt.Println()
		}
	}
	if *jsonOut != "" {
		for k, v := range out {
			writeJSON(b, *jsonOut, k, v)
		}
	}
}

// backlogPod waits for a GPU model no node has (the common backlog: jobs
// queued for the scarce model): for gpu-scheduler by its model annotation,
// so that GPUFit rejects it and its queueing hints run for it on every
// event; for the vanilla scheduler by a node selector on the GFD label.
func backlogPod(i int, ns, schedulerName string, ours bool) *v1.Pod {
	q := *resource.NewQuantity(1, resource.DecimalSI)
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("backlog-%06d", i), Namespace: ns},
		Spec: v1.PodSpec{SchedulerName: schedulerName, Containers: []v1.Container{{Name: "c", Image: "pause",
			Resources: v1.ResourceRequirements{
				Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("100m"), v1.ResourceMemory: resource.MustParse("500Mi"), gpu.ResourceNvidiaGPU: q},
				Limits:   v1.ResourceList{gpu.ResourceNvidiaGPU: q}}}}},
	}
	if ours {
		p.Annotations = map[string]string{gpu.AnnotationModel: "NVIDIA-H100-80GB-HBM3"}
	} else {
		p.Spec.NodeSelector = map[string]string{gpu.LabelGPUProduct: "NVIDIA-H100-80GB-HBM3"}
	}
	return p
}

func runChurn(ctx context.Context, b *testing.B, schedBin string, withChurn bool) (*Churn, error) {
	key := "q"
	if withChurn {
		key = "c"
	}
	short := map[string]string{"gpu-scheduler": "ours", "kube-scheduler": "vanilla"}[schedBin]
	ns := "ch-" + short + "-" + key
	schedulerName := ns
	client := cluster.Client
	client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	cpuNS := ns + "-cpu"
	client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: cpuNS}}, metav1.CreateOptions{})
	res := &Churn{Scheduler: schedBin, Churn: withChurn, Nodes: *tpNodes, Stream: *chStream}

	// Unschedulable backlog pods and bound stream pods, from an informer.
	var bound, unschedulable atomic.Int64
	seen := sync.Map{}
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns))
	inf := f.Core().V1().Pods().Informer()
	count := func(obj interface{}) {
		p := obj.(*v1.Pod)
		if p.Spec.NodeName != "" {
			if _, dup := seen.LoadOrStore(p.Name, true); !dup {
				bound.Add(1)
			}
			return
		}
		for _, c := range p.Status.Conditions {
			if c.Type == v1.PodScheduled && c.Reason == v1.PodReasonUnschedulable {
				if _, dup := seen.LoadOrStore(p.Name, false); !dup {
					unschedulable.Add(1)
				}
			}
		}
	}
	inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: count, UpdateFunc: func(_, o interface{}) { count(o) }})
	stop := make(chan struct{})
	defer close(stop)
	f.Start(stop)
	f.WaitForCacheSync(stop)

	if withChurn {
		res.Backlog = *chBacklog
		var pods []*v1.Pod
		for i := 0; i < *chBacklog; i++ {
			pods = append(pods, backlogPod(i, ns, schedulerName, schedBin == "gpu-scheduler"))
		}
		t0 := time.Now()
		if err := createPods(ctx, pods); err != nil {
			return nil, err
		}
		b.Logf("%s: %d backlog pods created in %v", ns, len(pods), time.Since(t0).Round(time.Second))
	}
	sched, err := startUnderTest(ctx, schedBin, schedulerName)
	if err != nil {
		return nil, err
	}
	defer sched.Stop(10 * time.Second)
	if withChurn {
		// Every backlog pod tried once: the backlog is in place.
		t0 := time.Now()
		for unschedulable.Load() < int64(*chBacklog) && time.Since(t0) < 30*time.Minute {
			time.Sleep(time.Second)
		}
		b.Logf("%s: backlog unschedulable after %v", ns, time.Since(t0).Round(time.Second))
	}
	// Its caches synced and handlers through the initial list (readyz's
	// sched-handler-sync), so that the window below is the churn's.
	if err := sched.WaitReady(ctx, 5*time.Minute); err != nil {
		return nil, fmt.Errorf("%s: %w", ns, err)
	}
	var floor *localcp.Proc
	var ffloor *localcp.Scheduler
	if withChurn && *chFloor {
		if floor, err = startFloor(ctx); err != nil {
			return nil, err
		}
		defer floor.Stop(10 * time.Second)
		if ffloor, err = startFrameworkFloor(ctx); err != nil {
			return nil, err
		}
		defer ffloor.Stop(10 * time.Second)
	}
	churnCtx, stopChurn := context.WithCancel(ctx)
	var labelOps, cpuOps atomic.Int64
	var churnWG sync.WaitGroup
	if withChurn {
		churnWG.Add(2)
		go func() { defer churnWG.Done(); relabel(churnCtx, &labelOps) }()
		go func() { defer churnWG.Done(); cpuChurn(churnCtx, cpuNS, &cpuOps) }()
		// The churn at its rate before the stream; what it costs the
		// scheduler alone (profiled with -pprof).
		heapProfile := func(suffix string) {
			if *tpProfile == "" {
				return
			}
			// A pair, each after a collection (a heap profile is as of
			// the last one), taken just outside the window so that those
			// collections are not in its CPU: pprof -base start end
			// -sample_index=alloc_space says what was allocated in it.
			if code, body, err := sched.GetWithin(ctx, "/debug/pprof/heap?gc=1", time.Minute); err == nil && code == 200 {
				os.MkdirAll(*tpProfile, 0o755)
				os.WriteFile(filepath.Join(*tpProfile, fmt.Sprintf("heap-%s-idle-%s.pprof", ns, suffix)), []byte(body), 0o644)
			}
		}
		// A scrape allocates too (13 MB at 5,000 nodes, where our
		// per-node gauges are most of /metrics): two back to back say how
		// much, and the window's scrape is taken after its CPU is read.
		heapProfile("start")
		allocIdle, scrapeCost := scrapeAlloc(ctx, sched)
		var floorIdle, floorAllocIdle, ffIdle, ffAllocIdle, ffScrapeCost float64
		if floor != nil {
			floorAllocIdle = floorAllocated()
			ffAllocIdle, ffScrapeCost = scrapeAlloc(ctx, ffloor)
		}
		cpuIdle, othersIdle, requests := procCPU(sched.Pid()), othersCPU(), apiServerRequests(ctx)
		if floor != nil {
			floorIdle, ffIdle = procCPU(floor.Pid()), procCPU(ffloor.Pid())
		}
		t0 := time.Now()
		if *tpProfile != "" {
			// The API server's side of the same window: what the churn
			// costs the control plane.
			apiDone := make(chan struct{})
			go func() {
				defer close(apiDone)
				body, err := cluster.Client.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", "10").DoRaw(ctx)
				if err != nil {
					b.Logf("%s: the API server's CPU profile: %v", ns, err)
					return
				}
				os.MkdirAll(*tpProfile, 0o755)
				os.WriteFile(filepath.Join(*tpProfile, fmt.Sprintf("cpu-%s-idle-apiserver.pprof", ns)), body, 0o644)
			}()
			defer func() { <-apiDone }()
			code, body, err := sched.GetWithin(ctx, "/debug/pprof/profile?seconds=10", time.Minute)
			if err == nil && code == 200 {
				os.MkdirAll(*tpProfile, 0o755)
				os.WriteFile(filepath.Join(*tpProfile, fmt.Sprintf("cpu-%s-idle.pprof", ns)), []byte(body), 0o644)
			} else {
				b.Logf("%s: CPU profile before the stream: %d %v", ns, code, err)
			}
		}
		time.Sleep(10*time.Second - time.Since(t0))
		res.ChurnOnlyCores = (procCPU(sched.Pid()) - cpuIdle) / time.Since(t0).Seconds()
		if floor != nil {
			res.ChurnOnlyFloorCores = (procCPU(floor.Pid()) - floorIdle) / time.Since(t0).Seconds()
			res.ChurnOnlyFrameworkCores = (procCPU(ffloor.Pid()) - ffIdle) / time.Since(t0).Seconds()
			res.ChurnOnlyFloorAllocMiBPS = (floorAllocated() - floorAllocIdle) / (1 << 20) / time.Since(t0).Seconds()
			res.FloorPeakRSSMiB = procPeakRSS(floor.Pid())
			res.FrameworkPeakRSSMiB = procPeakRSS(ffloor.Pid())
		}
		res.ChurnOnlyAllocMiBPS = (allocatedBytes(scrape(ctx, sched)) - allocIdle - scrapeCost) / (1 << 20) / time.Since(t0).Seconds()
		if floor != nil {
			res.ChurnOnlyFrameworkAllocMiB = (allocatedBytes(scrape(ctx, ffloor)) - ffAllocIdle - ffScrapeCost) / (1 << 20) / time.Since(t0).Seconds()
		}
		res.ChurnOnlyOthersCores = map[string]float64{}
		for k, v := range othersCPU() {
			res.ChurnOnlyOthersCores[k] = (v - othersIdle[k]) / time.Since(t0).Seconds()
		}
		res.ChurnOnlyRequestsPS = map[string]float64{}
		for k, v := range apiServerRequests(ctx) {
			if r := (v - requests[k]) / time.Since(t0).Seconds(); r >= 0.5 {
				res.ChurnOnlyRequestsPS[k] = r
			}
		}
		heapProfile("end")
		if floor != nil {
			floor.Stop(10 * time.Second) // its window is over; the stream runs without it
			ffloor.Stop(10 * time.Second)
		}
		if schedBin == "gpu-scheduler" {
			// One full resync pass over the backlog, to measure it.
			for t0 := time.Now(); time.Since(t0) < time.Minute; time.Sleep(time.Second) {
				if scrape(ctx, sched).sumWhere("gpu_scheduler_requeue_pass_duration_seconds_count", `trigger="resync"`) >= 2 {
					break
				}
			}
		}
	}

	before := scrape(ctx, sched)
	cpu0, others0 := procCPU(sched.Pid()), othersCPU()
	labels0, cpuOps0 := labelOps.Load(), cpuOps.Load()
	rng := rand.New(rand.NewSource(1))
	workload := "gpu"
	if schedBin == "kube-scheduler" {
		workload = "gpu-whole"
	}
	var stream []*v1.Pod
	for i := 0; i < *chStream; i++ {
		stream = append(stream, workloadPod(workload, i, rng, ns, schedulerName))
	}
	submitted := time.Now()
	go createPods(ctx, stream)
	var profDone chan struct{}
	if *tpProfile != "" {
		profDone = make(chan struct{})
		go func() {
			defer close(profDone)
			// 20 s from the submission: the queue as the stream meets it.
			code, body, err := sched.GetWithin(context.Background(), "/debug/pprof/profile?seconds=20", time.Minute)
			if err != nil || code != 200 {
				b.Logf("%s: CPU profile: %d %v", ns, code, err)
				return
			}
			os.MkdirAll(*tpProfile, 0o755)
			os.WriteFile(filepath.Join(*tpProfile, fmt.Sprintf("cpu-%s.pprof", ns)), []byte(body), 0o644)
		}()
	}
	samples, elapsed := sampleBinds(&bound, *chStream, *chMaxWait, submitted.Add(30*time.Minute), nil)
	if bound.Load() == 0 {
		b.Logf("%s: nothing bound %v after the stream was submitted", ns, *chMaxWait)
	}
	window := time.Since(submitted).Seconds()
	after := scrape(ctx, sched)
	res.CPUSeconds = procCPU(sched.Pid()) - cpu0
	res.OthersCPUSeconds, res.Pinned, res.CPUQuota, res.SchedulerEnv = map[string]float64{}, *pin, *cpuQuota, tpEnv.String()
	if sched, _ := pinCPUs(); *pin {
		res.PinCPUs = len(sched)
	}
	for k, v := range othersCPU() {
		res.OthersCPUSeconds[k] = v - others0[k]
	}
	res.PeakRSSMiB = procPeakRSS(sched.Pid())
	if *tpProfile != "" {
		// What the scheduler holds once the stream is bound: the backlog's
		// share of its heap. After its CPU was read: this forces a GC.
		if code, body, err := sched.GetWithin(ctx, "/debug/pprof/heap?gc=1", time.Minute); err == nil && code == 200 {
			os.WriteFile(filepath.Join(*tpProfile, fmt.Sprintf("heap-%s.pprof", ns)), []byte(body), 0o644)
		} else {
			b.Logf("%s: heap profile: %d %v", ns, code, err)
		}
	}
	res.LabelUpdatesPS = float64(labelOps.Load()-labels0) / window
	res.CPUPodOpsPS = float64(cpuOps.Load()-cpuOps0) / window
	stopChurn()
	churnWG.Wait()

	res.Seconds = elapsed.Seconds()
	res.Unbound = *chStream - int(bound.Load())
	if bound.Load() > 0 {
		res.Average = float64(bound.Load()) / elapsed.Seconds()
	}
	if profDone != nil {
		<-profDone
	}
	sorted := append([]float64(nil), samples...)
	sort.Float64s(sorted)
	res.P50, res.P99 = percentile(sorted, 50), percentile(sorted, 99) // as bench-throughput
	d := func(name string) float64 { return after.sum(name) - before.sum(name) }
	res.APIRequestsPerS = d("rest_client_requests_total") / window
	calls := after.sumWhere("scheduler_queueing_hint_execution_duration_seconds_count", `plugin="GPUFit"`) -
		before.sumWhere("scheduler_queueing_hint_execution_duration_seconds_count", `plugin="GPUFit"`)
	secs := after.sumWhere("scheduler_queueing_hint_execution_duration_seconds_sum", `plugin="GPUFit"`) -
		before.sumWhere("scheduler_queueing_hint_execution_duration_seconds_sum", `plugin="GPUFit"`)
	res.HintCallsPerS = calls / window
	pre := func(result string) float64 {
		name, label := "scheduler_pre_queueing_hint_evaluations_total", `result="`+result+`"`
		return (after.sumWhere(name, label) - before.sumWhere(name, label)) / window
	}
	res.NarrowedPerS, res.AllPodsPerS = pre("narrowed"), pre("all_pods")
	res.UnschedulablePerS = (after.sumWhere("scheduler_schedule_attempts_total", `result="unschedulable"`) -
		before.sumWhere("scheduler_schedule_attempts_total", `result="unschedulable"`)) / window
	if calls > 0 {
		res.HintMeanUs = secs / calls * 1e6
	}
	// Passes since the scheduler started (the resyncs over the backlog).
	res.Passes = after.sum("gpu_scheduler_requeue_pass_duration_seconds_count")
	if res.Passes > 0 {
		res.PassMeanSeconds = after.sum("gpu_scheduler_requeue_pass_duration_seconds_sum") / res.Passes
	}
	res.QueueDepth = after.sum("gpu_scheduler_requeue_queue_depth")
	res.ReasonWritesPS = d("gpu_scheduler_pending_reason_writes_total") / window
	b.Logf("%s: %d of %d bound in %v; samples %v; CPU s in %.0f s: scheduler %.1f, others %v; unschedulable attempts %.1f/s; the churn alone %.3f cores, %.1f MiB/s allocated (others %.3v; informer floor %.3f cores, %.1f MiB/s, %.0f MiB; framework floor %.3f cores, %.1f MiB/s, %.0f MiB), API server requests/s %v", ns, bound.Load(), *chStream, elapsed.Round(time.Millisecond), samples,
		window, res.CPUSeconds, res.OthersCPUSeconds, res.UnschedulablePerS, res.ChurnOnlyCores, res.ChurnOnlyAllocMiBPS, res.ChurnOnlyOthersCores, res.ChurnOnlyFloorCores, res.ChurnOnlyFloorAllocMiBPS, res.FloorPeakRSSMiB,
		res.ChurnOnlyFrameworkCores, res.ChurnOnlyFrameworkAllocMiB, res.FrameworkPeakRSSMiB, res.ChurnOnlyRequestsPS)

	sched.Stop(10 * time.Second)
	for _, n := range []string{ns, cpuNS} {
		if err := deleteAllPods(ctx, n); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// relabel rewrites a GFD-style timestamp label on every node once per
// period, one node at a time, evenly spread.
func relabel(ctx context.Context, ops *atomic.Int64) {
	if *chLabelPeriod <= 0 {
		return
	}
	nodes := make([]string, *tpNodes)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("perf-%05d", i)
	}
	tick := time.NewTicker(*chLabelPeriod / time.Duration(len(nodes)))
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		patch := fmt.Sprintf(`{"metadata":{"labels":{"nvidia.com/gfd.timestamp":"%d"}}}`, time.Now().UnixNano())
		go func(n string) {
			if _, err := cluster.Client.CoreV1().Nodes().Patch(ctx, n, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err == nil {
				ops.Add(1)
			}
		}(nodes[i%len(nodes)])
	}
}

// cpuChurn creates CPU pods bound to random nodes (as if placed by another
// scheduler) and deletes the oldest, at the rate asked for, keeping ten
// seconds' worth alive.
func cpuChurn(ctx context.Context, ns string, ops *atomic.Int64) {
	if *chCPUChurn <= 0 {
		return
	}
	rng := rand.New(rand.NewSource(2))
	tick := time.NewTicker(time.Second / time.Duration(*chCPUChurn))
	defer tick.Stop()
	var alive []string
	var mu sync.Mutex
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cpu-%07d", i), Namespace: ns},
			Spec: v1.PodSpec{NodeName: fmt.Sprintf("perf-%05d", rng.Intn(*tpNodes)), TerminationGracePeriodSeconds: ptr.To[int64](0),
				Containers: []v1.Container{{Name: "c", Image: "pause", Resources: v1.ResourceRequirements{
					Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("100m"), v1.ResourceMemory: resource.MustParse("100Mi")}}}}}}
		var victim string
		mu.Lock()
		alive = append(alive, p.Name)
		if len(alive) > 10**chCPUChurn {
			victim, alive = alive[0], alive[1:]
		}
		mu.Unlock()
		go func() {
			if _, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err == nil {
				ops.Add(1)
			}
			if victim != "" {
				if err := cluster.Client.CoreV1().Pods(ns).Delete(ctx, victim, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err == nil {
					ops.Add(1)
				}
			}
		}()
	}
}

// apiServerRequests reads the API server's apiserver_request_total, summed
// by verb and resource ("PUT pods/status").
func apiServerRequests(ctx context.Context) map[string]float64 {
	body, err := cluster.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil
	}
	m := map[string]float64{}
	for _, l := range parseMetrics(string(body)) {
		rest, ok := strings.CutPrefix(l, "apiserver_request_total{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		v, err := strconv.ParseFloat(value, 64)
		if !ok || err != nil {
			continue
		}
		var verb, res, sub string
		for _, kv := range strings.Split(labels, ",") {
			k, val, _ := strings.Cut(kv, "=")
			val = strings.Trim(val, `"`)
			switch k {
			case "verb":
				verb = val
			case "resource":
				res = val
			case "subresource":
				sub = val
			}
		}
		if sub != "" {
			res += "/" + sub
		}
		m[verb+" "+res] += v
	}
	return m
}

// allocatedBytes is the heap a process allocated since it started, from its
// Go collector.
func allocatedBytes(m metricsText) float64 {
	if v := m.sum("go_gc_heap_allocs_bytes_total"); v > 0 {
		return v
	}
	return m.sum("go_memstats_alloc_bytes_total")
}

// scrapeAlloc reads a scheduler's allocated bytes twice, back to back: the
// second reading, and what one scrape allocates (the difference). A later
// reading less the second, less that cost, is what was allocated between
// the two readings.
func scrapeAlloc(ctx context.Context, s *localcp.Scheduler) (float64, float64) {
	first := allocatedBytes(scrape(ctx, s))
	second := allocatedBytes(scrape(ctx, s))
	return second, second - first
}

// metricsText is a scrape of a scheduler's /metrics.
type metricsText []string

func scrape(ctx context.Context, s *localcp.Scheduler) metricsText {
	code, body, err := s.GetWithin(ctx, "/metrics", time.Minute)
	if err != nil || code != 200 {
		return nil
	}
	return parseMetrics(body)
}

// parseMetrics keeps the sample lines of a Prometheus text exposition.
func parseMetrics(body string) metricsText {
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		if l := sc.Text(); !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	return lines
}

// sum adds the samples of one metric.
func (m metricsText) sum(name string) float64 { return m.sumWhere(name, "") }

// sumWhere adds the samples of one metric whose labels contain label.
func (m metricsText) sumWhere(name, label string) float64 {
	var t float64
	for _, l := range m {
		end := strings.IndexAny(l, "{ ")
		if end < 0 || l[:end] != name || (label != "" && !strings.Contains(l, label)) {
			continue
		}
		f := strings.Fields(l)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			t += v
		}
	}
	return t
}

// BenchmarkIdleControlPlane measures what the harness alone costs the
// control plane: the nodes registered, no scheduler, no pods; the API
// server's requests per second and the CPU of the API server, etcd and the
// bench (its fake kubelet) over a minute, after 50 s to settle.
func BenchmarkIdleControlPlane(b *testing.B) {
	ctx := context.Background()
	createNodes(b, *tpNodes, false)
	time.Sleep(50 * time.Second)
	req0, cpu0, t0 := apiServerRequests(ctx), othersCPU(), time.Now()
	time.Sleep(time.Minute)
	req1, cpu1, window := apiServerRequests(ctx), othersCPU(), time.Since(t0).Seconds()
	fmt.Printf("\nidle control plane, %d nodes, %.0f s\n", *tpNodes, window)
	total := 0.0
	for _, k := range slices.Sorted(maps.Keys(cpu1)) {
		total += (cpu1[k] - cpu0[k]) / window
		fmt.Printf("%-15s %.3f cores\n", k, (cpu1[k]-cpu0[k])/window)
	}
	fmt.Printf("%-15s %.3f cores\n", "total", total)
	for _, k := range slices.Sorted(maps.Keys(req1)) {
		if r := (req1[k] - req0[k]) / window; r >= 0.5 {
			fmt.Printf("%8.1f/s %s\n", r, k)
		}
	}
}
