package gpufit

import (
	"context"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/names"
	schedutil "k8s.io/kubernetes/pkg/scheduler/util"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/requeue"
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

// narrowMinSaved: below this many pods left out of the walk it is cheap,
// and the queue is left to visit everyone.
const narrowMinSaved = 64

// narrowPrune is how often entries of pods the informer no longer has are
// dropped (a race between a pod's deletion and its attempt can leave one).
const narrowPrune = 5 * time.Minute

// Where a pending pod is, as far as GPUFit can tell. Only pods in the
// unschedulable pool are walked; naming a pod that is elsewhere costs the
// queue a lookup (a key formatted, about 1 µs), so they are left out too.
type narrowState uint8

const (
	// Seen by the informer only: possibly gated by a PreEnqueue plugin
	// that runs before GPUFit's, or another scheduler's. Named.
	stUnknown narrowState = iota
	// GPUFit's PreEnqueue passed it: it is in the active or backoff queue,
	// not in the pool, unless another PreEnqueue plugin gated it (the queue
	// runs them in no fixed order). Of the in-tree ones only two gate on
	// bound-pod events: GangScheduling (a group's pods are always named)
	// and DefaultPreemption, for a preemptor whose victims are going, and
	// a preemptor's attempt ended without GPUFit's PostFilter, so it stays
	// stAttempting. Not named.
	stQueued
	// An attempt ran GPUFit's PreFilter and has not reached its PostFilter:
	// it may fail after the filters (Reserve, Permit, binding) with any
	// rejector. Named.
	stAttempting
	// Its attempt failed on a plugin that looks at bound pods. Named.
	stRejected
	// Its attempt failed only on GPUFit and filters blind to bound pods:
	// in the pool, and left out.
	stBlind
	// GPUFit's Reserve passed: the pod is in flight until its binding
	// ends, never in the pool. Until Permit passes, the queue keeps the
	// events of its flight and replays them, unnarrowed (hint keys nil),
	// if it comes back; after that (PreBind, Bind) a failure carries no
	// rejector and the pod goes to backoff, not the pool. Every failure
	// after Reserve runs Unreserve first, which names it again
	// (stAttempting). Not named: under a busy API server binds take long,
	// and the pods binding were most of those named.
	stBinding
)

func (st narrowState) named() bool { return st != stQueued && st != stBlind && st != stBinding }

type narrowEntry struct {
	uid types.UID
	st  narrowState
}

// narrower holds, for the queue's PreQueueingHint, the pending pods and
// where they are.
type narrower struct {
	// pods: the informer's GetByKey, to prune.
	pods func(key string) (interface{}, bool, error)
	// usable: the profile runs GPUFit's PreEnqueue, PreFilter and
	// PostFilter. Checked once the framework is built; without them nothing
	// is left out.
	check   sync.Once
	usable  bool
	plugins func() *config.Plugins

	mu    sync.Mutex
	state map[types.NamespacedName]narrowEntry
	blind int // entries in stBlind
	// The entries with st.named(), kept as they change: a stream of pods
	// moving through the queue changes the set on nearly every event, and
	// rebuilding it from state walked the whole backlog each time.
	// namedIdx is each one's position in named. named is handed to the
	// queue as is; shared says so, and the next change copies it first
	// (the queue reads it under its own lock, not ours).
	named    []types.NamespacedName
	namedIdx map[types.NamespacedName]int
	shared   bool
}

func newNarrower(h fwk.Handle, pods cache.SharedIndexInformer) *narrower {
	n := &narrower{state: map[types.NamespacedName]narrowEntry{}, named: []types.NamespacedName{}, namedIdx: map[types.NamespacedName]int{}}
	if pods != nil {
		n.pods = pods.GetIndexer().GetByKey
	}
	if l, ok := h.(interface{ ListPlugins() *config.Plugins }); ok {
		n.plugins = l.ListPlugins
	}
	return n
}

// isUsable checks the profile once, after the framework was built: the
// states are kept by GPUFit's PreEnqueue, PreFilter and PostFilter.
func (n *narrower) isUsable() bool {
	n.check.Do(func() {
		if n.plugins == nil {
			return
		}
		ps := n.plugins()
		has := func(set []config.Plugin) bool {
			return slices.ContainsFunc(set, func(p config.Plugin) bool { return p.Name == Name })
		}
		// GPUFit's PostFilter after DefaultPreemption's: a pod that nominated
		// victims never reaches it and stays named (it may come back gated
		// on their deletion).
		pf := slices.IndexFunc(ps.PostFilter.Enabled, func(p config.Plugin) bool { return p.Name == Name })
		dp := slices.IndexFunc(ps.PostFilter.Enabled, func(p config.Plugin) bool { return p.Name == names.DefaultPreemption })
		gp := slices.IndexFunc(ps.PostFilter.Enabled, func(p config.Plugin) bool { return p.Name == preemptionPlugin })
		n.usable = has(ps.PreEnqueue.Enabled) && has(ps.PreFilter.Enabled) && pf >= 0 && dp < pf && gp < pf
	})
	return n.usable
}

// preemptionPlugin is GPUPreemption's name (DefaultPreemption with
// device-level victims).
const preemptionPlugin = "GPUPreemption"

func podKey(p *v1.Pod) types.NamespacedName {
	return types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
}

// move sets a pending pod's state from a plugin call: only for the pod the
// informer's store has under that name (the store is updated before any
// handler runs, so a pod deleted or replaced during its attempt is not
// written back). A gang's pod is always named: its gating plugin reacts to
// bound pods.
func (n *narrower) move(p *v1.Pod, st narrowState) {
	if p.Spec.SchedulingGroup != nil {
		st = stUnknown
	}
	k := podKey(p)
	n.mu.Lock()
	defer n.mu.Unlock()
	// Under n.mu, so that the informer's later word on this name (observe,
	// forget) is not overwritten by an older one.
	if n.pods != nil {
		obj, exists, err := n.pods(k.Namespace + "/" + k.Name)
		if cur, ok := obj.(*v1.Pod); err != nil || !exists || !ok || cur.UID != p.UID || cur.Spec.NodeName != "" {
			return
		}
	}
	old, known := n.state[k]
	if known && old.uid == p.UID {
		if old.st == st || st == stQueued && old.st == stAttempting {
			// Its last attempt failed after the filters, or nominated
			// victims: it may be gated on their deletion.
			return
		}
	}
	n.set(k, old, known, narrowEntry{uid: p.UID, st: st})
}

// set replaces k's entry; n.mu held.
func (n *narrower) set(k types.NamespacedName, old narrowEntry, known bool, e narrowEntry) {
	if known {
		n.count(k, old.st, -1)
	}
	n.state[k] = e
	n.count(k, e.st, 1)
}

// count adds (d = 1) or removes (d = -1) k in state st to the tallies.
func (n *narrower) count(k types.NamespacedName, st narrowState, d int) {
	if st == stBlind {
		n.blind += d
	}
	if !st.named() {
		return
	}
	if n.shared {
		n.named = slices.Clone(n.named)
		n.shared = false
	}
	if d > 0 {
		n.namedIdx[k] = len(n.named)
		n.named = append(n.named, k)
		return
	}
	i, last := n.namedIdx[k], len(n.named)-1
	n.named[i] = n.named[last]
	n.namedIdx[n.named[i]] = i
	n.named = n.named[:last]
	delete(n.namedIdx, k)
}

// forget drops a pod that was bound, ended or deleted (this pod, not a
// later one of the same name).
func (n *narrower) forget(p *v1.Pod) {
	k := podKey(p)
	n.mu.Lock()
	defer n.mu.Unlock()
	if old, known := n.state[k]; known && old.uid == p.UID {
		delete(n.state, k)
		n.count(k, old.st, -1)
	}
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
	k := podKey(p)
	n.mu.Lock()
	defer n.mu.Unlock()
	if old, known := n.state[k]; !known || old.uid != p.UID {
		n.set(k, old, known, narrowEntry{uid: p.UID, st: stUnknown})
	}
}

// prune drops entries whose pod the informer no longer has, now and then,
// outside the queue's lock.
func (n *narrower) prune(ctx context.Context) {
	if n.pods == nil {
		return
	}
	t := time.NewTicker(narrowPrune)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		type entry struct {
			k   types.NamespacedName
			uid types.UID
		}
		n.mu.Lock()
		entries := make([]entry, 0, len(n.state))
		for k, e := range n.state {
			entries = append(entries, entry{k, e.uid})
		}
		n.mu.Unlock()
		for _, en := range entries {
			obj, exists, err := n.pods(en.k.Namespace + "/" + en.k.Name)
			if err != nil {
				continue
			}
			cur, _ := obj.(*v1.Pod)
			if exists && cur != nil && cur.UID == en.uid && cur.Spec.NodeName == "" {
				continue
			}
			k := en.k
			n.mu.Lock()
			// Only the entry that was read: a newer pod of that name stays.
			if e, known := n.state[k]; known && e.uid == en.uid {
				delete(n.state, k)
				n.count(k, e.st, -1)
			}
			n.mu.Unlock()
		}
	}
}

// candidates are the pods the queue must visit for an event that frees no
// GPU; nil: all of them (too few left out for the narrowing to pay, or the
// profile cannot keep the states exact).
func (n *narrower) candidates() []types.NamespacedName {
	if !n.isUsable() {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.blind < narrowMinSaved || 2*len(n.named) > n.blind {
		return nil
	}
	n.shared = true
	return n.named // never nil: nil would mean every pod
}

// blindToBoundPods are the in-tree filters of v1.37.2 that register no
// event a bound pod's arrival or deletion matches (their rejections resolve
// on node, volume, claim or own-pod events only): for those events the
// queue consults none of them, whatever they answered. Checked against the
// real plugins by TestBlindToBoundPods.
var blindToBoundPods = map[string]bool{
	names.NodeName: true, names.NodeUnschedulable: true, names.TaintToleration: true, names.NodeAffinity: true,
	names.VolumeBinding: true, names.VolumeZone: true, names.DynamicResources: true, names.NodeDeclaredFeatures: true,
	requeue.GPUDynamicResourcesName: true,
}

// recordRejectors leaves the pod out of the bound-pod events the queue
// visits while every plugin that rejected it is GPUFit (whose hint skips
// them when no GPU is freed) or one that never looks at bound pods: a pod
// for a model no node has, or on a node pool its selector names.
func (pl *GPUFit) recordRejectors(p *v1.Pod, plugins []string) {
	if pl.narrow == nil {
		return
	}
	blind := len(plugins) > 0
	for _, name := range plugins {
		blind = blind && (name == Name || blindToBoundPods[name])
	}
	st := stRejected
	if blind {
		st = stBlind
	}
	pl.narrow.move(p, st)
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
	if err != nil || deleted == nil || (heldNode(deleted) != "" && pl.usesGPU(deleted)) {
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
