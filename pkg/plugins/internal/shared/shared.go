// Package shared is the state the GPU plugins share: the device accounting,
// one per scheduler process and shared by all its profiles, and per profile
// the placement policy, the target workload and the parsed request of the
// pod in the current cycle. Keeping the device choice in one place is what
// lets Reserve take exactly the device the score assumed; keeping one
// accounting is what lets one profile see the pods another has in flight.
package shared

import (
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/component-base/metrics/legacyregistry"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/agent/dra"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/internal/objects"
)

// Shared is one profile's GPU state, over its process's accounting.
type Shared struct {
	acc     *Accounting
	scoring atomic.Pointer[scoring]
	// nominator: the profile's framework keeps nominated pods.
	nominatorOnce sync.Once
	nominator     bool
	// snapshot is the profile's snapshot (nil without one): only its
	// NodeInfos are remembered for the fast lookup.
	snapshot fwk.SharedLister
	// allocator, if set, hands out every node's devices in place of the
	// policy's choice (SetAllocator).
	allocator atomic.Pointer[Allocator]
	// fleet, if set, is the cluster's GPUs GPUScore counts (PinFleet).
	fleet atomic.Pointer[gpu.Fleet]
}

// Allocator chooses a request's devices on a node, as a node agent that
// decides by itself would (DRA's allocator).
type Allocator func(st *gpu.NodeState, r *gpu.Request) (gpu.Choice, bool)

// SetAllocator makes a profile's devices handed out by a, on every node
// (the simulator's model of a fleet DRA serves); nil restores the policy's
// choice.
func (s *Shared) SetAllocator(a Allocator) {
	if a == nil {
		s.allocator.Store(nil)
		return
	}
	s.allocator.Store(&a)
}

// Choose is the devices a reservation takes: what the node's allocator
// gives where one decides (DRA's, first fit in the order it is shown:
// DeviceOrder), else the policy's choice.
func (s *Shared) Choose(st *gpu.NodeState, r *gpu.Request) (gpu.Choice, bool) {
	if a := s.allocator.Load(); a != nil {
		return (*a)(st, r)
	}
	if st.Claimed {
		return st.FirstFit(r, st.DeviceOrder(nil))
	}
	c, _, ok := s.Evaluate(st, r)
	return c, ok
}

// Accounting is the device accounting of one scheduler process: every
// profile's reservations in one tracker, over the one informer they share.
type Accounting struct {
	tracker  atomic.Pointer[gpu.Tracker]
	podIndex atomic.Pointer[cache.Indexer]

	mu         sync.Mutex
	configured bool
	refs       int
	// once runs the process-wide set-up (event handlers, the overcommit
	// monitor) for the first profile that asks.
	once map[string]bool
	// scheduling is set by any profile's first scheduling cycle: only the
	// leader runs cycles.
	scheduling atomic.Bool
	// leading caches Leading's answer.
	leadingAt atomic.Int64
	leading   atomic.Bool
	// released are told when devices are released outside a cycle.
	released []func()
	// podGen counts changes of each node's pods (*atomic.Uint64 by node).
	podGen sync.Map
	// claims is the DRA index, made by the first profile that reads DRA
	// (s.mu).
	claims *dra.Index
}

type scoring struct {
	sc      gpu.Scoring
	learner *gpu.Learner
	static  *gpu.Workload
}

var (
	mu       sync.Mutex
	profiles = map[fwk.Handle]*Shared{}
	// accountings are keyed by the informer factory, which all profiles of
	// one scheduler share (each gpu-sim replay has its own); by the handle
	// when there is none.
	accountings = map[any]*Accounting{}
)

func accountingKey(h fwk.Handle) any {
	if f := h.SharedInformerFactory(); f != nil && !reflect.ValueOf(f).IsNil() {
		return f
	}
	return h
}

// For returns the profile's shared state. Plugins are created in no fixed
// order, so whichever comes first creates it with defaults.
func For(h fwk.Handle) *Shared {
	mu.Lock()
	defer mu.Unlock()
	s := profiles[h]
	if s == nil {
		key := accountingKey(h)
		acc := accountings[key]
		if acc == nil {
			acc = &Accounting{once: map[string]bool{}}
			t := gpu.NewTracker(gpu.DefaultNodeOptions)
			t.SetAlive(acc.Alive)
			acc.tracker.Store(t)
			accountings[key] = acc
		}
		acc.refs++
		s = &Shared{acc: acc, snapshot: h.SnapshotSharedLister()}
		sc := gpu.DefaultScoring
		sc.Policy = gpu.BestFit
		s.scoring.Store(&scoring{sc: sc, learner: gpu.NewLearner(0.95, 10000)})
		profiles[h] = s
	}
	return s
}

// Forget drops the profile's shared state, once its framework is done: a
// process that builds many frameworks (gpu-sim) must not keep them all.
func Forget(h fwk.Handle) {
	mu.Lock()
	defer mu.Unlock()
	s := profiles[h]
	if s == nil {
		return
	}
	delete(profiles, h)
	s.acc.refs--
	if s.acc.refs == 0 {
		for k, a := range accountings {
			if a == s.acc {
				delete(accountings, k)
			}
		}
	}
}

// Configure sets where devices are read from (GPUFit's args). It must run
// before scheduling starts. Profiles share one accounting, so they must
// read devices the same way: a second profile that disagrees is an error.
func (s *Shared) Configure(opts gpu.NodeOptions) error {
	a := s.acc
	a.mu.Lock()
	defer a.mu.Unlock()
	cur := a.tracker.Load().Options()
	if a.configured {
		if !reflect.DeepEqual(cur, opts) {
			return fmt.Errorf("every profile's GPUFit must read devices the same way (one device accounting per scheduler): "+
				"got gpuResourceNames %v, gpuProductLabel %q, gpuMemoryLabel %q, but another profile has %v, %q, %q",
				opts.ResourceNames, opts.ProductLabel, opts.MemoryLabel, cur.ResourceNames, cur.ProductLabel, cur.MemoryLabel)
		}
		return nil
	}
	a.configured = true
	if !reflect.DeepEqual(cur, opts) {
		t := gpu.NewTracker(opts)
		t.SetAlive(a.Alive)
		a.tracker.Store(t)
	}
	return nil
}

// SetScheduling records that this process schedules (it leads).
func (s *Shared) SetScheduling() { s.acc.scheduling.Store(true) }

// leaderMetric is the gauge kube-scheduler's leader election keeps, 1 while
// this process holds the lease.
const leaderMetric = "leader_election_master_status"

// noLeaderElection is set by the binary when its configuration turns leader
// election off: the process is then the only scheduler and leads from the
// start.
var noLeaderElection atomic.Bool

// SetNoLeaderElection says that this process runs without leader election.
func SetNoLeaderElection() { noLeaderElection.Store(true) }

// LeaderElected reports whether the process runs leader election.
func LeaderElected() bool { return !noLeaderElection.Load() }

// Leading reports whether this process leads: always without leader
// election; else the leader-election gauge of this process (read at most
// every 2 s), or, before the gauge exists, whether it has run a scheduling
// cycle. Standbys keep their hands off the cluster; a new leader with
// nothing to schedule still reports.
func (s *Shared) Leading() bool {
	if noLeaderElection.Load() {
		return true
	}
	a := s.acc
	now := time.Now().UnixNano()
	if now-a.leadingAt.Load() < int64(2*time.Second) {
		return a.leading.Load()
	}
	v := a.scheduling.Load()
	if mfs, err := legacyregistry.DefaultGatherer.Gather(); err == nil {
		for _, mf := range mfs {
			if mf.GetName() != leaderMetric {
				continue
			}
			v = false
			for _, m := range mf.GetMetric() {
				if m.GetGauge().GetValue() == 1 {
					v = true
				}
			}
		}
	}
	a.leading.Store(v)
	a.leadingAt.Store(now)
	return v
}

// InDoubt returns the node of the pod's last bind if that failed in a way
// that may still land (its reservation is kept, marked uncertain).
func (s *Shared) InDoubt(uid types.UID) (string, bool) {
	node, r, ok := s.Tracker().Reserved(uid)
	return node, ok && r.Uncertain
}

// OnRelease registers f to be called when devices are released outside a
// scheduling cycle (a failed bind verified as not landed): pods waiting
// for them are not told by any event.
func (s *Shared) OnRelease(f func()) {
	s.acc.mu.Lock()
	defer s.acc.mu.Unlock()
	s.acc.released = append(s.acc.released, f)
}

// Released tells the OnRelease listeners.
func (s *Shared) Released() {
	s.acc.mu.Lock()
	fs := append([]func(){}, s.acc.released...)
	s.acc.mu.Unlock()
	for _, f := range fs {
		f()
	}
}

// Once reports true the first time a process-wide task is asked for, and
// false after: event handlers and monitors run once, not once per profile.
func (s *Shared) Once(task string) bool {
	s.acc.mu.Lock()
	defer s.acc.mu.Unlock()
	if s.acc.once[task] {
		return false
	}
	s.acc.once[task] = true
	return true
}

// SetScoring sets the scoring and target workload (GPUScore's args). static
// is nil for a learned workload; learner is nil for a static one.
func (s *Shared) SetScoring(sc gpu.Scoring, learner *gpu.Learner, static *gpu.Workload) {
	s.scoring.Store(&scoring{sc: sc, learner: learner, static: static})
}

// ClaimIndex is the process's index of the GPUs DRA drivers publish and
// the claims on them, made on the first call: every profile must read the
// same drivers (one accounting). A change it sees makes the node's device
// state stale. fresh is true for the caller that made it (it feeds it).
func (s *Shared) ClaimIndex(drivers []dra.Driver) (x *dra.Index, fresh bool, err error) {
	a := s.acc
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.claims != nil {
		if !reflect.DeepEqual(a.claims.Drivers(), drivers) {
			return nil, false, fmt.Errorf("every profile's GPUFit must read the same DRA drivers (one device accounting per scheduler)")
		}
		return a.claims, false, nil
	}
	a.claims = dra.NewIndex(drivers, func(node string) { a.tracker.Load().Touch(node) })
	return a.claims, true, nil
}

// Claims is the process's DRA index, or nil when no profile reads DRA.
func (s *Shared) Claims() *dra.Index {
	s.acc.mu.Lock()
	defer s.acc.mu.Unlock()
	return s.acc.claims
}

// Tracker returns the process's device tracker.
func (s *Shared) Tracker() *gpu.Tracker { return s.acc.tracker.Load() }

// Scoring returns the placement scoring.
func (s *Shared) Scoring() gpu.Scoring { return s.scoring.Load().sc }

// Workload returns the current target workload, or nil if none is known yet.
func (s *Shared) Workload() *gpu.Workload {
	sc := s.scoring.Load()
	if sc.static != nil {
		return sc.static
	}
	if sc.learner != nil {
		return sc.learner.Workload()
	}
	return nil
}

// PinFleet sets the fleet GPUScore counts, in place of the snapshot's.
func (s *Shared) PinFleet(f *gpu.Fleet) { s.fleet.Store(f) }

// PinnedFleet is the fleet PinFleet set, nil if none.
func (s *Shared) PinnedFleet() *gpu.Fleet { return s.fleet.Load() }

// Learner is the profile's learner, nil for a static workload.
func (s *Shared) Learner() *gpu.Learner { return s.scoring.Load().learner }

// Observe feeds a pod to the learned workload, once per pod.
func (s *Shared) Observe(uid types.UID, r *gpu.Request) {
	if l := s.scoring.Load().learner; l != nil {
		l.Observe(string(uid), r)
	}
}

// Evaluate is the profile's scoring with its current workload.
func (s *Shared) Evaluate(st *gpu.NodeState, r *gpu.Request) (gpu.Choice, int64, bool) {
	return s.Scoring().Evaluate(st, r, s.Workload())
}

// State returns a node's device state as the scheduler's snapshot sees it,
// from the cache when the node has not changed.
func (s *Shared) State(nodeInfo fwk.NodeInfo) *gpu.NodeState {
	if st := s.lookup(nodeInfo); st != nil {
		return st
	}
	return s.build(nodeInfo)
}

// lookup is the node's cached state, if current: through the address of
// the snapshot's NodeInfo (gpu.Tracker.LookupAt), else by name.
func (s *Shared) lookup(nodeInfo fwk.NodeInfo) *gpu.NodeState {
	t := s.Tracker()
	gen := nodeInfo.GetGeneration()
	key := viewKey(nodeInfo)
	if st := t.LookupAt(key, gen); st != nil {
		return st
	}
	name := nodeInfo.Node().Name
	st := t.Lookup(name, gen)
	if st != nil {
		s.remember(nodeInfo, key, name)
	}
	return st
}

// remember leads the NodeInfo's key to the node's cached state, if the
// NodeInfo is the snapshot's: the copies that preemption and nominees make
// live for one cycle, and an entry would keep their states alive.
func (s *Shared) remember(nodeInfo fwk.NodeInfo, key uintptr, name string) {
	if key == 0 {
		return
	}
	if s.snapshot != nil {
		if ni, err := s.snapshot.NodeInfos().Get(name); err != nil || ni != nodeInfo {
			return
		}
	}
	s.Tracker().Remember(key, name)
}

// viewKey is the address of the scheduler's NodeInfo, of which the snapshot
// keeps one per node for the node's life, over its size: unique while the
// object lives, and the NodeInfos allocated in a row have keys in a row
// (gpu.Tracker.LookupAt). 0 (no key) for other implementations.
func viewKey(nodeInfo fwk.NodeInfo) uintptr {
	if p, ok := nodeInfo.(*framework.NodeInfo); ok {
		return uintptr(unsafe.Pointer(p)) / unsafe.Sizeof(*p)
	}
	return 0
}

// build builds a node's state after a lookup missed.
func (s *Shared) build(nodeInfo fwk.NodeInfo) *gpu.NodeState {
	node := nodeInfo.Node()
	t := s.Tracker()
	st := t.Build(node, nodeInfo.GetGeneration(), podsOf(nodeInfo), cpuFree(nodeInfo), memFree(nodeInfo))
	s.remember(nodeInfo, viewKey(nodeInfo), node.Name)
	return st
}

// StateExcluding evaluates a node without one pod: neither its entry in the
// snapshot (a pod group's assumed pod) nor its own earlier reservation (a
// repeated Reserve), so that reserving twice gives the same devices.
func (s *Shared) StateExcluding(nodeInfo fwk.NodeInfo, uid types.UID) *gpu.NodeState {
	if _, _, reserved := s.Tracker().Reserved(uid); reserved {
		return s.Tracker().Compute(nodeInfo.Node(), podsOf(nodeInfo), cpuFree(nodeInfo), memFree(nodeInfo), uid, true)
	}
	for _, p := range nodeInfo.GetPods() {
		if p.GetPod().UID == uid {
			return s.Tracker().Compute(nodeInfo.Node(), podsOf(nodeInfo), cpuFree(nodeInfo), memFree(nodeInfo), uid, true)
		}
	}
	return s.State(nodeInfo)
}

// ForPod is the node's state as a pod's Score and Reserve must see it: with
// the GPU pods nominated to the node that are at least as important (the
// scheduler's filters counted them, holding the devices their preemption
// freed), so that the device chosen is not one held for a preemptor. Nodes
// without such nominees get State, or StateExcluding when exclude.
func (s *Shared) ForPod(h fwk.Handle, nodeInfo fwk.NodeInfo, pod *v1.Pod, exclude bool) *gpu.NodeState {
	var noms []*v1.Pod
	if h != nil && s.nominates(h) {
		prio := corev1helpers.PodPriority(pod)
		for _, pi := range h.NominatedPodsForNode(nodeInfo.Node().Name) {
			if p := pi.GetPod(); p.UID != pod.UID && corev1helpers.PodPriority(p) >= prio && gpu.UsesGPU(p, s.Tracker().RequestOptions()) {
				noms = append(noms, p)
			}
		}
	}
	if len(noms) == 0 {
		if exclude {
			return s.StateExcluding(nodeInfo, pod.UID)
		}
		return s.State(nodeInfo)
	}
	pods := append(podsOf(nodeInfo), noms...)
	return s.Tracker().Compute(nodeInfo.Node(), pods, cpuFree(nodeInfo), memFree(nodeInfo), pod.UID, true)
}

// nominates reports whether the framework keeps nominated pods: one built
// without a nominator (tests, the simulator) panics when asked.
func (s *Shared) nominates(h fwk.Handle) bool {
	s.nominatorOnce.Do(func() {
		defer func() { _ = recover() }()
		h.NominatedPodsForNode("")
		s.nominator = true
	})
	return s.nominator
}

// PodsOf lists the pods of a node's scheduler view.
func PodsOf(nodeInfo fwk.NodeInfo) []*v1.Pod { return podsOf(nodeInfo) }

func podsOf(nodeInfo fwk.NodeInfo) []*v1.Pod {
	infos := nodeInfo.GetPods()
	pods := make([]*v1.Pod, len(infos))
	for i, p := range infos {
		pods[i] = p.GetPod()
	}
	return pods
}

// CPUOnlyScore is the score of a CPU-only pod. It reads the node's cached
// device state only when the policy needs its idle GPU, and skips even that
// on a node known to have none. It leaves the nominees out: the pod takes
// no device, the filters already counted their CPU and memory, and a node
// whose devices are being freed for a preemptor then only looks idler (the
// pod drifts away from it).
func (s *Shared) CPUOnlyScore(sc gpu.Scoring, nodeInfo fwk.NodeInfo, r *gpu.Request, wl *gpu.Workload) int64 {
	if !sc.CPUOnlyNeedsState(wl) {
		if raw, ok := s.cpuOnlyQuick(sc, nodeInfo, r, wl); ok {
			return raw
		}
	}
	return s.cpuOnlyFrom(sc, nodeInfo, s.lookup(nodeInfo), r, wl)
}

// cpuOnlyQuick is the score from the node's own accounting, when that
// decides.
func (s *Shared) cpuOnlyQuick(sc gpu.Scoring, nodeInfo fwk.NodeInfo, r *gpu.Request, wl *gpu.Workload) (int64, bool) {
	var gpus int64
	scalar := nodeInfo.GetAllocatable().GetScalarResources()
	for _, name := range s.Tracker().Options().ResourceNames {
		gpus += scalar[name]
	}
	if x := s.Tracker().Options().Claims; gpus == 0 && x != nil {
		if _, ok := x.NodeDevices(nodeInfo.Node().Name); ok {
			gpus = 1 // its GPUs are DRA's
		}
	}
	return sc.CPUOnlyQuick(gpus > 0, nodeInfo.Node().Name, cpuFree(nodeInfo), memFree(nodeInfo), r, wl)
}

// cpuOnlyFrom is the score from the node's cached state st, or, when there
// is none (nil), from a state built now.
func (s *Shared) cpuOnlyFrom(sc gpu.Scoring, nodeInfo fwk.NodeInfo, st *gpu.NodeState, r *gpu.Request, wl *gpu.Workload) int64 {
	if st != nil {
		_, raw, _ := sc.Evaluate(st, r, wl)
		return raw
	}
	node := nodeInfo.Node()
	if s.Tracker().KnownWithoutDevices(node) {
		// A CPU node's change (its pods) needs no build.
		if raw, ok := sc.CPUOnlyQuick(false, node.Name, cpuFree(nodeInfo), memFree(nodeInfo), r, wl); ok {
			return raw
		}
	}
	_, raw, _ := sc.Evaluate(s.build(nodeInfo), r, wl)
	return raw
}

// States is one cycle's device states of the nodes a CPU-only pod is
// scored on, by the scheduler's NodeInfo (its address and generation).
type States struct {
	shift uint
	// slots hold an index into ents plus one (0: empty), open addressing.
	slots []int32
	ents  []stateEntry
}

type stateEntry struct {
	key uintptr
	gen int64
	st  *gpu.NodeState
}

// CPUOnlyStates looks up the cached device states of a cycle's nodes for a
// CPU-only pod's score, in a pass of their own: the loads of one node's
// entry and state overlap those of the next, where one lookup per Score
// call, among the framework's other work, waits for its two cache misses
// alone (about a quarter of a microsecond each at 5,000 nodes, the largest
// cost of a CPU-only pod's score). Score still evaluates each node, in
// parallel; a node without a cached state (a miss) is left to it. nil when
// the policy scores CPU-only pods without the device state.
func (s *Shared) CPUOnlyStates(sc gpu.Scoring, nodes []fwk.NodeInfo, wl *gpu.Workload) *States {
	if len(nodes) == 0 || !sc.CPUOnlyNeedsState(wl) {
		return nil
	}
	bits := uint(1)
	for 1<<bits < 2*len(nodes) {
		bits++
	}
	out := &States{shift: 64 - bits, slots: make([]int32, 1<<bits), ents: make([]stateEntry, 0, len(nodes))}
	t := s.Tracker()
	for _, ni := range nodes {
		key, gen := viewKey(ni), ni.GetGeneration()
		if st := t.LookupAt(key, gen); st != nil {
			out.ents = append(out.ents, stateEntry{key: key, gen: gen, st: st})
		}
	}
	mask := uint64(len(out.slots) - 1)
	for i := range out.ents {
		h := (uint64(out.ents[i].key) * 0x9E3779B97F4A7C15) >> out.shift
		for out.slots[h] != 0 {
			h = (h + 1) & mask
		}
		out.slots[h] = int32(i + 1)
	}
	return out
}

// Get is the node's state as CPUOnlyStates found it, if the NodeInfo is
// the one it was given at the same generation; nil otherwise.
func (t *States) Get(nodeInfo fwk.NodeInfo) *gpu.NodeState {
	if t == nil {
		return nil
	}
	key := viewKey(nodeInfo)
	if key == 0 {
		return nil
	}
	mask := uint64(len(t.slots) - 1)
	for h := (uint64(key) * 0x9E3779B97F4A7C15) >> t.shift; ; h = (h + 1) & mask {
		i := t.slots[h]
		if i == 0 {
			return nil
		}
		if e := &t.ents[i-1]; e.key == key && e.gen == nodeInfo.GetGeneration() {
			return e.st
		}
	}
}

// CPUOnlyScoreFrom is CPUOnlyScore with the node's cached state already
// looked up (CPUOnlyStates); st nil: CPUOnlyScore.
func (s *Shared) CPUOnlyScoreFrom(sc gpu.Scoring, nodeInfo fwk.NodeInfo, st *gpu.NodeState, r *gpu.Request, wl *gpu.Workload) int64 {
	if st == nil {
		return s.CPUOnlyScore(sc, nodeInfo, r, wl)
	}
	return s.cpuOnlyFrom(sc, nodeInfo, st, r, wl)
}

func cpuFree(nodeInfo fwk.NodeInfo) int64 {
	return nodeInfo.GetAllocatable().GetMilliCPU() - nodeInfo.GetRequested().GetMilliCPU()
}

func memFree(nodeInfo fwk.NodeInfo) int64 {
	return (nodeInfo.GetAllocatable().GetMemory() - nodeInfo.GetRequested().GetMemory()) >> 20
}

// NodeNameIndex indexes pods by spec.nodeName in the pod informer.
const NodeNameIndex = "gpu-scheduler.io/nodeName"

// UseInformer lets level checks outside a scheduling cycle (queueing hints,
// the requeue reconciler) read the current pods of a node.
func (s *Shared) UseInformer(informer cache.SharedIndexInformer) error {
	if s.acc.podIndex.Load() != nil {
		return nil
	}
	if _, ok := informer.GetIndexer().GetIndexers()[NodeNameIndex]; !ok {
		err := informer.AddIndexers(cache.Indexers{NodeNameIndex: func(obj interface{}) ([]string, error) {
			if p, ok := obj.(*v1.Pod); ok && p.Spec.NodeName != "" {
				return []string{p.Spec.NodeName}, nil
			}
			return nil, nil
		}})
		if err != nil {
			return fmt.Errorf("adding the pod index by node: %w", err)
		}
	}
	idx := informer.GetIndexer()
	s.acc.podIndex.Store(&idx)
	return nil
}

// Alive reports whether a reservation's pod still exists in the informer,
// and is not bound to another node than the reservation's.
func (a *Accounting) Alive(uid types.UID, node string, r gpu.Reservation) bool {
	idx := a.podIndex.Load()
	if idx == nil || r.Name == "" {
		return true
	}
	o, ok, err := (*idx).GetByKey(r.Namespace + "/" + r.Name)
	if err != nil || !ok {
		return false
	}
	p, ok := o.(*v1.Pod)
	return ok && p.UID == uid && p.DeletionTimestamp == nil &&
		(p.Spec.NodeName == "" || p.Spec.NodeName == node)
}

// PodsOnNode lists the running pods bound to a node, from the informer. ok is
// false when no informer is wired (then callers must assume the worst).
func (s *Shared) PodsOnNode(node string) ([]*v1.Pod, bool) {
	idx := s.acc.podIndex.Load()
	if idx == nil {
		return nil, false
	}
	objs, err := (*idx).ByIndex(NodeNameIndex, node)
	if err != nil {
		return nil, false
	}
	pods := make([]*v1.Pod, 0, len(objs))
	for _, o := range objs {
		if p, ok := o.(*v1.Pod); ok && p.Status.Phase != v1.PodSucceeded && p.Status.Phase != v1.PodFailed {
			pods = append(pods, p)
		}
	}
	return pods, true
}

// CurrentState computes a node's state from the informer's view and the
// reservations: the level truth outside a cycle. ok is false without an
// informer.
func (s *Shared) CurrentState(node *v1.Node) (*gpu.NodeState, bool) {
	pods, ok := s.PodsOnNode(node.Name)
	if !ok {
		return nil, false
	}
	return s.Tracker().Compute(node, pods, 0, 0, "", false), true
}

// PodGen changes whenever a pod bound to the node is added, changed or
// removed in the informer (BumpPodGen, from the pod handler).
func (s *Shared) PodGen(node string) uint64 {
	if c, ok := s.acc.podGen.Load(node); ok {
		return c.(*atomic.Uint64).Load()
	}
	return 0
}

// BumpPodGen records a change of the node's pods.
func (s *Shared) BumpPodGen(node string) {
	c, ok := s.acc.podGen.Load(node)
	if !ok {
		c, _ = s.acc.podGen.LoadOrStore(node, new(atomic.Uint64))
	}
	c.(*atomic.Uint64).Add(1)
}

// ForgetPodGen drops a deleted node's counter.
func (s *Shared) ForgetPodGen(node string) { s.acc.podGen.Delete(node) }

// SameDevices reports whether two versions of a node report the same GPUs
// (objects.SameDevices).
func (s *Shared) SameDevices(a, b *v1.Node) bool {
	return objects.SameDevices(a, b, s.Tracker().Options())
}

// AllPods lists every pod in the informer (nil without one).
func (s *Shared) AllPods() []*v1.Pod {
	idx := s.acc.podIndex.Load()
	if idx == nil {
		return nil
	}
	var out []*v1.Pod
	for _, o := range (*idx).List() {
		if p, ok := o.(*v1.Pod); ok {
			out = append(out, p)
		}
	}
	return out
}

// requestState is the pod's parsed GPU request, written once per cycle by
// GPUFit's PreFilter and read by GPUFit and GPUScore.
type requestState struct {
	req gpu.Request
	pin *Pin
}

// Pin is the devices a pod group's preemption plans to free for one of its
// pods: in that dry run, the pod's Filter and Reserve on the node take
// these devices and no others, so that a victim holding them is evicted and
// every other is reprieved.
type Pin struct {
	Node   string
	Choice gpu.Choice
}

// Clone is cheap: the request never changes within a cycle.
func (r *requestState) Clone() fwk.StateData { return r }

// RequestKey is the CycleState key of the parsed request.
const RequestKey fwk.StateKey = "PreFilterGPUFit"

// WriteRequest stores the parsed request.
func WriteRequest(cs fwk.CycleState, r gpu.Request) {
	cs.Write(RequestKey, &requestState{req: r})
}

// ReadRequest returns the parsed request, or an error if PreFilter did not run.
func ReadRequest(cs fwk.CycleState) (*gpu.Request, error) {
	r, _, err := ReadPinned(cs)
	return r, err
}

// ReadPinned is ReadRequest with the pod's pin, if a dry run set one.
func ReadPinned(cs fwk.CycleState) (*gpu.Request, *Pin, error) {
	d, err := cs.Read(RequestKey)
	if err != nil {
		return nil, nil, fmt.Errorf("reading %q from cycle state: %w", RequestKey, err)
	}
	r, ok := d.(*requestState)
	if !ok {
		return nil, nil, fmt.Errorf("%q has type %T", RequestKey, d)
	}
	return &r.req, r.pin, nil
}

// WritePin pins the request PreFilter wrote to devices of a node (nil
// unpins). The state is replaced, not changed: clones of the cycle state
// keep what they had.
func WritePin(cs fwk.CycleState, pin *Pin) error {
	r, _, err := ReadPinned(cs)
	if err != nil {
		return err
	}
	cs.Write(RequestKey, &requestState{req: *r, pin: pin})
	return nil
}
