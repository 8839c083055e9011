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
	"sort"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
)

// Event reasons on nodes.
const (
	ReasonOvercommitted = "GPUOvercommitted"
	ReasonResolved      = "GPUOvercommitResolved"
	ReasonTooManyGPUs   = "TooManyGPUs"
)

var (
	overcommittedNodes = metrics.NewGauge(&metrics.GaugeOpts{
		Subsystem: "gpu_scheduler", Name: "overcommitted_nodes", StabilityLevel: metrics.ALPHA,
		Help: "Nodes whose bound pods hold more GPU than the node has; gpu-scheduler places no GPU pod there until they fit.",
	})
	overcommitted = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Subsystem: "gpu_scheduler", Name: "node_overcommitted_milli", StabilityLevel: metrics.ALPHA,
		Help: "Per overcommitted node, the milli-GPU held by pods that do not fit its devices.",
	}, []string{"node"})
	refusedNodes = metrics.NewGauge(&metrics.GaugeOpts{
		Subsystem: "gpu_scheduler", Name: "refused_nodes", StabilityLevel: metrics.ALPHA,
		Help: "Nodes that report more GPUs than gpu-scheduler tracks (64); they take no GPU pod of ours.",
	})
	reservations = metrics.NewGauge(&metrics.GaugeOpts{
		Subsystem: "gpu_scheduler", Name: "reservations", StabilityLevel: metrics.ALPHA,
		Help: "In-flight device reservations (chosen, not yet seen bound with their assignment).",
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
	src      Source
	nodes    cache.SharedIndexInformer
	recorder events.EventRecorder
	// active reports whether this process schedules (the leader): only the
	// leader writes Events and logs; every replica keeps the gauges.
	active  func() bool
	reqOpts gpu.RequestOptions
	resync  time.Duration
	queue   workqueue.TypedRateLimitingInterface[string]

	mu      sync.Mutex
	over    map[string]bool // overcommitted, as last judged
	told    map[string]bool // overcommitted, as last reported by Event
	refused map[string]bool
}

// New wires the monitor to the informers; Run starts it.
func New(src Source, pods, nodes cache.SharedIndexInformer, recorder events.EventRecorder, active func() bool,
	reqOpts gpu.RequestOptions, resync time.Duration) (*Monitor, error) {
	registerOnce.Do(func() {
		legacyregistry.MustRegister(overcommittedNodes, overcommitted, refusedNodes, reservations)
	})
	m := &Monitor{src: src, nodes: nodes, recorder: recorder, active: active, reqOpts: reqOpts, resync: resync,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "gpu-scheduler-overcommit"}),
		over: map[string]bool{}, told: map[string]bool{}, refused: map[string]bool{}}
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
		AddFunc: func(obj interface{}) { m.onNode(obj) },
		UpdateFunc: func(old, obj interface{}) {
			o, ok1 := old.(*v1.Node)
			n, ok2 := obj.(*v1.Node)
			// Heartbeats change nothing a device count depends on.
			if ok1 && ok2 && equalResources(o.Status.Allocatable, n.Status.Allocatable) &&
				equalResources(o.Status.Capacity, n.Status.Capacity) && equalLabels(o.Labels, n.Labels) {
				return
			}
			m.onNode(obj)
		},
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
	if o, ok := old.(*v1.Pod); ok && o.Spec.NodeName != "" && o.Spec.NodeName != p.Spec.NodeName {
		m.queue.Add(o.Spec.NodeName)
	}
	if p.Spec.NodeName == "" || !gpu.UsesGPU(p, m.reqOpts) {
		return
	}
	if o, ok := old.(*v1.Pod); ok && o.Spec.NodeName == p.Spec.NodeName && o.Status.Phase == p.Status.Phase &&
		o.Annotations[gpu.AnnotationAssignment] == p.Annotations[gpu.AnnotationAssignment] {
		return // a status change of a running pod: it holds what it held
	}
	m.queue.Add(p.Spec.NodeName)
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
		m.mu.Unlock()
	}, m.resync)
	go wait.UntilWithContext(ctx, func(context.Context) {
		reservations.Set(float64(m.src.Tracker().ReservationCount()))
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
		m.set(name, false, false, 0)
		return nil
	}
	pods, ok := m.src.PodsOnNode(name)
	if !ok {
		return fmt.Errorf("no pod informer")
	}
	holdings, st := m.src.Tracker().Explain(node, pods)
	tooMany := st.TooMany()
	var excess int64
	var misfits, all []string
	for _, h := range holdings {
		desc := fmt.Sprintf("%s/%s %dx%dm (%s", h.Namespace, h.Name, h.Devices, h.Milli, h.Source)
		if h.Ignored != "" {
			desc += "; " + h.Ignored
		}
		desc += ")"
		all = append(all, desc)
		if !h.Fits {
			misfits = append(misfits, h.Namespace+"/"+h.Name)
			excess += int64(h.Devices) * int64(h.Milli)
		}
	}
	sort.Strings(misfits)
	over := st.Overcommitted
	wasOver, told, wasRefused := m.set(name, over, tooMany, excess)
	active := m.active == nil || m.active()

	if tooMany && !wasRefused {
		logger.Info("node reports more GPUs than gpu-scheduler tracks; it takes no GPU pod of ours",
			"node", klog.KObj(node), "gpus", st.Reported, "max", gpu.MaxDevices)
		m.event(node, v1.EventTypeWarning, ReasonTooManyGPUs,
			"node reports %d GPUs, more than gpu-scheduler tracks (%d): it takes no GPU pod scheduled by gpu-scheduler", st.Reported, gpu.MaxDevices)
	}
	switch {
	case over && (!wasOver || (active && !told)):
		if !active {
			return nil
		}
		logger.Info("GPUs overcommitted: the pods bound to the node hold more than its devices have; no GPU pod of ours goes there until they fit",
			"node", klog.KObj(node), "devices", st.Count, "doNotFit", misfits, "pods", all)
		note := "pods bound to this node hold more GPU than it has"
		if len(misfits) > 0 {
			note += "; counted beyond its devices: " + strings.Join(misfits, ", ")
		} else {
			note += " (assignments collide on a device)"
		}
		m.event(node, v1.EventTypeWarning, ReasonOvercommitted, "%s; gpu-scheduler places no GPU pod here until they fit", note)
		m.mu.Lock()
		m.told[name] = true
		m.mu.Unlock()
	case !over && told:
		if active {
			logger.Info("GPU overcommit resolved", "node", klog.KObj(node))
			m.event(node, v1.EventTypeNormal, ReasonResolved, "the pods bound to this node fit its GPUs again")
		}
		m.mu.Lock()
		delete(m.told, name)
		m.mu.Unlock()
	}
	return nil
}

func (m *Monitor) event(node *v1.Node, typ, reason, note string, args ...any) {
	if m.recorder == nil || (m.active != nil && !m.active()) {
		return
	}
	m.recorder.Eventf(node, nil, typ, reason, "Scheduling", note, args...)
}

// set records a node's verdict and keeps the gauges; it returns the previous
// verdict and whether an Event said so.
func (m *Monitor) set(name string, over, tooMany bool, excess int64) (wasOver, told, wasRefused bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	wasOver, told, wasRefused = m.over[name], m.told[name], m.refused[name]
	if over {
		m.over[name] = true
		overcommitted.WithLabelValues(name).Set(float64(excess))
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
	return wasOver, told, wasRefused
}

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

func equalLabels(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func equalResources(a, b v1.ResourceList) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || v.Cmp(w) != 0 {
			return false
		}
	}
	return true
}
