// Package requeue is the reconcile-style requeue of unschedulable GPU pods.
// Events only wake it up; each reconcile reads the current cluster from the
// informers and decides: a pod that some node could now take is activated
// (moved back to the scheduler's active queue at once, whatever its backoff);
// one that none can take gets a specific, stable explanation. A periodic
// resync re-checks every unschedulable pod, so a missed event only delays a
// pod by one period. The same loop drops stale in-flight reservations.
//
// The queueing hints are the fast path; the reconciler repairs what they
// miss. It activates a pod once per failed attempt whose rejections it all
// re-checks (GPUs, CPU and memory, cordon, taints, node affinity), and a pod
// with no such record (its last attempt failed after the filters, or was
// not seen by this process) at most once per resync period: a pod blocked
// by anything else waits for the scheduler's own hints and backoff. Only
// events that can free or add GPU capacity wake it.
package requeue

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/agent/hami"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/fault"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
)

// GPUState is the scheduler's device accounting (the GPU plugins' shared
// state).
type GPUState interface {
	Tracker() *gpu.Tracker
	Scoring() gpu.Scoring
	Workload() *gpu.Workload
	PodsOnNode(node string) ([]*v1.Pod, bool)
	// SameDevices reports whether two versions of a node report the same
	// GPUs.
	SameDevices(a, b *v1.Node) bool
}

// Activator moves pods back to the active queue (the framework handle).
type Activator interface {
	Activate(logger klog.Logger, pods map[string]*v1.Pod)
}

// Config is the reconciler's settings (GPUFitArgs.requeue).
type Config struct {
	SchedulerName string
	Workers       int
	ResyncPeriod  time.Duration
	BackoffBase   time.Duration
	BackoffMax    time.Duration
	Explain       bool
	// ExplainEvery is the least time between two rewrites of a pod's reason.
	ExplainEvery time.Duration
	// ReservationGrace is how long a reservation may outlive the pod's
	// assignment being visible in the informer before it is dropped (the
	// scheduler's own cache catches up in milliseconds).
	ReservationGrace time.Duration
	// ClearClient removes the reasons of bound pods, on a rate limit of its
	// own so that removals never wait behind a backlog's first reasons (nil:
	// the reasons' client).
	ClearClient kubernetes.Interface
}

// Reconciler is the requeue controller of one scheduler profile.
type Reconciler struct {
	cfg       Config
	gpu       GPUState
	activator Activator
	// client writes the pending reasons: its own rate limit, so that they
	// never delay a bind.
	client  kubernetes.Interface
	pods    cache.SharedIndexInformer
	nodes   cache.SharedIndexInformer
	reqOpts gpu.RequestOptions
	// active reports whether this process schedules (the leader); standbys
	// keep their hands off the pods.
	active func() bool
	queue  workqueue.TypedRateLimitingInterface[string]
	dirty  chan struct{}
	// writeQ and writes feed the reason writer: the latest reason per pod.
	writeQ workqueue.TypedRateLimitingInterface[string]
	clearQ workqueue.TypedRateLimitingInterface[string]
	writes sync.Map

	// current is the view the checks share; nil when stale. Checks run in
	// parallel on it; buildMu makes one worker build it.
	current atomic.Pointer[view]
	buildMu sync.Mutex
	// bases are the nodes' states of the last view (buildMu): the next
	// view recomputes only the nodes that changed since.
	bases map[string]*baseNode
	// computed counts the node states computed for views.
	computed atomic.Int64

	writtenMu sync.Mutex
	written   map[string]time.Time // last reason write per pod

	// rejections is whether each pending pod's last attempt failed only on
	// what the reconciler re-checks (RecordRejection), by UID; an
	// activation uses it up.
	rejections sync.Map
	// classes: pod UID to the class of its last pending verdict (pendingClass).
	classes sync.Map
	// activated is when the reconciler last activated each pod, by UID.
	activated sync.Map
}

// maxViewAge bounds how stale a view gets between events: binds of other
// pods take devices without waking the reconciler.
const maxViewAge = 5 * time.Second

const pendingIndex = "gpu-scheduler.io/pending"

// New wires the reconciler to the informers; Run starts it. The informers
// must not have started yet (indexers are added here).
func New(cfg Config, state GPUState, activator Activator, client kubernetes.Interface,
	pods, nodes cache.SharedIndexInformer, reqOpts gpu.RequestOptions, active func() bool) (*Reconciler, error) {
	registerMetrics()
	if cfg.ReservationGrace == 0 {
		cfg.ReservationGrace = 10 * time.Second
	}
	r := &Reconciler{
		cfg: cfg, gpu: state, activator: activator, client: client, pods: pods, nodes: nodes, reqOpts: reqOpts, active: active,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](cfg.BackoffBase, cfg.BackoffMax),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "gpu-scheduler-requeue"}),
		dirty: make(chan struct{}, 1),
		writeQ: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](cfg.BackoffBase, cfg.BackoffMax),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "gpu-scheduler-pending-reasons"}),
		clearQ: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](cfg.BackoffBase, cfg.BackoffMax),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "gpu-scheduler-pending-reason-removals"}),
		written: map[string]time.Time{},
	}
	if cfg.ClearClient == nil {
		r.cfg.ClearClient = client
	}
	if _, ok := pods.GetIndexer().GetIndexers()[pendingIndex]; !ok {
		err := pods.AddIndexers(cache.Indexers{pendingIndex: func(obj interface{}) ([]string, error) {
			if p, ok := obj.(*v1.Pod); ok && p.Spec.NodeName == "" && p.DeletionTimestamp == nil {
				return []string{p.Spec.SchedulerName}, nil
			}
			// Bound with a reason left: a removal was lost (a standby, a
			// restart); the resync finds it here.
			if p, ok := obj.(*v1.Pod); ok && p.Spec.NodeName != "" {
				if _, has := PendingCondition(p); has {
					return []string{p.Spec.SchedulerName}, nil
				}
			}
			return nil, nil
		}})
		if err != nil {
			return nil, err
		}
	}
	if _, err := pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj interface{}) { r.onPod(nil, obj) },
		UpdateFunc: func(old, obj interface{}) { r.onPod(old, obj) },
		DeleteFunc: func(obj interface{}) { r.onPodDelete(obj) },
	}); err != nil {
		return nil, err
	}
	if _, err := nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj interface{}) { r.onNodeAdd(obj) },
		UpdateFunc: func(old, obj interface{}) { r.onNodeUpdate(old, obj) },
	}); err != nil {
		return nil, err
	}
	return r, nil
}

// Pending tells whether a pod is one of ours and marked unschedulable, and
// since when.
func (r *Reconciler) pending(p *v1.Pod) (time.Time, bool) {
	if p.Spec.NodeName != "" || p.DeletionTimestamp != nil || p.Spec.SchedulerName != r.cfg.SchedulerName {
		return time.Time{}, false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse && c.Reason == v1.PodReasonUnschedulable {
			return c.LastTransitionTime.Time, true
		}
	}
	return time.Time{}, false
}

func (r *Reconciler) enqueue(p *v1.Pod) {
	if key, err := cache.MetaNamespaceKeyFunc(p); err == nil {
		r.queue.Add(key)
	}
}

func (r *Reconciler) onPod(old, obj interface{}) {
	p, ok := obj.(*v1.Pod)
	if !ok {
		return
	}
	if _, ok := r.pending(p); ok {
		if o, ok := old.(*v1.Pod); !ok || !sameJudgement(o, p) {
			r.enqueue(p)
		}
		return
	}
	if p.Spec.NodeName != "" {
		r.forget(p.UID)
	}
	if _, stale := PendingCondition(p); stale && p.Spec.NodeName != "" {
		r.enqueue(p) // bound: its reason goes
	}
	// A bound GPU pod that ended, or whose assignment changed, may have
	// freed devices (an assignment on a pod that asks for no GPU holds
	// nothing, and changing it frees nothing).
	o, ok := old.(*v1.Pod)
	if !ok || o.Spec.NodeName == "" || fault.DropFreedGPU() {
		return
	}
	if (o.Annotations[gpu.AnnotationAssignment] != p.Annotations[gpu.AnnotationAssignment] ||
		o.Annotations[hami.AnnotationAllocated] != p.Annotations[hami.AnnotationAllocated] ||
		o.Annotations[hami.AnnotationVGPUNode] != p.Annotations[hami.AnnotationVGPUNode] || terminal(p) && !terminal(o)) &&
		gpu.UsesGPU(p, r.reqOpts) {
		r.markDirty()
	}
}

// sameJudgement reports whether an update of a pending pod changed nothing
// that its reconcile reads: its spec, annotations and scheduling condition
// are as they were. Every pending-reason write is such an update, and so
// is the node agent's or a controller's touch of its status: reconciling
// it again would judge the same (and rebuild the view when it is old).
// A change of the cluster is what wakes pods; the resync catches the rest.
func sameJudgement(o, p *v1.Pod) bool {
	oc, pc := podScheduled(o), podScheduled(p)
	if oc == nil || pc == nil || oc.Status != pc.Status || oc.Reason != pc.Reason || oc.Message != pc.Message ||
		!oc.LastTransitionTime.Equal(&pc.LastTransitionTime) || !maps.Equal(o.Annotations, p.Annotations) {
		return false
	}
	return o.DeletionTimestamp.Equal(p.DeletionTimestamp) && equality.Semantic.DeepEqual(o.Spec, p.Spec)
}

func podScheduled(p *v1.Pod) *v1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == v1.PodScheduled {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

func terminal(p *v1.Pod) bool {
	return p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed
}

// onPodDelete wakes the reconciler only when a bound GPU pod leaves: CPU
// pods come and go all the time and free no device.
func (r *Reconciler) onPodDelete(obj interface{}) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	p, ok := obj.(*v1.Pod)
	if !ok {
		return
	}
	r.forget(p.UID)
	if p.Spec.NodeName != "" && gpu.UsesGPU(p, r.reqOpts) && !fault.DropFreedGPU() {
		r.markDirty()
	}
}

func (r *Reconciler) onNodeAdd(obj interface{}) {
	if n, ok := obj.(*v1.Node); ok && gpu.ReadInventory(n, r.gpu.Tracker().Options()).Count > 0 {
		r.markDirty()
	}
}

// onNodeUpdate wakes the reconciler only when the node's GPUs changed:
// heartbeats and the labels GPU Feature Discovery rewrites every minute
// change nothing a pending GPU pod waits for. (A node uncordoned or
// untainted wakes the pods through the scheduler's own hints; the resync
// catches what is left.)
func (r *Reconciler) onNodeUpdate(old, obj interface{}) {
	o, ok1 := old.(*v1.Node)
	n, ok2 := obj.(*v1.Node)
	if ok1 && ok2 && !r.gpu.SameDevices(o, n) {
		r.markDirty()
	}
}

// MarkDirty asks for every pending pod to be reconciled against a fresh
// view: devices were released without an event saying so.
func (r *Reconciler) MarkDirty() { r.markDirty() }

// markDirty asks for every pending pod to be reconciled against a fresh view.
func (r *Reconciler) markDirty() {
	select {
	case r.dirty <- struct{}{}:
	default:
	}
}

// Run reconciles until ctx ends.
func (r *Reconciler) Run(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName("requeue")
	ctx = klog.NewContext(ctx, logger)
	defer r.queue.ShutDown()
	defer r.writeQ.ShutDown()
	defer r.clearQ.ShutDown()
	if !cache.WaitForCacheSync(ctx.Done(), r.pods.HasSynced, r.nodes.HasSynced) {
		return
	}
	logger.Info("requeue reconciler started", "workers", r.cfg.Workers, "resync", r.cfg.ResyncPeriod)
	for i := 0; i < r.cfg.Workers; i++ {
		go wait.UntilWithContext(ctx, r.worker, time.Second)
	}
	go wait.UntilWithContext(ctx, func(ctx context.Context) { r.writer(ctx, r.writeQ, r.client) }, time.Second)
	go wait.UntilWithContext(ctx, func(ctx context.Context) { r.writer(ctx, r.clearQ, r.cfg.ClearClient) }, time.Second)
	// Changes are coalesced: a burst of events is one pass over the pending
	// pods, and the next pass waits four times as long as this one took (at
	// least 50 ms): under steady GPU churn, event passes take at most a fifth
	// of the reconciler's time. The hints are the fast path.
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-r.dirty:
				took := r.pass(ctx, "event")
				select {
				case <-ctx.Done():
					return
				case <-time.After(max(50*time.Millisecond, 4*took)):
				}
			}
		}
	}()
	go wait.UntilWithContext(ctx, func(ctx context.Context) {
		r.pass(ctx, "resync")
		r.sweepReservations(ctx)
		r.exportAllocation()
	}, r.cfg.ResyncPeriod)
	go wait.UntilWithContext(ctx, func(context.Context) { queueDepth.Set(float64(r.queue.Len())) }, time.Second)
	<-ctx.Done()
}

// pass reconciles every pending pod against a fresh view and waits until the
// workers are through (at most one resync period).
func (r *Reconciler) pass(ctx context.Context, trigger string) time.Duration {
	start := time.Now()
	if trigger == "resync" {
		r.recomputeAll()
	} else {
		r.invalidate()
	}
	n := r.enqueueAll(ctx)
	deadline := start.Add(r.cfg.ResyncPeriod)
	for r.queue.Len() > 0 && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
	took := time.Since(start)
	passSeconds.WithLabelValues(trigger).Observe(took.Seconds())
	klog.FromContext(ctx).V(4).Info("reconcile pass", "trigger", trigger, "pods", n, "duration", took)
	return took
}

func (r *Reconciler) enqueueAll(ctx context.Context) int {
	objs, err := r.pods.GetIndexer().ByIndex(pendingIndex, r.cfg.SchedulerName)
	if err != nil {
		return 0
	}
	n := 0
	for _, o := range objs {
		if p, ok := o.(*v1.Pod); ok {
			if _, ok := r.pending(p); ok {
				r.enqueue(p)
				n++
			} else if p.Spec.NodeName != "" {
				r.enqueue(p) // bound, its reason left
			}
		}
	}
	pendingPods.Set(float64(n))
	return n
}

func (r *Reconciler) worker(ctx context.Context) {
	for {
		key, quit := r.queue.Get()
		if quit {
			return
		}
		err := r.reconcile(ctx, key)
		if err != nil {
			klog.FromContext(ctx).V(2).Info("reconcile failed, retrying with backoff", "pod", key, "err", err)
			reconciles.WithLabelValues("error").Inc()
			r.queue.AddRateLimited(key)
		} else {
			r.queue.Forget(key)
		}
		r.queue.Done(key)
	}
}

// invalidate drops the view; one being built is dropped once built.
func (r *Reconciler) invalidate() {
	r.buildMu.Lock()
	r.current.Store(nil)
	r.buildMu.Unlock()
}

// recomputeAll drops the view and its bases: the next view computes every
// node again. The resync's view is the level truth, whatever a base's key
// may have missed.
func (r *Reconciler) recomputeAll() {
	r.buildMu.Lock()
	r.bases = nil
	r.current.Store(nil)
	r.buildMu.Unlock()
}

// viewNow returns the view, rebuilt if a change made it stale or it is old.
func (r *Reconciler) viewNow() *view {
	if v := r.current.Load(); v != nil && time.Since(v.built) < maxViewAge {
		return v
	}
	r.buildMu.Lock()
	defer r.buildMu.Unlock()
	if v := r.current.Load(); v != nil && time.Since(v.built) < maxViewAge {
		return v
	}
	v := newView()
	objs := r.nodes.GetIndexer().List()
	bases := make(map[string]*baseNode, len(objs))
	for _, o := range objs {
		n, ok := o.(*v1.Node)
		if !ok {
			continue
		}
		pods, ok := r.gpu.PodsOnNode(n.Name)
		if !ok {
			continue
		}
		b := r.bases[n.Name]
		if !b.reusable(r.gpu, n, pods, v.built) {
			b = newBaseNode(r.gpu.Tracker(), n, pods)
			r.computed.Add(1)
		}
		bases[n.Name] = b
		v.add(b.view(n))
	}
	r.bases = bases
	r.current.Store(v)
	return v
}

// RecordRejection notes which plugins rejected the pod's nodes in its last
// scheduling attempt (GPUFit's PostFilter): the reconciler activates only
// pods it can judge whole.
func (r *Reconciler) RecordRejection(pod *v1.Pod, plugins []string) {
	r.rejections.Store(pod.UID, rechecks(pod, plugins, r.reqOpts))
}

// ForgetRejection drops the record of the pod's last attempt (GPUFit's
// PreFilter, as the next attempt starts).
func (r *Reconciler) ForgetRejection(uid types.UID) { r.rejections.Delete(uid) }

func (r *Reconciler) forget(uid types.UID) {
	r.rejections.Delete(uid)
	r.activated.Delete(uid)
}

// mayActivate decides whether the reconciler may move a pod that some node
// can take to the active queue: once per failed attempt whose every
// rejection the view re-checks; with no record (the attempt failed after
// the filters, PostFilter did not run, or this process has not seen it), at
// most once per resync period, which is longer than the scheduler's longest
// backoff; never when something the view does not model blocked it.
func (r *Reconciler) mayActivate(pod *v1.Pod) bool {
	if whole, recorded := r.rejections.Load(pod.UID); recorded {
		return whole.(bool)
	}
	last, ok := r.activated.Load(pod.UID)
	return !ok || time.Since(last.(time.Time)) >= r.cfg.ResyncPeriod
}

// JudgedWhole reports whether the pod's last recorded attempt failed only on
// what the reconciler re-checks.
func (r *Reconciler) JudgedWhole(pod *v1.Pod) bool {
	v, ok := r.rejections.Load(pod.UID)
	return ok && v.(bool)
}

func (r *Reconciler) reconcile(ctx context.Context, key string) error {
	logger := klog.FromContext(ctx)
	obj, exists, err := r.pods.GetIndexer().GetByKey(key)
	if err != nil {
		return err
	}
	if !exists {
		reconciles.WithLabelValues("gone").Inc()
		return nil
	}
	pod := obj.(*v1.Pod)
	since, ok := r.pending(pod)
	if !ok {
		if _, stale := PendingCondition(pod); stale && pod.Spec.NodeName != "" && r.active() {
			// The binding cannot change the status: the reason of a pod
			// that was pending goes here.
			reconciles.WithLabelValues("cleared").Inc()
			return r.clearReason(ctx, pod)
		}
		reconciles.WithLabelValues("skipped").Inc()
		return nil
	}
	if !r.active() {
		// A standby: the leader takes care of it (resync brings it back).
		reconciles.WithLabelValues("inactive").Inc()
		return nil
	}
	if _, _, inFlight := r.gpu.Tracker().Reserved(pod.UID); inFlight {
		// Being bound right now: it looks pending until the bind lands.
		reconciles.WithLabelValues("skipped").Inc()
		return nil
	}
	req, perr := gpu.ParseRequest(pod, r.reqOpts)
	if perr != nil {
		reconciles.WithLabelValues("explained").Inc()
		r.classes.Store(pod.UID, pendingClass{key: key, class: ClassInvalid})
		return r.explain(ctx, pod, ReasonInvalidRequest, perr.Error())
	}
	if !req.HasGPU() {
		reconciles.WithLabelValues("skipped").Inc()
		return nil
	}
	// An activation books the pod's devices in the view, so that one freed
	// device wakes one pod.
	may := r.mayActivate(pod)
	vd := r.viewNow().checkShape(logger, pod, &req, r.gpu.Scoring(), r.gpu.Workload(), may)
	if vd.fits != nil {
		r.classes.Delete(pod.UID)
		// Its GPUs are there: no GPU reason stands.
		r.writes.Delete(key)
		if _, has := PendingCondition(pod); has {
			r.clearReason(ctx, pod)
		}
	}
	if vd.fits != nil && !may {
		// Something else holds it, which the scheduler's own hints and
		// backoff look after.
		reconciles.WithLabelValues("blocked").Inc()
		return nil
	}
	if vd.fits != nil {
		r.rejections.Delete(pod.UID)
		r.activated.Store(pod.UID, time.Now())
		logger.V(3).Info("a node can take the pod now: activating", "pod", klog.KObj(pod), "node", vd.fits.node.Name)
		r.activator.Activate(logger, map[string]*v1.Pod{key: pod})
		activations.Inc()
		if !since.IsZero() {
			activationLatency.Observe(time.Since(since).Seconds())
		}
		reconciles.WithLabelValues("activated").Inc()
		return nil
	}
	reconciles.WithLabelValues("pending").Inc()
	r.classes.Store(pod.UID, pendingClass{key: key, class: vd.class})
	return r.explain(ctx, pod, ReasonUnschedulable, vd.message)
}

// PendingCondition returns the pod's pending-reason condition, if it has one.
func PendingCondition(p *v1.Pod) (*v1.PodCondition, bool) {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == gpu.ConditionPending {
			return &p.Status.Conditions[i], true
		}
	}
	return nil, false
}

// Reasons of the pending-reason condition.
const (
	ReasonUnschedulable  = "Unschedulable"
	ReasonInvalidRequest = "InvalidRequest"
)

// reasonWrite is the latest reason judged for a pod, waiting for the
// writer.
type reasonWrite struct {
	clear       bool
	reason, msg string
	// rv is the version of the pod that was judged: the write goes only
	// over that state.
	rv string
}

// explain keeps the pending reason current: written only when it changed, so
// a quiet cluster causes no writes. It is a pod condition, written through
// pods/status, which the scheduler may patch anyway: no right to change a
// pod's spec, labels or annotations is needed. The write itself is the
// writer's: the reconcile never waits for the reasons' rate limit.
func (r *Reconciler) explain(_ context.Context, pod *v1.Pod, reason, msg string) error {
	key := pod.Namespace + "/" + pod.Name
	cur, had := PendingCondition(pod)
	if !r.cfg.Explain || (had && cur.Message == msg && cur.Reason == reason && cur.Status == v1.ConditionTrue) {
		r.writes.Delete(key)
		return nil
	}
	r.writes.Store(key, reasonWrite{reason: reason, msg: msg, rv: pod.ResourceVersion})
	r.writtenMu.Lock()
	last, seen := r.written[key]
	r.writtenMu.Unlock()
	if wait := r.cfg.ExplainEvery - time.Since(last); seen && wait > 0 {
		// Written when the interval ends: whatever is current then.
		r.writeQ.AddAfter(key, wait)
		return nil
	}
	r.writeQ.Add(key)
	return nil
}

// clearReason removes the reason of a pod that was bound.
func (r *Reconciler) clearReason(_ context.Context, pod *v1.Pod) error {
	key := pod.Namespace + "/" + pod.Name
	r.writes.Store(key, reasonWrite{clear: true})
	r.clearQ.Add(key)
	return nil
}

func (r *Reconciler) writer(ctx context.Context, q workqueue.TypedRateLimitingInterface[string], client kubernetes.Interface) {
	for {
		key, quit := q.Get()
		if quit {
			return
		}
		if err := r.write(ctx, key, client); err != nil {
			klog.FromContext(ctx).V(2).Info("writing a pending reason failed, retrying with backoff", "pod", key, "err", err)
			q.AddRateLimited(key)
		} else {
			q.Forget(key)
		}
		q.Done(key)
	}
}

// write sends the latest reason judged for a pod, if the pod still needs it.
func (r *Reconciler) write(ctx context.Context, key string, client kubernetes.Interface) error {
	v, ok := r.writes.Load(key)
	if !ok {
		return nil
	}
	w := v.(reasonWrite)
	done := func() { r.writes.CompareAndDelete(key, v) }
	obj, exists, err := r.pods.GetIndexer().GetByKey(key)
	if err != nil {
		return err
	}
	if !exists || !r.active() {
		done()
		return nil
	}
	pod := obj.(*v1.Pod)
	cur, had := PendingCondition(pod)
	var patch []byte
	if w.clear {
		if !had {
			done()
			return nil
		}
		patch, err = json.Marshal(map[string]any{"status": map[string]any{"conditions": []any{
			map[string]any{"type": gpu.ConditionPending, "$patch": "delete"}}}})
	} else {
		if _, pending := r.pending(pod); !pending || (had && cur.Message == w.msg && cur.Reason == w.reason && cur.Status == v1.ConditionTrue) {
			done()
			return nil
		}
		since := metav1.Now()
		if had && cur.Status == v1.ConditionTrue {
			since = cur.LastTransitionTime
		}
		patch, err = json.Marshal(map[string]any{
			"metadata": map[string]any{"resourceVersion": w.rv}, // only over the state judged
			"status": map[string]any{"conditions": []any{map[string]any{
				"type": gpu.ConditionPending, "status": v1.ConditionTrue, "reason": w.reason, "message": w.msg,
				"lastTransitionTime": since,
			}}},
		})
	}
	if err != nil {
		return err
	}
	_, err = client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, patch, metav1PatchOptions, "status")
	switch {
	case apierrors.IsNotFound(err):
		done()
		return nil
	case apierrors.IsConflict(err):
		// The pod changed since it was judged: judge it again (its
		// update may be one that wakes no reconcile, sameJudgement). The
		// next write waits out the spacing, as after a write: an informer
		// that lags cannot make it retry against the same version at
		// the writer's full rate.
		done()
		r.markWritten(key)
		r.queue.AddRateLimited(key)
		return nil
	case err != nil:
		return fmt.Errorf("writing the %s condition: %w", gpu.ConditionPending, err)
	}
	done()
	if w.clear {
		return nil
	}
	reasonWrites.Inc()
	r.markWritten(key)
	return nil
}

// markWritten starts the spacing of the pod's next reason write.
func (r *Reconciler) markWritten(key string) {
	r.writtenMu.Lock()
	r.written[key] = time.Now()
	if len(r.written) > 100000 {
		r.written = map[string]time.Time{} // bounded; a reset only allows one early write
	}
	r.writtenMu.Unlock()
}

// sweepReservations drops reservations whose pod is gone, or whose pod has
// carried its assignment in the informer for longer than the grace.
func (r *Reconciler) sweepReservations(ctx context.Context) {
	tr := r.gpu.Tracker()
	for _, e := range tr.Reservations() {
		obj, exists, err := r.pods.GetIndexer().GetByKey(e.Namespace + "/" + e.Name)
		if err != nil {
			continue
		}
		var p *v1.Pod
		if exists {
			p = obj.(*v1.Pod)
		}
		gone := p == nil || p.UID != e.UID
		// Bound (here with its assignment, or by another binder, or
		// elsewhere) for longer than the scheduler's cache needs to see it:
		// the pod itself counts now.
		done := !gone && p.Spec.NodeName != "" && time.Since(e.Since) > r.cfg.ReservationGrace
		if (gone || done) && tr.Unreserve(e.UID) {
			staleReservations.Inc()
			klog.FromContext(ctx).V(3).Info("dropped a stale reservation", "pod", klog.KRef(e.Namespace, e.Name), "node", e.Node, "gone", gone)
		}
	}
}

type pendingClass struct{ key, class string }

// exportAllocation publishes allocated and schedulable milli-GPU per node,
// fragmentation against the target workload per node and cluster-wide, how
// many more pods of each typical kind would fit, and the pending GPU pods by
// class. Only the leader publishes them (a standby's would count every node
// twice in a sum), and all are computed before any is replaced, so that a
// scrape sees few gaps.
func (r *Reconciler) exportAllocation() {
	if !r.active() {
		resetAllocation()
		pendingByClass.Reset()
		pendingAge.Reset()
		gangPending.Reset()
		gangPendingAge.Reset()
		clusterIdle.Set(0)
		clusterFrag.Set(0)
		clusterFragRatio.Set(0)
		return
	}
	r.invalidate()
	wl := r.gpu.Workload()
	var tasks []gpu.Task
	if wl != nil {
		tasks = gpu.TopGPUTasks(wl, maxTaskSeries)
	}
	room := make([]int64, len(tasks))
	needsDelivery := r.reqOpts.NeedsDelivery
	var idle int64
	var frag float64
	var rows []nodeRow
	for _, nv := range r.viewNow().nodes {
		nv.mu.Lock()
		st := nv.gpu
		cpuFree, memFree := nv.cpuFree, nv.memFree>>20
		nv.mu.Unlock()
		row := nodeRow{node: nv.node.Name, model: st.Model, unhealthy: st.Unhealthy}
		usable := int64(st.Usable())
		if usable > 0 {
			row.hasCapacity = true
			row.allocated, row.capacity = usable*gpu.MilliPerGPU-st.Idle(), usable*gpu.MilliPerGPU
			idle += st.Idle()
			if wl != nil {
				row.frag, row.hasFrag = gpu.FragAt(wl, st, cpuFree, needsDelivery), true
				frag += row.frag
			}
			if !nv.node.Spec.Unschedulable {
				for i := range tasks {
					room[i] += st.Room(&tasks[i], cpuFree, memFree, needsDelivery)
				}
			}
		}
		rows = append(rows, row)
	}
	if rows == nil {
		rows = []nodeRow{}
	}
	nodeMetrics.set(rows)
	placeable.Reset()
	taskShare.Reset()
	clusterIdle.Set(float64(idle))
	clusterFrag.Set(frag)
	ratio := 0.0
	if idle > 0 {
		ratio = frag / float64(idle)
	}
	clusterFragRatio.Set(ratio)
	for i := range tasks {
		k := gpu.TaskKind(tasks[i])
		placeable.WithLabelValues(k).Set(float64(room[i]))
		taskShare.WithLabelValues(k).Set(tasks[i].Weight)
	}
	r.exportPending()
}

func resetAllocation() {
	nodeMetrics.set(nil)
	placeable.Reset()
	taskShare.Reset()
}

// maxTaskSeries bounds the typical kinds of pod exported (their label).
const maxTaskSeries = 8

// exportPending counts the pending GPU pods by the class of their last
// verdict, dropping those no longer pending.
func (r *Reconciler) exportPending() {
	counts := map[string]int{ClassFragmented: 0, ClassCapacity: 0, ClassUnsuitable: 0, ClassOther: 0, ClassInvalid: 0}
	oldest := map[string]float64{ClassFragmented: 0, ClassCapacity: 0, ClassUnsuitable: 0, ClassOther: 0, ClassInvalid: 0}
	now := time.Now()
	r.classes.Range(func(k, v any) bool {
		pc := v.(pendingClass)
		obj, exists, err := r.pods.GetIndexer().GetByKey(pc.key)
		if err != nil || !exists {
			r.classes.Delete(k)
			return true
		}
		p := obj.(*v1.Pod)
		since, pending := r.pending(p)
		if p.UID != k.(types.UID) || !pending {
			r.classes.Delete(k)
			return true
		}
		counts[pc.class]++
		if !since.IsZero() {
			oldest[pc.class] = max(oldest[pc.class], now.Sub(since).Seconds())
		}
		return true
	})
	for class, n := range counts {
		pendingByClass.WithLabelValues(class).Set(float64(n))
		pendingAge.WithLabelValues(class).Set(oldest[class])
	}
	r.exportGangs(now)
}

// exportGangs publishes the unbound members of pod groups and the age of
// the oldest: a gang member waits for the others (gated at PreEnqueue, or
// holding its node at Permit), often with no unschedulable condition of
// its own, so its wait is counted from its creation.
func (r *Reconciler) exportGangs(now time.Time) {
	objs, err := r.pods.GetIndexer().ByIndex(pendingIndex, r.cfg.SchedulerName)
	if err != nil {
		return
	}
	n, oldest := 0, 0.0
	for _, o := range objs {
		p, ok := o.(*v1.Pod)
		if !ok || p.Spec.NodeName != "" || p.DeletionTimestamp != nil || p.Spec.SchedulingGroup == nil ||
			p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
			continue
		}
		n++
		oldest = max(oldest, now.Sub(p.CreationTimestamp.Time).Seconds())
	}
	gangPending.WithLabelValues(r.cfg.SchedulerName).Set(float64(n))
	gangPendingAge.WithLabelValues(r.cfg.SchedulerName).Set(oldest)
}

var metav1PatchOptions = metav1.PatchOptions{}

func equalTaints(a, b []v1.Taint) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].MatchTaint(&b[i]) || a[i].Value != b[i].Value {
			return false
		}
	}
	return true
}
