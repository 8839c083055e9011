// Package overcommit surfaces nodes whose bound pods hold more GPU than the
// node has. The scheduler cannot stop another binder (the default scheduler
// does not see shares), a shrinking allocatable, or colliding writes from
// putting a node there; GPUFit stops placing GPU pods on it, and this
// monitor says so: a gauge, an Event on the node, and a log line that names
// the pods involved. It works the level way: any change to a node or to a GPU
// pod bound to it puts the node's name on a work queue, and a worker judges
// the node from the informers' current view; a periodic resync re-judges
// every node.
package overcommit

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/agent/hami"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/internal/objects"
)

// Event reasons on nodes.
const (
	ReasonOvercommitted = "GPUOvercommitted"
	ReasonResolved      = "GPUOvercommitResolved"
	ReasonTooManyGPUs   = "TooManyGPUs"
	// ReasonGPUsSeenTwice: a DRA driver publishes the node's GPUs and a
	// device plugin advertises them too.
	ReasonGPUsSeenTwice = "GPUsSeenTwice"
	// ReasonAssignmentIgnored is on a pod whose assignment does not agree
	// with its request (edited, forged, or left from another node).
	ReasonAssignmentIgnored = "GPUAssignmentIgnored"
)

var (
	overcommittedNodes = metrics.NewGauge(&metrics.GaugeOpts{
		Subsystem: "gpu_scheduler", Name: "overcommitted_nodes", StabilityLevel: metrics.ALPHA,
		Help: "Nodes whose bound pods hold more GPU than the node has; gpu-scheduler places no GPU pod there until they fit.",
	})
	overcommitted = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Subsystem: "gpu_scheduler", Name: "node_overcommitted", StabilityLevel: metrics.ALPHA,
		Help: "1 for each node whose bound pods hold more GPU than it has (no series for the others).",
	}, []string{"node"})
	refusedNodes = metrics.NewGauge(&metrics.GaugeOpts{
		Subsystem: "gpu_scheduler", Name: "refused_nodes", StabilityLevel: metrics.ALPHA,
		Help: "Nodes that report more GPUs than gpu-scheduler tracks (64); they take no GPU pod of ours.",
	})
	leader = metrics.NewGauge(&metrics.GaugeOpts{
		Subsystem: "gpu_scheduler", Name: "leader", StabilityLevel: metrics.ALPHA,
		Help: "1 on the gpu-scheduler replica that leads (holds the lease and schedules), 0 on a standby.",
	})
	reservations = metrics.NewGauge(&metrics.GaugeOpts{
		Subsystem: "gpu_scheduler", Name: "reservations", StabilityLevel: metrics.ALPHA,
		Help: "In-flight device reservations (chosen, not yet seen bound with their assignment).",
	})
	oldestReservation = metrics.NewGauge(&metrics.GaugeOpts{
		Subsystem: "gpu_scheduler", Name: "oldest_reservation_age_seconds", StabilityLevel: metrics.ALPHA,
		Help: "Age of the oldest in-flight device reservation (0 without any); a reservation is retired seconds after its bind, so one that ages is leaked.",
	})
	registerOnce sync.Once
)

// Source is the scheduler's device accounting.
type Source interface {
	Tracker() *gpu.Tracker
	PodsOnNode(node string) ([]*v1.Pod, bool)
}

// Monitor judges nodes for overcommit.
type Monitor struct {
	src   Source
	nodes cache.SharedIndexInformer
	pods  cache.SharedIndexInformer
	// releaseLock releases a node's HAMi lock whose holder will never be
	// served, as staleLock judges it (nil: not configured).
	releaseLock func(ctx context.Context, node, value string) (bool, error)
	staleLock   func(p *v1.Pod, node string, since time.Time) bool
	recorder    events.EventRecorder
	// active reports whether this process schedules (the leader): only the
	// leader writes Events and logs; every replica keeps the gauges.
	active  func() bool
	reqOpts gpu.RequestOptions
	resync  time.Duration
	// grace is how long a node must stay overcommitted before it is
	// reported: a device plugin or kubelet that restarts reports no
	// devices for a moment, and that is not worth a Warning.
	grace time.Duration
	queue workqueue.TypedRateLimitingInterface[string]

	mu          sync.Mutex
	over        map[string]time.Time // overcommitted since, as last judged
	told        map[string]bool      // overcommitted, as last reported by Event
	refused     map[string]bool
	toldRefused map[string]bool
	toldTwice   map[string]bool
	// ignored are the pods told that their assignment does not count.
	ignored map[types.UID]bool
	// handshook are the pods whose failed handshake was reported.
	handshook        map[types.UID]bool
	handshakeTimeout time.Duration
}

// Grace is the default time a node must stay overcommitted to be reported.
const Grace = 10 * time.Second

// New wires the monitor to the informers; Run starts it.
func New(src Source, pods, nodes cache.SharedIndexInformer, recorder events.EventRecorder, active func() bool,
	reqOpts gpu.RequestOptions, resync, handshakeTimeout time.Duration) (*Monitor, error) {
	registerOnce.Do(func() {
		legacyregistry.MustRegister(overcommittedNodes, overcommitted, refusedNodes, reservations, oldestReservation, handshakeFailures, leader)
		// Both series from the start: an alert on their increase needs
		// them before the first failure.
		for _, reason := range []string{"failed", "expired"} {
			handshakeFailures.WithLabelValues(reason)
		}
	})
	m := &Monitor{src: src, nodes: nodes, pods: pods, recorder: recorder, active: active, reqOpts: reqOpts, resync: resync, grace: Grace,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "gpu-scheduler-overcommit"}),
		over: map[string]time.Time{}, told: map[string]bool{}, refused: map[string]bool{}, toldRefused: map[string]bool{}, toldTwice: map[string]bool{},
		ignored: map[types.UID]bool{}, handshook: map[types.UID]bool{}, handshakeTimeout: handshakeTimeout}
	if _, err := pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj interface{}) { m.onPod(nil, obj) },
		UpdateFunc: func(old, obj interface{}) {
			m.onPod(old, obj)
		},
		DeleteFunc: func(obj interface{}) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			m.onPod(nil, obj)
		},
	}); err != nil {
		return nil, err
	}
	if _, err := nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj interface{}) { m.onNode(obj) },
		UpdateFunc: m.onNodeUpdate,
		DeleteFunc: func(obj interface{}) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			m.onNode(obj)
		},
	}); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *Monitor) onPod(old, obj interface{}) {
	p, ok := obj.(*v1.Pod)
	if !ok {
		return
	}
	o, _ := old.(*v1.Pod)
	m.checkHandshake(p, time.Now())
	if o != nil && o.Spec.NodeName != "" && o.Spec.NodeName != p.Spec.NodeName {
		m.queue.Add(o.Spec.NodeName)
	}
	if p.Spec.NodeName == "" || !(m.holds(p) || (o != nil && m.holds(o))) {
		return
	}
	if o != nil && o.Spec.NodeName == p.Spec.NodeName && samePhase(o, p) &&
		o.Annotations[gpu.AnnotationAssignment] == p.Annotations[gpu.AnnotationAssignment] &&
		gpu.SameRequestAnnotations(o, p) && gpu.WholeGPUs(o, m.reqOpts) == gpu.WholeGPUs(p, m.reqOpts) {
		return // a status change of a running pod: it holds what it held
	}
	m.queue.Add(p.Spec.NodeName)
}

// samePhase: a pod's start (Pending to Running) changes nothing it holds, so
// judging its node again would judge every GPU pod's node twice; an end
// (Succeeded, Failed) does. A pod in HAMi's handshake is the exception: its
// start is what lets a node lock it left behind be released
// (hami.StaleHolder).
func samePhase(o, p *v1.Pod) bool {
	if _, handshake := p.Annotations[hami.AnnotationBindPhase]; handshake {
		return o.Status.Phase == p.Status.Phase
	}
	return ended(o) == ended(p)
}

func ended(p *v1.Pod) bool {
	return p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed
}

// holds is whether a pod may hold devices, or claims to.
func (m *Monitor) holds(p *v1.Pod) bool {
	_, claims := p.Annotations[gpu.AnnotationAssignment]
	return claims || gpu.UsesGPU(p, m.reqOpts)
}

// onNodeUpdate judges a node again when what its device inventory is read
// from changed. Heartbeats do not change it, nor do the labels GPU Feature
// Discovery rewrites every minute on every node (its timestamp).
func (m *Monitor) onNodeUpdate(old, obj interface{}) {
	o, ok1 := old.(*v1.Node)
	n, ok2 := obj.(*v1.Node)
	if ok1 && ok2 && objects.SameDevices(o, n, m.src.Tracker().Options()) {
		return
	}
	m.onNode(obj)
}

func (m *Monitor) onNode(obj interface{}) {
	if n, ok := obj.(*v1.Node); ok {
		m.queue.Add(n.Name)
	}
}

// Run judges nodes until ctx ends.
func (m *Monitor) Run(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName("overcommit")
	ctx = klog.NewContext(ctx, logger)
	defer m.queue.ShutDown()
	if !cache.WaitForCacheSync(ctx.Done(), m.nodes.HasSynced) {
		return
	}
	go wait.UntilWithContext(ctx, m.worker, time.Second)
	go wait.UntilWithContext(ctx, func(context.Context) {
		for _, k := range m.nodes.GetIndexer().ListKeys() {
			m.queue.Add(k)
		}
		// Judged nodes that are gone by now.
		m.mu.Lock()
		for n := range m.over {
			m.queue.Add(n)
		}
		for n := range m.refused {
			m.queue.Add(n)
		}
		m.mu.Unlock()
	}, m.resync)
	go wait.UntilWithContext(ctx, func(context.Context) {
		reservations.Set(float64(m.src.Tracker().ReservationCount()))
		if at := m.src.Tracker().OldestReservation(); at.IsZero() {
			oldestReservation.Set(0)
		} else {
			oldestReservation.Set(time.Since(at).Seconds())
		}
		if m.active() {
			leader.Set(1)
		} else {
			leader.Set(0)
		}
	}, time.Second)
	<-ctx.Done()
}

func (m *Monitor) worker(ctx context.Context) {
	for {
		key, quit := m.queue.Get()
		if quit {
			return
		}
		if err := m.check(ctx, key); err != nil {
			m.queue.AddRateLimited(key)
		} else {
			m.queue.Forget(key)
		}
		m.queue.Done(key)
	}
}

// check judges one node from the current view.
func (m *Monitor) check(ctx context.Context, name string) error {
	logger := klog.FromContext(ctx)
	obj, exists, err := m.nodes.GetIndexer().GetByKey(name)
	if err != nil {
		return err
	}
	var node *v1.Node
	if exists {
		node, _ = obj.(*v1.Node)
	}
	if node == nil {
		m.set(name, false, false)
		m.mu.Lock()
		delete(m.told, name)
		delete(m.toldRefused, name)
		delete(m.toldTwice, name)
		m.mu.Unlock()
		return nil
	}
	pods, ok := m.src.PodsOnNode(name)
	if !ok {
		return fmt.Errorf("no pod informer")
	}
	now := time.Now()
	for _, p := range pods {
		m.checkHandshake(p, now)
	}
	holdings, st := m.src.Tracker().Explain(node, pods)
	tooMany := st.TooMany()
	// A node we do not track is refused outright; its pods are not ours to
	// judge.
	over := st.Overcommitted && !tooMany
	since := m.set(name, over, tooMany)
	active := m.active == nil || m.active()
	if !active {
		return nil
	}
	m.checkLock(ctx, node)
	m.mu.Lock()
	told, toldRefused, toldTwice := m.told[name], m.toldRefused[name], m.toldTwice[name]
	m.toldTwice[name] = st.DoubleView != ""
	m.mu.Unlock()
	if st.DoubleView != "" && !toldTwice {
		logger.Info("the node's GPUs are published through DRA and advertised by a device plugin: each counts once, as DRA publishes it",
			"node", klog.KObj(node), "devicePlugin", st.DoubleView)
		m.event(node, v1.EventTypeWarning, ReasonGPUsSeenTwice,
			"the GPUs are published through DRA and %s: both would hand out the same devices. gpu-scheduler counts each GPU once, as DRA publishes it, and lays the device plugin's pods on them; run one of the two", st.DoubleView)
	}

	m.tellIgnored(holdings)
	if tooMany && !toldRefused {
		logger.Info("node reports more GPUs than gpu-scheduler tracks; it takes no GPU pod of ours",
			"node", klog.KObj(node), "gpus", st.Reported, "max", gpu.MaxDevices)
		m.event(node, v1.EventTypeWarning, ReasonTooManyGPUs,
			"node reports %d GPUs, more than gpu-scheduler tracks (%d): it takes no GPU pod scheduled by gpu-scheduler", st.Reported, gpu.MaxDevices)
		m.mu.Lock()
		m.toldRefused[name] = true
		m.mu.Unlock()
	}
	switch {
	case over && !told:
		if wait := m.grace - time.Since(since); wait > 0 {
			m.queue.AddAfter(name, wait) // report it if it lasts
			return nil
		}
		var misfits, all []string
		for _, h := range holdings {
			desc := fmt.Sprintf("%s/%s %dx%dm (%s", h.Namespace, h.Name, h.Devices, h.Milli, h.Source)
			if h.Ignored != "" {
				desc += "; " + h.Ignored
			}
			all = append(all, desc+")")
			if !h.Fits {
				misfits = append(misfits, h.Namespace+"/"+h.Name)
			}
		}
		sort.Strings(misfits)
		logger.Info("GPUs overcommitted: the pods bound to the node hold more than its devices have; no GPU pod of ours goes there until they fit",
			"node", klog.KObj(node), "devices", st.Count, "unhealthy", st.Unhealthy, "doNotFit", misfits, "pods", all)
		note := "pods bound to this node hold more GPU than it has"
		claims := slices.ContainsFunc(holdings, func(h gpu.Holding) bool { return h.Source == gpu.HoldClaim })
		switch {
		case len(misfits) > 0:
			note += "; counted beyond its devices: " + strings.Join(misfits, ", ")
		case claims:
			note += " (DRA claims and assignments collide on a device)"
		default:
			note += " (assignments collide on a device)"
		}
		m.event(node, v1.EventTypeWarning, ReasonOvercommitted, "%s; gpu-scheduler places no GPU pod here until they fit", note)
		m.mu.Lock()
		m.told[name] = true
		m.mu.Unlock()
	case !over && told && !tooMany:
		logger.Info("GPU overcommit resolved", "node", klog.KObj(node))
		m.event(node, v1.EventTypeNormal, ReasonResolved, "the pods bound to this node fit its GPUs again")
		m.mu.Lock()
		delete(m.told, name)
		m.mu.Unlock()
	}
	if !tooMany {
		m.mu.Lock()
		delete(m.toldRefused, name)
		m.mu.Unlock()
	}
	return nil
}

// tellIgnored puts an Event, once, on each pod whose assignment does not
// count: an edited or forged annotation is worth knowing about.
func (m *Monitor) tellIgnored(holdings []gpu.Holding) {
	for _, h := range holdings {
		if h.Ignored == "" {
			continue
		}
		m.mu.Lock()
		told := m.ignored[h.UID]
		if !told {
			if len(m.ignored) >= 100000 {
				m.ignored = map[types.UID]bool{} // bounded; a reset only repeats an Event
			}
			m.ignored[h.UID] = true
		}
		m.mu.Unlock()
		if told || m.recorder == nil {
			continue
		}
		pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: h.Namespace, Name: h.Name, UID: h.UID}}
		if h.Source == gpu.HoldAgent {
			m.recorder.Eventf(pod, nil, v1.EventTypeWarning, ReasonAssignmentIgnored, "Scheduling", "%s", h.Ignored)
			continue
		}
		m.recorder.Eventf(pod, nil, v1.EventTypeWarning, ReasonAssignmentIgnored, "Scheduling",
			"%s: it counts for what it requests, not for the assignment", h.Ignored)
	}
}

func (m *Monitor) event(node *v1.Node, typ, reason, note string, args ...any) {
	if m.recorder == nil {
		return
	}
	m.recorder.Eventf(node, nil, typ, reason, "Scheduling", note, args...)
}

// set records a node's verdict and keeps the gauges; it returns since when
// the node is overcommitted.
func (m *Monitor) set(name string, over, tooMany bool) time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	since, was := m.over[name]
	if over {
		if !was {
			since = time.Now()
			m.over[name] = since
		}
		overcommitted.WithLabelValues(name).Set(1)
	} else {
		delete(m.over, name)
		overcommitted.DeleteLabelValues(name)
	}
	if tooMany {
		m.refused[name] = true
	} else {
		delete(m.refused, name)
	}
	overcommittedNodes.Set(float64(len(m.over)))
	refusedNodes.Set(float64(len(m.refused)))
	return since
}

// Touch has a node judged again: what its devices hold changed outside the
// node and its pods (a DRA claim or slice).
func (m *Monitor) Touch(node string) { m.queue.Add(node) }

// Overcommitted lists the nodes judged overcommitted (tests, tools).
func (m *Monitor) Overcommitted() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for n := range m.over {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
