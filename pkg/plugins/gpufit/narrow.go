package gpufit

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/names"
	schedutil "k8s.io/kubernetes/pkg/scheduler/util"
)

var _ fwk.PreEnqueuePlugin = &GPUFit{}

// Why this exists: in v1.37 every bound pod that comes or goes (a CPU pod
// of another team, a pod this scheduler just bound) makes the scheduling
// queue visit every pod in its unschedulable pool, under the queue's lock,
// because some plugin (InterPodAffinity, PodTopologySpread, NodeResourcesFit)
// registered that event. A backlog of 20,000 GPU pods waiting for a model
// that is all taken costs about 0.7 µs each per event, and at a few hundred
// such events per second the queue spends its time there instead of popping
// pods (measured in docs/benchmarks.md § 5). Yet for a pod that GPUFit alone
// rejected, nothing but freed GPUs can matter, and a bound pod that holds no
// GPU frees none: the queue would consult only GPUFit's hint for it, which
// answers QueueSkip. The upstream PreQueueingHint (feature gate
// SchedulerPreQueueingHints) lets a plugin name the pods worth visiting for
// one event; GPUFit names every pending pod except those.
//
// The exclusion must hold exactly while the pod sits in the pool with such
// rejectors. PostFilter sees the rejectors of each failed attempt
// (the same per-node statuses the queue takes its set from) and sets it;
// PreEnqueue, which the queue runs whenever a pod leaves the pool (or
// arrives), and PreFilter, at each attempt, clear it. Pods of a scheduling
// group are never excluded: a gang's gating plugin reacts to bound pods.

// narrowMinExcluded: below this many excluded pods the walk is cheap, and
// the queue is left to visit everyone.
const narrowMinExcluded = 64

// narrowPrune is how often keys of pods the informer no longer has are
// dropped (a pod deleted during its own attempt can be recorded after its
// deletion was seen).
const narrowPrune = 5 * time.Minute

// narrower holds, for the queue's PreQueueingHint, the pending pods and
// which of them GPUFit alone rejected.
type narrower struct {
	// live: PreEnqueue has run at least once. Without it nothing would
	// clear an exclusion when the pod leaves the pool (a configuration that
	// enables GPUFit at named extension points only), so nothing is
	// excluded.
	live atomic.Bool
	// pods: the informer's GetByKey, to prune.
	pods func(key string) (interface{}, bool, error)

	mu       sync.Mutex
	pending  map[types.NamespacedName]bool // true: excluded
	excluded int
	cands    []types.NamespacedName // cached; nil when stale
	pruned   time.Time
}

func newNarrower(pods cache.SharedIndexInformer) *narrower {
	n := &narrower{pending: map[types.NamespacedName]bool{}, pruned: time.Now()}
	if pods != nil {
		n.pods = pods.GetIndexer().GetByKey
	}
	return n
}

func podKey(p *v1.Pod) types.NamespacedName {
	return types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
}

// set records a pending pod; excluded only with GPUFit its only rejector.
func (n *narrower) set(p *v1.Pod, excluded bool) {
	k := podKey(p)
	n.mu.Lock()
	was, known := n.pending[k]
	if !known || was != excluded {
		n.pending[k] = excluded
		n.cands = nil
		if was {
			n.excluded--
		}
		if excluded {
			n.excluded++
		}
	}
	n.mu.Unlock()
}

// keep adds a pending pod as a candidate unless it is known.
func (n *narrower) keep(p *v1.Pod) {
	k := podKey(p)
	n.mu.Lock()
	if _, known := n.pending[k]; !known {
		n.pending[k] = false
		n.cands = nil
	}
	n.mu.Unlock()
}

// release makes a pod a candidate again (it leaves the pool, or a new
// attempt starts).
func (n *narrower) release(p *v1.Pod) {
	k := podKey(p)
	n.mu.Lock()
	if was, known := n.pending[k]; was || !known {
		if was {
			n.excluded--
		}
		n.pending[k] = false
		n.cands = nil
	}
	n.mu.Unlock()
}

func (n *narrower) forget(p *v1.Pod) {
	k := podKey(p)
	n.mu.Lock()
	if was, known := n.pending[k]; known {
		delete(n.pending, k)
		n.cands = nil
		if was {
			n.excluded--
		}
	}
	n.mu.Unlock()
}

// observe follows the informer: unbound, live pods are pending.
func (n *narrower) observe(obj interface{}) {
	p, ok := obj.(*v1.Pod)
	if !ok {
		return
	}
	if p.Spec.NodeName != "" || p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
		n.forget(p)
		return
	}
	n.keep(p)
}

// candidates are the pods the queue must visit for an event that frees no
// GPU; nil: all of them (too few excluded for the narrowing to pay, or the
// exclusions cannot be trusted). The queue copies the slice into a set, at
// about the cost of a tenth of a visit per pod, so a large candidate list
// beside few exclusions is no gain.
func (n *narrower) candidates() []types.NamespacedName {
	if !n.live.Load() {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.excluded < narrowMinExcluded || len(n.pending)-n.excluded > 2*n.excluded {
		return nil
	}
	if n.pods != nil && time.Since(n.pruned) > narrowPrune {
		n.pruned = time.Now()
		for k := range n.pending {
			if _, exists, err := n.pods(k.Namespace + "/" + k.Name); err == nil && !exists {
				if n.pending[k] {
					n.excluded--
				}
				delete(n.pending, k)
				n.cands = nil
			}
		}
	}
	if n.cands == nil {
		c := make([]types.NamespacedName, 0, len(n.pending)-n.excluded)
		for k, ex := range n.pending {
			if !ex {
				c = append(c, k)
			}
		}
		n.cands = c
	}
	return n.cands
}

// PreEnqueue gates nothing: the queue runs it whenever a pod arrives or
// leaves the unschedulable pool, which ends the pod's exclusion.
func (pl *GPUFit) PreEnqueue(_ context.Context, p *v1.Pod) *fwk.Status {
	if pl.narrow != nil {
		pl.narrow.live.Store(true)
		pl.narrow.release(p)
	}
	return nil
}

// blindToBoundPods are the in-tree filters of v1.37.2 that register no
// event a bound pod's arrival or deletion matches (their rejections resolve
// on node, volume, claim or own-pod events only): for those events the
// queue consults none of them, whatever they answered. Checked against the
// real plugins by TestBlindToBoundPods.
var blindToBoundPods = map[string]bool{
	names.NodeName: true, names.NodeUnschedulable: true, names.TaintToleration: true, names.NodeAffinity: true,
	names.VolumeBinding: true, names.VolumeZone: true, names.DynamicResources: true, names.NodeDeclaredFeatures: true,
}

// recordRejectors excludes the pod from the bound-pod events the queue
// visits while every plugin that rejected it is GPUFit (whose hint skips
// them when no GPU is freed) or one that never looks at bound pods: a pod
// for a model no node has, or on a node pool its selector names.
func (pl *GPUFit) recordRejectors(p *v1.Pod, plugins []string) {
	if pl.narrow == nil || !pl.narrow.live.Load() {
		return
	}
	only := len(plugins) > 0 && p.Spec.SchedulingGroup == nil
	for _, name := range plugins {
		only = only && (name == Name || blindToBoundPods[name])
	}
	pl.narrow.set(p, only)
}

// narrowAfterPodAdd: a pod that appears on a node takes GPUs and frees none.
func (pl *GPUFit) narrowAfterPodAdd(_ klog.Logger, _, _ interface{}) (fwk.PreQueueingHintResult, error) {
	c := pl.narrow.candidates()
	return fwk.PreQueueingHintResult{AllPods: c == nil, Pods: c}, nil
}

// narrowAfterPodDelete: a deleted pod that held no GPU frees none. The
// predicate is isSchedulableAfterPodDelete's, so an excluded pod is one its
// hint would skip.
func (pl *GPUFit) narrowAfterPodDelete(_ klog.Logger, oldObj, newObj interface{}) (fwk.PreQueueingHintResult, error) {
	deleted, _, err := schedutil.As[*v1.Pod](oldObj, newObj)
	if err != nil || deleted == nil || (deleted.Spec.NodeName != "" && pl.usesGPU(deleted)) {
		return fwk.PreQueueingHintResult{AllPods: true}, nil
	}
	c := pl.narrow.candidates()
	return fwk.PreQueueingHintResult{AllPods: c == nil, Pods: c}, nil
}

// isSchedulableAfterPodAdd: a pod that appears on a node frees no GPU.
// Registered only to carry the PreQueueingHint.
func (pl *GPUFit) isSchedulableAfterPodAdd(klog.Logger, *v1.Pod, interface{}, interface{}) (fwk.QueueingHint, error) {
	return fwk.QueueSkip, nil
}
