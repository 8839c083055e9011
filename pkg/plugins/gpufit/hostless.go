package gpufit

import (
	"context"
	"sync"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

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
// queue's terms) until something can have changed its answer: one of
// GPUFit's queueing hints answers Queue for it (a node hosting its model
// arrived, or its request changed; the queue asks them for gated pods too,
// for the events GPUFit registers), or the requeue reconciler, which
// re-reads the cluster on every resync, activates it. Only with hints and
// the reconciler both on: without the reconciler, the queue's flush is the
// only repair of a missed event, and nothing is gated.
type hostless struct {
	n    atomic.Int64 // len(pods), read without the lock
	mu   sync.Mutex
	pods map[types.UID][]string // the reasons PreFilter gave
}

func newHostless() *hostless { return &hostless{pods: map[types.UID][]string{}} }

// record notes a pod PreFilter found no host for.
func (h *hostless) record(uid types.UID, why []string) {
	if h == nil {
		return
	}
	h.mu.Lock()
	h.pods[uid] = why
	h.n.Store(int64(len(h.pods)))
	h.mu.Unlock()
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

// gated returns the reasons a recorded pod still waits for.
func (h *hostless) gated(uid types.UID) ([]string, bool) {
	if h == nil || h.n.Load() == 0 {
		return nil, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	why, ok := h.pods[uid]
	return why, ok
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

func (h *hostless) watch(pods cache.SharedIndexInformer) error {
	_, err := pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, obj interface{}) {
			if p, ok := obj.(*v1.Pod); ok && (p.Spec.NodeName != "" || p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed) {
				h.clear(p.UID)
			}
		},
		DeleteFunc: h.forget,
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
