package gpu

import (
	"sort"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Tracker derives each node's device usage from the pods bound to it (their
// assignment annotations) plus the reservations this process holds for pods
// it has chosen a node for but whose annotation it has not yet seen. Nothing
// in it is durable: after a restart the pods alone rebuild it.
//
// Built states are cached per node and invalidated by the node's generation
// (any change to the node or its pods) or by a reservation change, so the
// per-node hot path is a lookup.
type Tracker struct {
	opts    NodeOptions
	reqOpts RequestOptions
	// alive reports whether a reservation's pod still exists (and is not
	// bound to another node); nil means always.
	alive atomic.Pointer[func(types.UID, Reservation) bool]

	// slots is a read-only map for the per-node hot path, read without a
	// lock (a plain map reads faster than a sync.Map). New nodes go to
	// added, under slotMu, and are merged into a new slots map once added
	// holds a quarter as many: adding n nodes one by one costs O(n) in all.
	slots  atomic.Pointer[map[string]*slot]
	slotMu sync.Mutex
	added  map[string]*slot
	mu     sync.RWMutex
	byUID  map[types.UID]string
}

type slot struct {
	mu           sync.Mutex
	reservations map[types.UID]Reservation
	version      atomic.Uint64
	cached       atomic.Pointer[NodeState]
}

type stateKey struct {
	generation int64
	version    uint64
}

// Reservation is an in-flight device choice for a pod.
type Reservation struct {
	Namespace, Name string
	Choice          Choice
	// Since is when it was made.
	Since time.Time
}

// NewTracker reads nodes and pods with the given options.
func NewTracker(opts NodeOptions) *Tracker {
	t := &Tracker{
		opts:    opts,
		reqOpts: RequestOptions{ResourceNames: opts.ResourceNames},
		byUID:   map[types.UID]string{},
	}
	return t
}

// SetAlive tells the tracker how to check that a reserved pod still exists,
// for reservations whose pod is not in the node's view.
func (t *Tracker) SetAlive(f func(types.UID, Reservation) bool) { t.alive.Store(&f) }

// Options returns what the tracker reads.
func (t *Tracker) Options() NodeOptions { return t.opts }

// RequestOptions returns the options to parse pod requests with.
func (t *Tracker) RequestOptions() RequestOptions { return t.reqOpts }

func (t *Tracker) slot(node string, create bool) *slot {
	if m := t.slots.Load(); m != nil {
		if s := (*m)[node]; s != nil {
			return s
		}
	}
	t.slotMu.Lock()
	defer t.slotMu.Unlock()
	if m := t.slots.Load(); m != nil && (*m)[node] != nil {
		return (*m)[node]
	}
	s := t.added[node]
	if s == nil && create {
		s = &slot{reservations: map[types.UID]Reservation{}}
		if t.added == nil {
			t.added = map[string]*slot{}
		}
		t.added[node] = s
	}
	if len(t.added) > 0 {
		var old map[string]*slot
		if m := t.slots.Load(); m != nil {
			old = *m
		}
		if len(t.added) >= len(old)/4 {
			m := make(map[string]*slot, len(old)+len(t.added))
			for k, v := range old {
				m[k] = v
			}
			for k, v := range t.added {
				m[k] = v
			}
			t.slots.Store(&m)
			t.added = nil
		}
	}
	return s
}

// Lookup returns the cached state of a node if it is still current for the
// given generation of the node's scheduler view, else nil.
func (t *Tracker) Lookup(node string, generation int64) *NodeState {
	s := t.slot(node, false)
	if s == nil {
		return nil
	}
	st := s.cached.Load()
	if st == nil || st.key.generation != generation || st.key.version != s.version.Load() {
		return nil
	}
	return st
}

// Build computes a node's state from the node, the pods on it, and the
// reservations, caches it under the generation, and returns it. cpuFree is
// the node's allocatable CPU minus what its pods request, memFree the same
// for memory in MiB.
func (t *Tracker) Build(node *v1.Node, generation int64, pods []*v1.Pod, cpuFree, memFree int64) *NodeState {
	st := t.Compute(node, pods, cpuFree, memFree, "", true)
	s := t.slot(node.Name, true)
	s.mu.Lock()
	defer s.mu.Unlock()
	if st.key.version == s.version.Load() {
		st.key.generation = generation
		s.cached.Store(st)
	}
	return st
}

// Compute is Build without the cache. The pod with UID exclude, if any, is
// left out: Reserve evaluates a node as it was before the pod was assumed.
//
// pods is the scheduler's snapshot of the node (snapshot), or the informer's
// (not). A reservation counts while its pod is in that view without an
// assignment, or exists unbound elsewhere (in flight). It is retired when the
// snapshot shows the pod with its assignment (never from the informer's view,
// which runs ahead of the snapshot), or when the pod is gone.
func (t *Tracker) Compute(node *v1.Node, pods []*v1.Pod, cpuFree, memFree int64, exclude types.UID, snapshot bool) *NodeState {
	s := t.slot(node.Name, true)
	var done []types.UID
	defer func() {
		// Outside s.mu: the lock order is t.mu before s.mu.
		for _, uid := range done {
			t.dropUID(uid)
		}
	}()
	s.mu.Lock()
	defer s.mu.Unlock()
	st := NewNodeState(node.Name, ReadInventory(node, t.opts), cpuFree)
	st.MemFree = memFree
	st.key.version = s.version.Load()
	var handled map[types.UID]bool // written only for reserved pods
	if len(s.reservations) > 0 {
		handled = make(map[types.UID]bool, len(s.reservations))
	}
	var unknown []Request
	for _, pod := range pods {
		if exclude != "" && pod.UID == exclude {
			continue
		}
		if a, ok := assignmentFor(pod, node.Name); ok {
			st.TakeAssignment(a)
			if _, reserved := s.reservations[pod.UID]; reserved {
				handled[pod.UID] = true
				if snapshot {
					// The scheduler sees the annotation: the reservation
					// has done its job.
					delete(s.reservations, pod.UID)
					done = append(done, pod.UID)
				}
			}
			continue
		}
		if r, ok := s.reservations[pod.UID]; ok {
			st.TakeChoice(r.Choice)
			handled[pod.UID] = true
			continue
		}
		if !UsesGPU(pod, t.reqOpts) {
			continue
		}
		if req, err := ParseRequest(pod, t.reqOpts); err == nil && req.HasGPU() {
			unknown = append(unknown, req)
		}
	}
	alive := t.alive.Load()
	for uid, r := range s.reservations {
		if handled[uid] || uid == exclude {
			continue
		}
		if alive != nil && !(*alive)(uid, r) {
			// The pod is gone: the reservation is stale.
			delete(s.reservations, uid)
			done = append(done, uid)
			continue
		}
		st.TakeChoice(r.Choice)
	}
	for i := range unknown {
		devices, milli, ok := unknown[i].PerDevice(st.MemoryMiB)
		if ok {
			st.takeUnknown(devices, min(milli, MilliPerGPU))
		}
	}
	return st
}

func (t *Tracker) dropUID(uid types.UID) {
	t.mu.Lock()
	if node, ok := t.byUID[uid]; ok {
		if s := t.slot(node, false); s != nil {
			s.mu.Lock()
			_, still := s.reservations[uid]
			s.mu.Unlock()
			if still {
				// Reserved again since (a retry): keep the index.
				t.mu.Unlock()
				return
			}
		}
	}
	delete(t.byUID, uid)
	t.mu.Unlock()
}

// assignmentFor returns the pod's assignment if it is valid and for this node.
func assignmentFor(pod *v1.Pod, node string) (Assignment, bool) {
	v, ok := pod.Annotations[AnnotationAssignment]
	if !ok {
		return Assignment{}, false
	}
	a, err := ParseAssignment(v)
	if err != nil || a.Node != node {
		return Assignment{}, false
	}
	return a, true
}

// HasAssignment reports whether a pod carries a valid assignment for the node.
func HasAssignment(pod *v1.Pod, node string) bool {
	_, ok := assignmentFor(pod, node)
	return ok
}

// Reserve records an in-flight choice. Reserving the same pod again replaces
// the earlier choice, wherever it was.
func (t *Tracker) Reserve(node string, uid types.UID, r Reservation) {
	t.mu.Lock()
	prev, had := t.byUID[uid]
	t.byUID[uid] = node
	t.mu.Unlock()
	if had && prev != node {
		t.unreserve(prev, uid)
	}
	s := t.slot(node, true)
	s.mu.Lock()
	s.reservations[uid] = r
	s.version.Add(1)
	s.mu.Unlock()
}

// Unreserve drops a pod's reservation. It is idempotent.
func (t *Tracker) Unreserve(uid types.UID) bool {
	t.mu.Lock()
	node, ok := t.byUID[uid]
	delete(t.byUID, uid)
	t.mu.Unlock()
	if !ok {
		return false
	}
	return t.unreserve(node, uid)
}

func (t *Tracker) unreserve(node string, uid types.UID) bool {
	s := t.slot(node, false)
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.reservations[uid]; !ok {
		return false
	}
	delete(s.reservations, uid)
	s.version.Add(1)
	return true
}

// Reserved returns a pod's in-flight reservation.
func (t *Tracker) Reserved(uid types.UID) (string, Reservation, bool) {
	t.mu.RLock()
	node, ok := t.byUID[uid]
	t.mu.RUnlock()
	if !ok {
		return "", Reservation{}, false
	}
	s := t.slot(node, false)
	if s == nil {
		return "", Reservation{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.reservations[uid]
	return node, r, ok
}

// ReservationEntry is one reservation, for reconcilers and metrics.
type ReservationEntry struct {
	Node string
	UID  types.UID
	Reservation
}

// Reservations lists the in-flight reservations, ordered by node and pod.
func (t *Tracker) Reservations() []ReservationEntry {
	var names []string
	var slots []*slot
	t.slotMu.Lock()
	if m := t.slots.Load(); m != nil {
		for k, v := range *m {
			names = append(names, k)
			slots = append(slots, v)
		}
	}
	for k, v := range t.added {
		names = append(names, k)
		slots = append(slots, v)
	}
	t.slotMu.Unlock()
	var out []ReservationEntry
	for i, s := range slots {
		s.mu.Lock()
		for uid, r := range s.reservations {
			out = append(out, ReservationEntry{Node: names[i], UID: uid, Reservation: r})
		}
		s.mu.Unlock()
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Node != out[j].Node {
			return out[i].Node < out[j].Node
		}
		return out[i].UID < out[j].UID
	})
	return out
}

// ForgetNode drops a deleted node's cache and reservations.
func (t *Tracker) ForgetNode(node string) {
	t.mu.Lock()
	if s := t.removeSlot(node); s != nil {
		s.mu.Lock()
		for uid := range s.reservations {
			delete(t.byUID, uid)
		}
		s.mu.Unlock()
	}
	t.mu.Unlock()
}

// removeSlot takes a node out of the index; deletions are rare, so the
// read-only map is copied.
func (t *Tracker) removeSlot(node string) *slot {
	t.slotMu.Lock()
	defer t.slotMu.Unlock()
	if s := t.added[node]; s != nil {
		delete(t.added, node)
		return s
	}
	m := t.slots.Load()
	if m == nil || (*m)[node] == nil {
		return nil
	}
	s := (*m)[node]
	n := make(map[string]*slot, len(*m))
	for k, v := range *m {
		if k != node {
			n[k] = v
		}
	}
	t.slots.Store(&n)
	return s
}
