package simulator

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	internalqueue "k8s.io/kubernetes/pkg/scheduler/backend/queue"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/metrics"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/offline"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/plugins/gpufit"
)

// DynamicExperiment replays a trace with departures. The pods are the
// static method's (NewArrival: the trace's pods shuffled and tuned with
// clones to Tune x the GPU capacity in all; a clone keeps its source's
// times). Each arrives at its creation_time, the trace's arrival times
// compressed linearly into ArrivalSpan, waits in the scheduler's own
// scheduling queue until the framework places it, runs for its trace
// duration (deletion_time - creation_time, not compressed) and leaves. The
// clock is simulated: nothing waits on the wall clock.
type DynamicExperiment struct {
	Trace  *Trace
	Policy Policy
	Seed   int64
	Tune   float64
	// ArrivalSpan is the simulated time from the first arrival to the last.
	ArrivalSpan time.Duration
	Parallelism int
	TieOrder    string
	// Flush is the queue's podMaxInUnschedulablePodsDuration (5m in the
	// scheduler): a pod left that long in the unschedulable pool goes back
	// whatever the hints said, checked every 30 s of simulated time as the
	// queue's own loop does on the wall clock. 0 leaves it off: a pod a hint
	// wrongly skips then waits for ever, a check on the hints.
	Flush time.Duration
	// Limit replays only the first so many arrivals (profiling); 0: all.
	Limit    int
	Progress func(done, total int)
}

// AllocSample is the GPU allocation at a simulated time.
type AllocSample struct {
	T         float64 `json:"t"`
	Allocated int64   `json:"allocatedMilli"`
	Pending   int     `json:"pendingGPUPods"`
}

// DynamicResult is what one dynamic replay measured.
type DynamicResult struct {
	Workload string  `json:"workload"`
	Policy   Policy  `json:"policy"`
	Seed     int64   `json:"seed"`
	Tune     float64 `json:"tune"`
	// Compression divides the trace's arrival times.
	Compression float64 `json:"compression"`
	Pods        int     `json:"pods"`
	GPUPods     int     `json:"gpuPods"`
	Capacity    int64   `json:"capacityMilli"`
	// Span is the simulated time from the first to the last arrival (s),
	// End when the last pod left.
	Span float64 `json:"spanSeconds"`
	End  float64 `json:"endSeconds"`
	// TimeAvgAlloc is the allocated GPU milli averaged over Span, as a
	// fraction of capacity; PeakAlloc its highest value.
	TimeAvgAlloc float64 `json:"timeAvgAlloc"`
	PeakAlloc    float64 `json:"peakAlloc"`
	// Waits of the GPU pods (s): arrival to bind, or to the end of the
	// replay for those never placed.
	WaitP50  float64 `json:"waitP50"`
	WaitP95  float64 `json:"waitP95"`
	WaitP99  float64 `json:"waitP99"`
	WaitMean float64 `json:"waitMean"`
	// Waited is how many GPU pods were not placed at once; FragWaited how
	// many of them were refused while the nodes of the models they accept
	// had, in total, as much idle GPU as they asked for.
	Waited     int `json:"waited"`
	FragWaited int `json:"fragWaited"`
	// NeverPlaced GPU pods were still waiting when every other pod had left.
	NeverPlaced int `json:"neverPlaced"`
	// Attempts counts scheduling cycles.
	Attempts int `json:"attempts"`
	// FlushPlaced GPU pods were bound by an attempt that the flush, not an
	// event's hint, brought: where a hint skipped an event that made room
	// (or the room came from no event the pod's plugins register).
	FlushPlaced int `json:"flushPlaced,omitempty"`
	// Flush is the experiment's (s); 0 when it was off.
	Flush   float64       `json:"flushSeconds,omitempty"`
	Samples []AllocSample `json:"-"`
	Wall    time.Duration `json:"wallNanos"`
}

// FragWaitedFraction is the share of GPU pods whose wait fragmentation
// caused.
func (r *DynamicResult) FragWaitedFraction() float64 {
	if r.GPUPods == 0 {
		return 0
	}
	return float64(r.FragWaited) / float64(r.GPUPods)
}

// dynPod is one pod of a dynamic replay.
type dynPod struct {
	row      PodRow
	obj      *v1.Pod
	arrive   float64
	duration float64
	bound    *v1.Pod
	place    Placement
	fragWait bool
	waited   bool
}

// departure is a bound pod's end of run.
type departure struct {
	at  float64
	seq int
}

type departures []departure

func (d departures) Len() int { return len(d) }
func (d departures) Less(i, j int) bool {
	return d[i].at < d[j].at || d[i].at == d[j].at && d[i].seq < d[j].seq
}
func (d departures) Swap(i, j int) { d[i], d[j] = d[j], d[i] }
func (d *departures) Push(x any)   { *d = append(*d, x.(departure)) }
func (d *departures) Pop() any {
	old := *d
	x := old[len(old)-1]
	*d = old[:len(old)-1]
	return x
}

// RunDynamic replays one dynamic experiment through the real framework and
// the scheduler's own scheduling queue (its queueing hints decide which
// waiting pods a departure or a bind wakes up; the queue's clock is the
// simulated one, so its backoff is in trace seconds). Per simulated
// instant: departures first, then arrivals, then the queue is drained:
// scheduling takes no simulated time.
func RunDynamic(ctx context.Context, e DynamicExperiment) (*DynamicResult, error) {
	start := time.Now()
	arrival, err := NewArrival(e.Trace, e.Seed, e.Tune)
	if err != nil {
		return nil, err
	}
	if e.ArrivalSpan <= 0 {
		return nil, fmt.Errorf("the arrival span must be positive, got %v", e.ArrivalSpan)
	}
	// Pods in creation order; equal times in the arrival's seeded order.
	rows := append([]PodRow(nil), arrival.Pods...)
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].Created < rows[j].Created })
	if e.Limit > 0 && e.Limit < len(rows) {
		rows = rows[:e.Limit]
	}
	if len(rows) == 0 || rows[len(rows)-1].Created <= rows[0].Created {
		return nil, fmt.Errorf("workload %s has no creation_time spread to replay with departures", e.Trace.Workload)
	}
	comp := float64(rows[len(rows)-1].Created-rows[0].Created) / e.ArrivalSpan.Seconds()
	nodeRows := arrival.Nodes

	prof, err := Profile(e.Policy, e.Trace, e.TieOrder)
	if err != nil {
		return nil, err
	}
	nodes := make([]*v1.Node, 0, len(nodeRows))
	modelCap := map[string]int64{}
	for _, n := range nodeRows {
		nodes = append(nodes, NodeObject(n))
		modelCap[n.Model] += int64(n.GPUs) * gpu.MilliPerGPU
	}
	cluster, err := offline.NewCluster(nodes, nil)
	if err != nil {
		return nil, err
	}
	client, _ := newClient()
	ctx, cancel := context.WithCancel(klog.NewContext(ctx, klog.Background().V(0)))
	defer cancel()
	logger := klog.FromContext(ctx)
	fw, factory, err := offline.NewFramework(ctx, prof, cluster, client, offline.Options{Parallelism: e.Parallelism})
	if err != nil {
		return nil, err
	}
	defer fw.Close()
	setAllocator(fw, e.Policy)

	// The scheduling queue as scheduler.New builds it, on a simulated clock.
	epoch := time.Unix(0, 0)
	clock := testingclock.NewFakeClock(epoch)
	hints, err := queueingHints(ctx, fw)
	if err != nil {
		return nil, err
	}
	if editHints != nil {
		editHints(hints)
	}
	pre := map[string]fwk.PreEnqueuePlugin{}
	for _, p := range fw.PreEnqueuePlugins() {
		pre[p.Name()] = p
	}
	// The profile's order, then the replay's: the clock stands still while
	// the queue drains, so pods refused at one instant share a timestamp,
	// and the queue walks its pool in map order; without a last tie-break a
	// seed would not give one result.
	byUID := make(map[types.UID]int, len(rows))
	less := fw.QueueSortFunc()
	seqOf := func(e fwk.QueuedEntityInfo) int {
		if p, ok := e.(*framework.QueuedPodInfo); ok && p.Pod != nil {
			return byUID[p.Pod.UID]
		}
		return -1
	}
	order := func(a, b fwk.QueuedEntityInfo) bool {
		if less(a, b) || less(b, a) {
			return less(a, b)
		}
		return seqOf(a) < seqOf(b)
	}
	queue := internalqueue.NewSchedulingQueue(order, factory,
		internalqueue.WithClock(clock),
		internalqueue.WithQueueingHintMapPerProfile(internalqueue.QueueingHintMapPerProfile{prof.SchedulerName: hints}),
		internalqueue.WithPreEnqueuePluginMap(map[string]map[string]fwk.PreEnqueuePlugin{prof.SchedulerName: pre}),
		internalqueue.WithMetricsRecorder(metrics.NewMetricsAsyncRecorder(1000, time.Second, ctx.Done())))
	defer queue.Close()
	fw.SetPodNominator(queue)
	fw.SetPodActivator(queue)
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	// The replay's pod API has no watches: the informers' stores are kept
	// here, so that the queueing hints judge a departure on the node as it
	// now is, as the scheduler's informers would let them.
	podStore := factory.Core().V1().Pods().Informer().GetIndexer()
	nodeStore := factory.Core().V1().Nodes().Informer().GetIndexer()
	for _, n := range nodes {
		if err := nodeStore.Add(n); err != nil {
			return nil, err
		}
	}

	res := &DynamicResult{Workload: e.Trace.Workload, Policy: e.Policy, Seed: e.Seed, Tune: e.Tune, Compression: comp,
		Pods: len(rows), Capacity: e.Trace.Capacity(), Flush: e.Flush.Seconds()}
	pods := make([]*dynPod, len(rows))
	first := float64(rows[0].Created)
	for i, row := range rows {
		var obj *v1.Pod
		if e.Policy == Vanilla {
			obj = VanillaPodObject(row, i)
		} else {
			obj = PodObject(row, i, gpu.SchedulerName)
		}
		pods[i] = &dynPod{row: row, obj: obj, arrive: (float64(row.Created) - first) / comp, duration: float64(max(row.Deleted-row.Created, 0))}
		byUID[obj.UID] = i
		if row.NumGPU > 0 {
			res.GPUPods++
		}
	}
	res.Span = pods[len(pods)-1].arrive

	api := client.CoreV1().Pods(Namespace)
	check := NewChecker(nodeRows, e.Policy == Vanilla)
	var allocated int64
	allocByModel := map[string]int64{}
	modelOf := map[string]string{}
	for _, n := range nodeRows {
		modelOf[n.Name] = n.Model
	}
	pendingGPU := 0
	var waits []float64
	var deps departures
	now := 0.0
	changed := 0.0   // when a pod last left or was bound (simulated s)
	var area float64 // allocated milli x seconds, over the arrival span
	lastT := 0.0
	advance := func(t float64) {
		if t > res.Span {
			t = max(res.Span, lastT)
		}
		area += float64(allocated) * (t - lastT)
		lastT = t
	}
	idleFor := func(row PodRow) int64 {
		if len(row.Models) == 0 {
			var c int64
			for _, v := range modelCap {
				c += v
			}
			return c - allocated
		}
		var idle int64
		for _, m := range row.Models {
			idle += modelCap[m] - allocByModel[m]
		}
		return idle
	}

	// attempt runs one scheduling cycle for a popped pod, as scheduleOnePod
	// does, and binds it or hands it back to the queue as unschedulable.
	attempt := func(pInfo *framework.QueuedPodInfo) error {
		i, ok := byUID[pInfo.Pod.UID]
		if !ok {
			return fmt.Errorf("popped an unknown pod %s", pInfo.Pod.Name)
		}
		p := pods[i]
		res.Attempts++
		sched := offline.Schedule(ctx, fw, cluster, pInfo.Pod)
		if sched.Node != "" {
			committed, err := offline.Commit(ctx, fw, cluster, pInfo.Pod, sched, func(pod *v1.Pod) *v1.Pod {
				got, err := api.Get(ctx, pod.Name, metav1.GetOptions{})
				if err != nil {
					return pod
				}
				return got
			})
			if err == nil {
				queue.Done(pInfo.Pod.UID)
				if err := podStore.Add(committed); err != nil {
					return err
				}
				p.bound = committed
				p.place = placementOf(p.row, sched.Node, committed.Annotations, i)
				check.Add(p.row, p.place)
				allocated += p.row.GPURequest()
				allocByModel[modelOf[sched.Node]] += p.row.GPURequest()
				if p.row.NumGPU > 0 {
					pendingGPU--
					waits = append(waits, now-p.arrive)
					if pInfo.WasFlushedFromUnschedulable {
						res.FlushPlaced++
					}
				}
				heap.Push(&deps, departure{at: now + p.duration, seq: i})
				changed = now
				queue.MoveAllToActiveOrBackoffQueue(logger, framework.EventAssignedPodAdd, nil, committed, nil)
				return nil
			}
			sched.Err = err
		}
		var fitErr *framework.FitError
		var rejected *offline.Rejected
		switch {
		case errors.As(sched.Err, &fitErr):
			pInfo.UnschedulablePlugins = fitErr.Diagnosis.UnschedulablePlugins
			pInfo.PendingPlugins = fitErr.Diagnosis.PendingPlugins
		case errors.As(sched.Err, &rejected):
			// As handleSchedulingFailure: the plugin that refused the
			// node is the one whose events bring the pod back.
			pInfo.UnschedulablePlugins = sets.New(rejected.Status.Plugin())
			pInfo.PendingPlugins = sets.New[string]()
		default:
			return fmt.Errorf("pod %s: %w", pInfo.Pod.Name, sched.Err)
		}
		if p.row.NumGPU > 0 && !p.waited {
			p.waited = true
			res.Waited++
			if idleFor(p.row) >= p.row.GPURequest() {
				p.fragWait = true
				res.FragWaited++
			}
		}
		return queue.AddUnschedulablePodIfNotPresent(logger, pInfo, queue.SchedulingCycle())
	}
	// Pop does not block while the backoff queue holds pods: the queue pops
	// them when the active queue is empty (SchedulerPopFromBackoffQ, on by
	// default in v1.37).
	drain := func() error {
		for len(queue.PodsInActiveQ())+len(queue.PodsInBackoffQ()) > 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
			ent, err := queue.Pop(logger)
			if err != nil {
				return err
			}
			pInfo, ok := ent.(*framework.QueuedPodInfo)
			if !ok || pInfo.Pod == nil {
				return fmt.Errorf("popped %T, not a pod", ent)
			}
			if err := attempt(pInfo); err != nil {
				return err
			}
		}
		return nil
	}
	// lastOf is when a pod in the unschedulable pool was last tried or
	// flushed: the flush's clock for it.
	lastOf := func(pInfo *framework.QueuedPodInfo) time.Time {
		if pInfo.FlushTimestamp.After(pInfo.Timestamp) {
			return pInfo.FlushTimestamp
		}
		return pInfo.Timestamp
	}
	// flushLeftover is the queue's flushUnschedulableEntitiesLeftover,
	// which runs on the wall clock in the scheduler: the pods refused (or
	// last flushed) more than Flush ago go back with the wildcard event,
	// which no hint can skip. The replay builds no scheduling groups, so a
	// member pod's own timestamps are the entity's.
	flushLeftover := func() {
		cur := clock.Now()
		due := sets.New[types.UID]()
		for _, pod := range queue.UnschedulablePods() {
			pInfo, ok := queue.GetPod(pod.Name, pod.Namespace, pod.Spec.SchedulingGroup)
			if !ok {
				continue
			}
			if cur.Sub(lastOf(pInfo)) > e.Flush {
				pInfo.SetWasFlushedFromUnschedulable(true)
				pInfo.SetFlushTimestamp(cur)
				due.Insert(pod.UID)
			}
		}
		if due.Len() > 0 {
			queue.MoveAllToActiveOrBackoffQueue(logger, framework.EventUnschedulableTimeout, nil, nil,
				func(p *v1.Pod) bool { return due.Has(p.UID) })
		}
	}
	// nextTick is the first of the queue's 30 s ticks after now at which
	// the flush moves a pod (ticks before it find none due and change
	// nothing), and whether any pod waiting was last tried before the
	// cluster last changed: once no pod is left to arrive or leave, only
	// those could fit on a flush (a hint missed the change), so the replay
	// ends when none is left. +Inf when the flush is off or no pod waits.
	const flushEvery = 30.0 // s, the queue's period
	nextTick := func() (float64, bool) {
		if e.Flush <= 0 {
			return math.Inf(1), false
		}
		first, stale := math.Inf(1), false
		for _, pod := range queue.UnschedulablePods() {
			pInfo, ok := queue.GetPod(pod.Name, pod.Namespace, pod.Spec.SchedulingGroup)
			if !ok {
				continue
			}
			last := lastOf(pInfo).Sub(epoch).Seconds()
			first = min(first, last+e.Flush.Seconds())
			stale = stale || last < changed
		}
		if math.IsInf(first, 1) {
			return first, false
		}
		return (math.Floor(max(first, now)/flushEvery) + 1) * flushEvery, stale
	}
	sample := func() {
		res.Samples = append(res.Samples, AllocSample{T: now, Allocated: allocated, Pending: pendingGPU})
		res.PeakAlloc = max(res.PeakAlloc, float64(allocated)/float64(res.Capacity))
	}

	next := 0
	for {
		// The next instant: an arrival, a departure or a flush, whichever
		// is first.
		t := math.Inf(1)
		if next < len(pods) {
			t = pods[next].arrive
		}
		if deps.Len() > 0 && deps[0].at < t {
			t = deps[0].at
		}
		tick, stale := nextTick()
		if math.IsInf(t, 1) && !stale {
			break
		}
		flush := tick <= t
		t = min(t, tick)
		advance(t)
		now = t
		clock.SetTime(epoch.Add(time.Duration(t * float64(time.Second))))
		for deps.Len() > 0 && deps[0].at <= t {
			p := pods[heap.Pop(&deps).(departure).seq]
			if err := cluster.Remove(p.bound); err != nil {
				return nil, err
			}
			// The informers of a replay see no pods: what the pod's delete
			// event would do in GPUFit, done here.
			if t := gpufit.TrackerOf(fw); t != nil {
				t.Unreserve(p.bound.UID)
			}
			_ = api.Delete(ctx, p.obj.Name, metav1.DeleteOptions{})
			if err := podStore.Delete(p.bound); err != nil {
				return nil, err
			}
			check.Remove(p.row, p.place)
			allocated -= p.row.GPURequest()
			allocByModel[modelOf[p.bound.Spec.NodeName]] -= p.row.GPURequest()
			changed = t
			queue.MoveAllToActiveOrBackoffQueue(logger, framework.EventAssignedPodDelete, p.bound, nil, nil)
		}
		for next < len(pods) && pods[next].arrive <= t {
			p := pods[next]
			if _, err := api.Create(ctx, p.obj, metav1.CreateOptions{}); err != nil {
				return nil, err
			}
			queue.Add(ctx, p.obj)
			if p.row.NumGPU > 0 {
				pendingGPU++
			}
			next++
			if e.Progress != nil && next%1000 == 0 {
				e.Progress(next, len(pods))
			}
		}
		if flush {
			flushLeftover()
		}
		if err := drain(); err != nil {
			return nil, err
		}
		sample()
	}
	res.NeverPlaced = pendingGPU
	res.End = now
	// A pod never placed waited until the end: left out, a policy that
	// strands pods would show shorter waits.
	for _, p := range pods {
		if p.bound == nil && p.row.NumGPU > 0 {
			waits = append(waits, now-p.arrive)
		}
	}
	if res.Span > 0 {
		res.TimeAvgAlloc = area / (res.Span * float64(res.Capacity))
	}
	if err := check.Finish(allocated); err != nil {
		return nil, fmt.Errorf("%s %s seed %d (dynamic): %w", e.Trace.Workload, e.Policy, e.Seed, err)
	}
	if allocated != 0 {
		return nil, fmt.Errorf("%s %s seed %d (dynamic): %d milli still allocated after every pod left", e.Trace.Workload, e.Policy, e.Seed, allocated)
	}
	slices.Sort(waits)
	res.WaitP50, res.WaitP95, res.WaitP99 = quantile(waits, 0.50), quantile(waits, 0.95), quantile(waits, 0.99)
	for _, w := range waits {
		res.WaitMean += w
	}
	if len(waits) > 0 {
		res.WaitMean /= float64(len(waits))
	}
	res.Wall = time.Since(start)
	return res, nil
}

// quantile of sorted values (nearest rank); 0 for none.
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// editHints, set by tests only, changes the hints the queue is built with
// (a hint that misses an event, for the flush to catch).
var editHints func(internalqueue.QueueingHintMap)

// queueingHints is the profile's QueueingHintMap, built as scheduler.New
// builds it (buildQueueingHintMap): every EnqueueExtensions plugin's events,
// with Queue where a plugin gives no hint.
func queueingHints(ctx context.Context, fw framework.Framework) (internalqueue.QueueingHintMap, error) {
	always := func(klog.Logger, *v1.Pod, interface{}, interface{}) (fwk.QueueingHint, error) { return fwk.Queue, nil }
	m := internalqueue.QueueingHintMap{}
	for _, e := range fw.EnqueueExtensions() {
		events, err := e.EventsToRegister(ctx)
		if err != nil {
			return nil, err
		}
		for _, ev := range events {
			fn := ev.QueueingHintFn
			if fn == nil {
				fn = always
			}
			h := &internalqueue.QueueingHintFunction{PluginName: e.Name(), QueueingHintFn: fn, PreQueueingHintFn: ev.PreQueueingHintFn}
			if ev.Event.Resource == fwk.Pod {
				for _, pe := range framework.UnrollPodEvent(ev.Event) {
					m[pe] = append(m[pe], h)
				}
			} else {
				m[ev.Event] = append(m[ev.Event], h)
			}
		}
	}
	return m, nil
}
