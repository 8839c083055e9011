package gpufit

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/requeue"
)

// A pod that waits for a model no node hosts (a pool scaled to zero, a
// model not bought yet) is told so by PreFilter at its first attempt, which
// writes its FailedScheduling event and condition. Its later attempts only
// repeat that, and the queue makes them anyway: it flushes its pool every 5
// minutes, and each flushed pod is a full scheduling cycle (with the
// preemption dry run and the failure handling), ahead of newer pods. Under
// a backlog of 20,000 such pods that was a fifth of a 0.4-CPU scheduler
// (docs/benchmarks.md § 5).
//
// So GPUFit's PreEnqueue keeps such a pod in the pool (gated, in the
// queue's terms) while no node hosts what it asks for, read from the
// informer; one of GPUFit's queueing hints answering Queue for it (a node
// where it fits arrived, its request changed; the queue asks them for
// gated pods too, for the events GPUFit registers), or the requeue
// reconciler, which re-reads the cluster on every resync, activating it,
// lets it in at once. Only with hints and
// the reconciler both on: without the reconciler, the queue's flush is the
// only repair of a missed event, and nothing is gated.
type hostless struct {
	n    atomic.Int64 // len(pods), read without the lock
	mu   sync.Mutex
	pods map[types.UID]hostlessPod
	// podStore is the informer's: a pod deleted during its attempt is not
	// recorded after its deletion was seen.
	podStore cache.Store
	// The level check: nodes lists the nodes now, nodeGen counts the
	// changes of their devices, and hosted caches, per kind of request,
	// whether some node hosts it, valid while nodeGen stays.
	nodes    func() ([]*v1.Node, error)
	state    func(*v1.Node) *gpu.NodeState
	sameDevs func(a, b *v1.Node) bool
	nodeGen  atomic.Uint64
	hosted   map[string]bool
	hostedAt uint64
}

type hostlessPod struct {
	why []string // the reasons PreFilter gave
	req gpu.Request
	key string // what Hosts reads of req
}

func newHostless(podStore cache.Store, nodes func() ([]*v1.Node, error), state func(*v1.Node) *gpu.NodeState, sameDevs func(a, b *v1.Node) bool) *hostless {
	return &hostless{pods: map[types.UID]hostlessPod{}, podStore: podStore, nodes: nodes, state: state, sameDevs: sameDevs, hosted: map[string]bool{}}
}

// hostsKey is what NodeState.Hosts reads of a request.
func hostsKey(r *gpu.Request) string {
	return fmt.Sprintf("%s|%t|%t|%d|%t", r.Models.String(), r.Shared(), r.Slot, r.ShareCount, r.NeedsDelivery)
}

// record notes a pod PreFilter found no host for.
func (h *hostless) record(p *v1.Pod, req *gpu.Request, why []string) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.podStore != nil {
		obj, exists, err := h.podStore.Get(p)
		if cur, ok := obj.(*v1.Pod); err != nil || !exists || !ok || cur.UID != p.UID {
			return
		}
	}
	h.pods[p.UID] = hostlessPod{why: why, req: *req, key: hostsKey(req)}
	h.n.Store(int64(len(h.pods)))
}

// clear ends a pod's gate (a new attempt, a hint's Queue, an activation,
// the pod gone or bound).
func (h *hostless) clear(uid types.UID) {
	if h == nil || h.n.Load() == 0 {
		return
	}
	h.mu.Lock()
	if _, ok := h.pods[uid]; ok {
		delete(h.pods, uid)
		h.n.Store(int64(len(h.pods)))
	}
	h.mu.Unlock()
}

// gated returns the reasons a recorded pod still waits for: only while no
// node hosts what it asks for, read from the informer (a node that hosts
// it now lets it in at the queue's next flush, even if no hint answered
// Queue because the node is full: its attempt may preempt).
func (h *hostless) gated(uid types.UID) ([]string, bool) {
	if h == nil || h.n.Load() == 0 {
		return nil, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	rec, ok := h.pods[uid]
	if !ok {
		return nil, false
	}
	if gen := h.nodeGen.Load(); gen != h.hostedAt {
		clear(h.hosted)
		h.hostedAt = gen
	}
	hosted, known := h.hosted[rec.key]
	if !known {
		hosted = h.hostedSomewhere(&rec.req)
		h.hosted[rec.key] = hosted
	}
	if hosted {
		delete(h.pods, uid)
		h.n.Store(int64(len(h.pods)))
		return nil, false
	}
	return rec.why, true
}

// hostedSomewhere scans the nodes, once per kind of request and change of
// the nodes' devices. An error counts as hosted: the pod is let in.
func (h *hostless) hostedSomewhere(req *gpu.Request) bool {
	if h.nodes == nil {
		return true
	}
	nodes, err := h.nodes()
	if err != nil {
		return true
	}
	for _, n := range nodes {
		if h.state(n).Hosts(req) == gpu.Fits {
			return true
		}
	}
	return false
}

// forget follows the informer: a pod bound, ended or deleted holds no gate.
func (h *hostless) forget(obj interface{}) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if p, ok := obj.(*v1.Pod); ok {
		h.clear(p.UID)
	}
}

func (h *hostless) watch(pods, nodes cache.SharedIndexInformer) error {
	_, err := pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, obj interface{}) {
			if p, ok := obj.(*v1.Pod); ok && (p.Spec.NodeName != "" || p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed) {
				h.clear(p.UID)
			}
		},
		DeleteFunc: h.forget,
	})
	if err != nil {
		return err
	}
	bump := func(interface{}) { h.nodeGen.Add(1) }
	_, err = nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: bump,
		UpdateFunc: func(old, obj interface{}) {
			o, ok1 := old.(*v1.Node)
			n, ok2 := obj.(*v1.Node)
			if !ok1 || !ok2 || !h.sameDevs(o, n) {
				h.nodeGen.Add(1)
			}
		},
		DeleteFunc: bump,
	})
	return err
}

// ungateOnQueue wraps a queueing hint: a Queue for a gated pod ends its gate,
// so that the PreEnqueue the queue runs next lets it in.
func (h *hostless) ungateOnQueue(fn fwk.QueueingHintFn) fwk.QueueingHintFn {
	if h == nil || fn == nil {
		return fn
	}
	return func(logger klog.Logger, pod *v1.Pod, oldObj, newObj interface{}) (fwk.QueueingHint, error) {
		hint, err := fn(logger, pod, oldObj, newObj)
		if hint == fwk.Queue {
			h.clear(pod.UID)
		}
		return hint, err
	}
}

// ungating is the reconciler's activator: what it activates, it read the
// cluster for, and found a node for.
type ungating struct {
	h    *hostless
	next requeue.Activator
}

func (u ungating) Activate(logger klog.Logger, pods map[string]*v1.Pod) {
	for _, p := range pods {
		u.h.clear(p.UID)
	}
	u.next.Activate(logger, pods)
}

// PreEnqueue gates only a pod waiting for a model no node hosts (see
// hostless). Otherwise the queue runs it whenever a pod arrives or leaves
// the unschedulable pool, which ends the pod's exclusion from the
// narrowing.
func (pl *GPUFit) PreEnqueue(_ context.Context, p *v1.Pod) *fwk.Status {
	if why, ok := pl.hostless.gated(p.UID); ok {
		// Still in the pool, rejected by GPUFit alone: its narrowing
		// state (left out) stands.
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, why...)
	}
	if pl.narrow != nil {
		pl.narrow.move(p, stQueued)
	}
	return nil
}
