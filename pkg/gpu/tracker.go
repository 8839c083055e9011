package gpu

import (
	"math/bits"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
	"weak"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Tracker derives each node's device usage from the pods bound to it plus the
// reservations this process holds for pods it has chosen a node for but whose
// assignment it has not yet seen. Every GPU pod on a node counts, whoever
// placed it, by what its request takes: on the devices its assignment names
// when that agrees with the request, laid down on what is left otherwise.
// Nothing in it is durable: after a restart the pods alone rebuild it. One
// tracker serves every profile of a process.
//
// Built states are cached per node and invalidated by the node's generation
// (any change to the node or its pods) or by a reservation change, so the
// per-node hot path is a lookup.
type Tracker struct {
	opts    NodeOptions
	reqOpts RequestOptions
	// alive reports whether a reservation's pod still exists and is not
	// bound to another node; nil means always.
	alive atomic.Pointer[func(uid types.UID, node string, r Reservation) bool]
	seq   atomic.Uint64

	// slots is a read-only map for the per-node hot path, read without a
	// lock (a plain map reads faster than a sync.Map). New nodes go to
	// added, under slotMu, and are merged into a new slots map once added
	// holds a quarter as many: adding n nodes one by one costs O(n) in all.
	slots  atomic.Pointer[map[string]*slot]
	slotMu sync.Mutex
	added  map[string]*slot
	mu     sync.RWMutex
	byUID  map[types.UID]string
	// pendingAt indexes the in-flight pods of other schedulers by node.
	pendingAt map[types.UID]string
	// nominated: pod UID to nomination (nominate.go).
	nominated sync.Map
	// fast leads from a caller's key for a node to its slot (LookupAt).
	fast   atomic.Pointer[fastSlots]
	nslots atomic.Int64
}

// fastSlots is a table in front of the map by name. At thousands of nodes,
// reading that map (hashing the name, comparing it, then the slot) misses
// the CPU's caches several times per node, and the scheduler asks once or
// twice per node per pod; here a key's bucket is one cache line, and its
// entry leads to the state itself. The key is the address of the caller's
// view of the node (the scheduler snapshot's NodeInfo, which keeps one
// address for the node's life) over the object's size, held as a number:
// it keeps no NodeInfo alive. An entry keeps its state alive until it is
// replaced (4 entries per node, and the caller remembers its snapshot's
// NodeInfos, not the copies that preemption makes). No entry is trusted: it
// only leads to a state whose generation is the caller's (a generation
// belongs to one content of one node) and that is not stale (the slot's
// cached state, with no change of the node's holds since: slot.store and
// slot.bump mark it), so an entry that is old, reused or torn between two
// writers is a miss, never a wrong state.
type fastSlots struct {
	shift uint
	b     []fastBucket
}

// fastBucket is 4 ways, one cache line: a direct-mapped table (one way)
// sized 4 entries per node still left a fifth of the keys sharing an entry
// with another, each a miss every time its node came round.
type fastBucket [4]fastEntry

type fastEntry struct {
	key atomic.Uintptr
	st  atomic.Pointer[NodeState]
}

func (f *fastSlots) bucket(key uintptr) *fastBucket {
	return &f.b[(uint64(key)*0x9E3779B97F4A7C15)>>f.shift]
}

// growFast keeps at least a bucket (4 entries) per node, 2 after growing: a
// bucket then overflows (its fifth key misses) for a few nodes in a
// thousand. A new table starts empty and fills on the next misses.
func (t *Tracker) growFast() {
	n := t.nslots.Add(1)
	if f := t.fast.Load(); f != nil && int64(len(f.b)) >= n {
		return
	}
	bits := uint(8)
	for int64(1)<<bits < 2*n {
		bits++
	}
	t.fast.Store(&fastSlots{shift: 64 - bits, b: make([]fastBucket, 1<<bits)})
}

// LookupAt is Lookup through the caller's key for the node (fastSlots): nil
// when the key leads to no state current for generation. The caller then
// looks the node up by name and tells the key (Remember).
func (t *Tracker) LookupAt(key uintptr, generation int64) *NodeState {
	f := t.fast.Load()
	if f == nil || key == 0 || generation == 0 {
		return nil
	}
	b := f.bucket(key)
	for i := range b {
		if b[i].key.Load() != key {
			continue
		}
		st := b[i].st.Load()
		if st == nil || st.key.generation != generation || st.stale.Load() {
			return nil
		}
		if st.key.until != 0 && time.Now().UnixNano() > st.key.until {
			return nil
		}
		return st
	}
	return nil
}

// Remember leads key to the node's cached state: in the key's entry if it
// has one, else in a free entry or one whose state is stale.
func (t *Tracker) Remember(key uintptr, node string) {
	f := t.fast.Load()
	if f == nil || key == 0 {
		return
	}
	s := t.slot(node, false)
	if s == nil {
		return
	}
	st := s.cached.Load()
	if st == nil {
		return
	}
	b := f.bucket(key)
	e := &b[int(key)&3]
	for i := range b {
		if b[i].key.Load() == key {
			e = &b[i]
			break
		}
	}
	if e.key.Load() != key {
		for i := range b {
			if k := b[i].key.Load(); k == 0 {
				e = &b[i]
				break
			}
			if old := b[i].st.Load(); old == nil || old.stale.Load() {
				e = &b[i]
			}
		}
	}
	if e.st.Load() != st {
		e.st.Store(st)
	}
	if e.key.Load() != key {
		e.key.Store(key)
	}
}

type slot struct {
	mu           sync.Mutex
	reservations map[types.UID]Reservation
	// pending are pods another scheduler chose this node's devices for
	// and has not bound yet: the agent's record names the node (HAMi's
	// scheduler writes it before it binds).
	pending map[types.UID]pendingPod
	version atomic.Uint64
	cached  atomic.Pointer[NodeState]
	// gone: the node was deleted (s.mu).
	gone bool
}

// buildBase is the input of a built state: the node object, and which of
// its pods the device accounting reads (relevant), in order. It names them
// by weak pointers, which compare equal exactly when the objects are the
// same and keep none alive: a node scored no more (full, or no longer a
// candidate) would otherwise hold the versions of all its pods and of
// itself that the informers have replaced since (with CPU pods packed 250
// to a node, a copy of every bound pod).
type buildBase struct {
	node weak.Pointer[v1.Node]
	pods []weak.Pointer[v1.Pod]
	// addrs are the pods' addresses, a cheap first test before the weak
	// pointer's (an address alone may be a new object's).
	addrs []uintptr
	// rel has bit i set when pods[i] is relevant.
	rel []uint64
	// relPods are the relevant pods, in order.
	relPods []weak.Pointer[v1.Pod]
	// unbound: a relevant pod is not bound, and counts by a nomination
	// that can change without the pod changing.
	unbound bool
}

type stateKey struct {
	generation int64
	version    uint64
	// until, if set, is when the state expires (an in-flight pod of
	// another scheduler stops counting then), in Unix nanoseconds.
	until int64
	// held: reservations or other schedulers' in-flight pods were on the
	// node when it was computed (some are retired without a version
	// change: see Unchanged).
	held bool
}

type pendingPod struct {
	pod   *v1.Pod
	until time.Time
}

// SetPending records (node != "") or forgets (node == "") a pod that another
// scheduler chose devices for on node and has not bound yet; it holds
// them, as that scheduler's own accounting says, until it is bound or gone,
// or until.
func (t *Tracker) SetPending(pod *v1.Pod, node string, until time.Time) {
	if node == "" {
		// Every pod event comes here: most never were pending.
		t.mu.RLock()
		_, had := t.pendingAt[pod.UID]
		t.mu.RUnlock()
		if !had {
			return
		}
	}
	// One critical section (t.mu before s.mu, as everywhere), so that two
	// calls for one pod cannot leave it on two nodes.
	t.mu.Lock()
	defer t.mu.Unlock()
	prev, had := t.pendingAt[pod.UID]
	if had && prev != node {
		if s := t.slot(prev, false); s != nil {
			s.mu.Lock()
			delete(s.pending, pod.UID)
			s.bump()
			s.mu.Unlock()
		}
	}
	if node == "" {
		delete(t.pendingAt, pod.UID)
		return
	}
	if t.pendingAt == nil {
		t.pendingAt = map[types.UID]string{}
	}
	t.pendingAt[pod.UID] = node
	s := t.slot(node, true)
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur, ok := s.pending[pod.UID]; ok && cur.until.Equal(until) && sameRecord(cur.pod, pod) {
		return // a status update: nothing a state depends on
	}
	if s.pending == nil {
		s.pending = map[types.UID]pendingPod{}
	}
	s.pending[pod.UID] = pendingPod{pod: pod, until: until}
	s.bump()
}

// PendingOn returns the version of a pod counted as another scheduler's
// in-flight pod on node, or nil.
func (t *Tracker) PendingOn(uid types.UID, node string) *v1.Pod {
	t.mu.RLock()
	at, ok := t.pendingAt[uid]
	t.mu.RUnlock()
	if !ok || at != node {
		return nil
	}
	s := t.slot(node, false)
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pending[uid].pod
}

// sameRecord reports whether two versions of a pending pod hold the same:
// same annotations (the agent's record is one) and containers.
func sameRecord(a, b *v1.Pod) bool {
	if len(a.Annotations) != len(b.Annotations) || len(a.Spec.Containers) != len(b.Spec.Containers) || len(a.Spec.InitContainers) != len(b.Spec.InitContainers) {
		return false
	}
	for k, v := range a.Annotations {
		if w, ok := b.Annotations[k]; !ok || v != w {
			return false
		}
	}
	return true
}

// Reservation is an in-flight device choice for a pod.
type Reservation struct {
	Namespace, Name string
	Choice          Choice
	// Since is when it was made.
	Since time.Time
	// Seq identifies this reservation among the pod's successive ones
	// (set by Reserve), so that a late release drops only its own.
	Seq uint64
	// Uncertain is set while the pod's bind failed in a way that may still
	// land: the pod is not scheduled again until that is known.
	Uncertain bool
}

// NewTracker reads nodes and pods with the given options.
func NewTracker(opts NodeOptions) *Tracker {
	t := &Tracker{
		opts:    opts,
		reqOpts: RequestOptions{ResourceNames: opts.ResourceNames, Agent: opts.Agent},
		byUID:   map[types.UID]string{},
	}
	return t
}

// SetAlive tells the tracker how to check that a reserved pod still exists
// (and is not bound to another node), for reservations whose pod is not in
// the node's view.
func (t *Tracker) SetAlive(f func(uid types.UID, node string, r Reservation) bool) { t.alive.Store(&f) }

// NodeVersion changes whenever the node's reservations or in-flight pods
// of other schedulers change: with the node and its pods, it is all a
// computed state depends on.
func (t *Tracker) NodeVersion(node string) uint64 {
	if s := t.slot(node, false); s != nil {
		return s.version.Load()
	}
	return 0
}

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
		t.growFast()
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
	lookupStats.Add(1)
	s := t.slot(node, false)
	if s == nil {
		return nil
	}
	return s.current(generation)
}

// Known is the node's last computed state, current or not (nil if none):
// what a node reports of its devices changes far less often than what its
// pods hold, so the inventory of a stale state is still a fair count.
func (t *Tracker) Known(node string) *NodeState {
	s := t.slot(node, false)
	if s == nil {
		return nil
	}
	return s.cached.Load()
}

// lookupStats counts the lookups by name.
var lookupStats atomic.Uint64

// Lookups is how many lookups by name ran since the process started: the
// per-node cost guard counts them (none on a warm cache).
func Lookups() uint64 { return lookupStats.Load() }

// store caches st (s.mu held). The state it replaces is marked stale: only
// a slot's cached state can be served through fastSlots, until a bump.
func (s *slot) store(st *NodeState) {
	if s.gone {
		return // the node was deleted while this state was computed
	}
	if old := s.cached.Load(); old != nil && old != st {
		old.stale.Store(true)
	}
	s.cached.Store(st)
}

// bump records a change of the node's reservations, nominations or other
// schedulers' in-flight pods (s.mu held): no state computed before is
// current.
func (s *slot) bump() {
	s.version.Add(1)
	if st := s.cached.Load(); st != nil {
		st.stale.Store(true)
	}
}

// current is the slot's cached state if it is current for generation.
func (s *slot) current(generation int64) *NodeState {
	st := s.cached.Load()
	if st == nil || st.key.generation != generation || st.key.version != s.version.Load() {
		return nil
	}
	if st.key.until != 0 && time.Now().UnixNano() > st.key.until {
		return nil
	}
	return st
}

// Unchanged reports whether Compute, given the same node and pods again at
// now, would return the same as the state it returned before. Never for a
// node that has, or had when st was computed, reservations or other
// schedulers' in-flight pods: Compute checks each time that their pods
// still exist, and a reservation the scheduler's snapshot retires goes
// without a version change.
func (t *Tracker) Unchanged(node string, st *NodeState, now time.Time) bool {
	if st.key.held || st.key.until != 0 && now.UnixNano() > st.key.until {
		return false
	}
	s := t.slot(node, false)
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return st.key.version == s.version.Load() && len(s.reservations) == 0 && len(s.pending) == 0
}

// Build computes a node's state from the node, the pods on it, and the
// reservations, caches it under the generation, and returns it. cpuFree is
// the node's allocatable CPU minus what its pods request, memFree the same
// for memory in MiB.
//
// The step from the previous build is an increment: pods seen before (the
// same object at the same place in the list) are not parsed again, and when
// the relevant pods (those that use a GPU, or are not bound) are the same
// objects in the same order, the devices are as before and only the CPU and
// memory left change. A CPU pod's bind so costs an address comparison and
// a weak pointer's read per pod, never a parse.
//
// Build keeps no pod or node object: the next build recognises them by
// weak pointers (buildBase).
func (t *Tracker) Build(node *v1.Node, generation int64, pods []*v1.Pod, cpuFree, memFree int64) *NodeState {
	s := t.slot(node.Name, true)
	// The base travels with the state it built, so that the two always
	// belong together whatever builds of the node overlap.
	old := s.cached.Load()
	var prev *buildBase
	if old != nil {
		prev = old.base
	}
	b := t.classify(prev, node, pods)
	var st *NodeState
	// A new node object may change the inventory: the devices are computed
	// again, from the pods classified as before (that depends on the pods
	// alone).
	if prev != nil && prev.node == b.node && !b.unbound && slices.Equal(prev.relPods, b.relPods) &&
		!old.key.held && old.key.until == 0 && old.key.version == s.version.Load() && !old.TooMany() {
		st = old.Clone()
		st.CPUFree, st.MemFree = cpuFree, memFree
		st.key = old.key
		buildStats.reused.Add(1)
	} else {
		st = t.compute(node, pods, cpuFree, memFree, "", true, nil, b.rel)
		buildStats.computed.Add(1)
	}
	st.base = b
	st.seal()
	s.mu.Lock()
	defer s.mu.Unlock()
	if st.key.version == s.version.Load() {
		st.key.generation = generation
		s.store(st)
	}
	return st
}

// KnownWithoutDevices reports whether the node, this very object, was built
// before and has no GPU: a CPU-only pod's score there needs no state.
func (t *Tracker) KnownWithoutDevices(node *v1.Node) bool {
	s := t.slot(node.Name, false)
	if s == nil {
		return false
	}
	st := s.cached.Load()
	return st != nil && st.base != nil && st.base.node.Value() == node && st.Count == 0 && !st.TooMany() && !st.stale.Load()
}

// buildStats counts Build's work (Builds).
var buildStats struct{ reused, computed, parsed, read atomic.Uint64 }

// BuildStats is what Build did since the process started.
type BuildStats struct {
	// Reused: builds that kept the previous devices; Computed: builds that
	// computed them.
	Reused, Computed uint64
	// Parsed: pods Build parsed to tell whether they use a GPU (those not
	// seen before); Read: pods the device accounting read when it computed
	// a state (in Build, the relevant ones, or every pod while reservations
	// are held; also Compute's, for the reconciler, hints and preemption).
	Parsed, Read uint64
}

// Builds reports Build's work: what the per-node cost guard counts.
func Builds() BuildStats {
	return BuildStats{buildStats.reused.Load(), buildStats.computed.Load(), buildStats.parsed.Load(), buildStats.read.Load()}
}

// classify marks which pods the device accounting reads, taking the answer
// from prev for a pod object at the same place.
func (t *Tracker) classify(prev *buildBase, node *v1.Node, pods []*v1.Pod) *buildBase {
	b := &buildBase{pods: make([]weak.Pointer[v1.Pod], len(pods)), addrs: make([]uintptr, len(pods)), rel: make([]uint64, (len(pods)+63)/64)}
	if prev != nil && prev.node.Value() == node {
		b.node = prev.node
	} else {
		b.node = weak.Make(node)
	}
	parsed := 0
	for i, p := range pods {
		// weak.Make only for an object not seen here before: it looks
		// the object's handle up under a lock.
		b.addrs[i] = uintptr(unsafe.Pointer(p))
		seen := prev != nil && i < len(prev.pods) && prev.addrs[i] == b.addrs[i] && prev.pods[i].Value() == p
		if seen {
			b.pods[i] = prev.pods[i]
		} else {
			b.pods[i] = weak.Make(p)
		}
		var r bool
		if seen {
			r = prev.rel[i>>6]&(1<<(uint(i)&63)) != 0
		} else {
			r = p.Spec.NodeName == "" || UsesGPU(p, t.reqOpts)
			parsed++
		}
		if r {
			b.rel[i>>6] |= 1 << (uint(i) & 63)
			b.relPods = append(b.relPods, b.pods[i])
			b.unbound = b.unbound || p.Spec.NodeName == ""
		}
	}
	buildStats.parsed.Add(uint64(parsed))
	return b
}

// Compute is Build without the cache. The pod with UID exclude, if any, is
// left out: Reserve evaluates a node as it was before the pod was assumed.
//
// pods is the scheduler's snapshot of the node (snapshot), or the informer's
// (not). A reservation counts while its pod is in that view without an
// agreeing assignment, or exists unbound elsewhere (in flight). It is retired
// when the snapshot shows the pod with its assignment (never from the
// informer's view, which runs ahead of the snapshot), or when the pod is gone.
func (t *Tracker) Compute(node *v1.Node, pods []*v1.Pod, cpuFree, memFree int64, exclude types.UID, snapshot bool) *NodeState {
	return t.compute(node, pods, cpuFree, memFree, exclude, snapshot, nil, nil)
}

// Holding is how one pod is counted on a node (Explain).
type Holding struct {
	Namespace, Name string
	UID             types.UID
	// Devices and Milli are what the pod's request takes here.
	Devices, Milli int32
	// Source says where its devices come from: HoldAssignment,
	// HoldReservation or HoldRequest (laid down on what was left).
	Source string
	// Ignored says why the pod's assignment annotation did not count.
	Ignored string
	// Fits is false when the pod could not be laid down: it is what
	// overcommits the node.
	Fits bool
	// Mask is the devices it holds (by index).
	Mask uint64
}

// Where a holding's devices come from.
const (
	HoldAssignment  = "assignment"
	HoldReservation = "reservation"
	HoldRequest     = "request"
	// HoldClaim: an allocated ResourceClaim (DRA), whoever allocated it;
	// a pod it serves holds nothing more.
	HoldClaim = "claim"
	// HoldAgent: the node agent's record of the pod (HAMi's
	// vgpu-devices-allocated).
	HoldAgent = "agent"
)

// Explain lists how each GPU pod on the node is counted, and the state that
// results (for the overcommit report and tools; it allocates).
func (t *Tracker) Explain(node *v1.Node, pods []*v1.Pod) ([]Holding, *NodeState) {
	var hs []Holding
	st := t.compute(node, pods, 0, 0, "", false, &hs, nil)
	return hs, st
}

// hold is what a bound pod holds on a node: the devices and milli of each
// its request takes (and, where an agent enforces shares, the share of
// each), and the record of which devices, when it agrees with the request:
// our assignment, or the agent's record of the pod.
type hold struct {
	devices, milli int32
	share          DeviceShare
	a              Assignment
	uses           []DeviceUse
	agrees         bool
}

// holds reads what a pod on a node with the given inventory holds; ok is
// false for a pod that holds no device. An invalid request (which we never
// placed) holds its whole GPUs; a share that cannot be sized on this node
// (memory unknown, or larger than a device) holds a whole device; a share
// the node's plain device plugin was asked for got a whole device.
func holds(pod *v1.Pod, node string, inv *Inventory, opts RequestOptions) (h hold, ok bool) {
	req, err := parseGPURequest(pod, opts)
	invalid := err != nil
	if invalid {
		req = Request{Count: int32(min(WholeGPUs(pod, opts), MaxDevices+1))}
	}
	if !req.HasGPU() {
		if invalid && inv.Devices != nil && !inv.Claimed {
			// A request we cannot read (several containers with
			// shares, say) may still have the agent's record.
			if uses, has := opts.Agent.Uses(pod, node); has && usesKnown(uses, inv) {
				return hold{devices: int32(len(uses)), uses: uses, agrees: true}, true
			}
		}
		return hold{}, false
	}
	if inv.Devices != nil {
		return holdsOnAgent(pod, node, inv, opts, &req, invalid), true
	}
	if req.Slot || req.ShareCount > 0 {
		// The plain device plugin gave it whole devices.
		req = Request{Count: max(req.ShareCount, 1)}
	}
	devices, milli, out := req.PerDevice(inv.MemoryMiB)
	if out != Fits {
		devices, milli = 1, MilliPerGPU
	}
	h = hold{devices: devices, milli: milli}
	if v, has := pod.Annotations[AnnotationAssignment]; has {
		if pa, err := ParseAssignment(v); err == nil && pa.Node == node && pa.agrees(devices, milli, inv.Count) {
			h.a, h.agrees = pa, true
		}
	}
	return h, true
}

// holdsOnAgent is holds on a node whose agent enforces shares: the agent's
// record of the pod counts where it agrees with the request (one device
// per device asked for, each known here, each with the share the request
// takes on it); otherwise the request is laid down.
func holdsOnAgent(pod *v1.Pod, node string, inv *Inventory, opts RequestOptions, req *Request, invalid bool) hold {
	devices, sh := req.AgentShare()
	h := hold{devices: devices, share: sh, milli: MilliPerGPU}
	if len(inv.Devices) > 0 && sh != Exclusive {
		h.milli = sh.milliOn(&inv.Devices[0])
	}
	if inv.Claimed {
		// Only claims record devices there (Tracker.compute).
		return h
	}
	uses, has := opts.Agent.Uses(pod, node)
	if !has || !usesKnown(uses, inv) || (!invalid && int32(len(uses)) < devices) {
		// No record here, or one that names fewer devices than the pod
		// asks for: the request is laid down, all of it.
		return h
	}
	if invalid {
		h.uses, h.agrees = uses, true
		return h
	}
	agrees := int32(len(uses)) == devices
	for _, u := range uses {
		d := &inv.Devices[inv.DeviceIndex(u.UUID)]
		if u.Slots != 1 || u.MemoryMiB != sh.MemoryOn(d.MemoryMiB) || u.Cores != sh.Cores {
			agrees = false
		}
	}
	if agrees {
		h.uses, h.agrees = uses, true
		return h
	}
	// The record disagrees (edited, or written under other defaults than
	// ours): it still says which devices the plugin handed out, so those
	// count, each at no less than the request takes there.
	h.uses = make([]DeviceUse, len(uses))
	for i, u := range uses {
		d := &inv.Devices[inv.DeviceIndex(u.UUID)]
		h.uses[i] = DeviceUse{UUID: u.UUID, MemoryMiB: max(u.MemoryMiB, sh.MemoryOn(d.MemoryMiB)), Cores: max(u.Cores, sh.Cores), Slots: max(u.Slots, 1)}
	}
	return h
}

// usesKnown reports whether every device of a record is on the node, once.
func usesKnown(uses []DeviceUse, inv *Inventory) bool {
	for i, u := range uses {
		if inv.DeviceIndex(u.UUID) < 0 {
			return false
		}
		for _, v := range uses[:i] {
			if v.UUID == u.UUID {
				return false
			}
		}
	}
	return len(uses) > 0
}

// rel, if not nil, marks the pods to read (classify): the others are CPU
// pods, skipped without a parse unless reserved.
func (t *Tracker) compute(node *v1.Node, pods []*v1.Pod, cpuFree, memFree int64, exclude types.UID, snapshot bool, explain *[]Holding, rel []uint64) *NodeState {
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
	st.key.held = len(s.reservations) > 0 || len(s.pending) > 0
	var handled map[types.UID]bool // written only for reserved pods
	if len(s.reservations) > 0 {
		handled = make(map[types.UID]bool, len(s.reservations))
	}
	var loose []held
	note := func(pod *v1.Pod, devices, milli int32, source, ignored string, mask uint64) int {
		if explain == nil {
			return -1
		}
		*explain = append(*explain, Holding{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID,
			Devices: devices, Milli: milli, Source: source, Ignored: ignored, Fits: true, Mask: mask})
		return len(*explain) - 1
	}
	var claims []ClaimHold
	if st.Claimed {
		claims = t.opts.Claims.Claimed(node.Name)
	}
	// retire counts a reserved pod once, by what it now holds; once the
	// scheduler's snapshot shows that, the reservation has done its job.
	retire := func(uid types.UID) {
		handled[uid] = true
		if snapshot {
			delete(s.reservations, uid)
			done = append(done, uid)
		}
	}
	var nominees []*v1.Pod
	read := 0
	for i, pod := range pods {
		if rel != nil && rel[i>>6]&(1<<(uint(i)&63)) == 0 && len(s.reservations) == 0 {
			continue
		}
		read++
		if exclude != "" && pod.UID == exclude {
			continue
		}
		if pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed {
			continue
		}
		r, reserved := s.reservations[pod.UID]
		if reserved && handled[pod.UID] {
			// The same pod twice (a preemption's dry run adds an assumed
			// pod the nominator also lists): it holds its devices once.
			continue
		}
		if pod.Spec.NodeName == "" && !reserved && t.nominee(pod, node.Name) {
			// Not bound: a pod nominated here that the scheduler's filters
			// count in (preemption); it holds what is left, last.
			if UsesGPU(pod, t.reqOpts) {
				nominees = append(nominees, pod)
			}
			continue
		}
		// A pod that asks for no device holds none, whatever its
		// annotations say: a forged assignment on a CPU pod counts nothing.
		if !reserved && !UsesGPU(pod, t.reqOpts) {
			if v, has := pod.Annotations[AnnotationAssignment]; has && explain != nil {
				note(pod, 0, 0, HoldRequest, "assignment "+strconv.Quote(v)+" on a pod that requests no GPU", 0)
			}
			continue
		}
		if st.Claimed && servedByClaim(pod, claims) {
			// Its claim holds its devices (below), whoever allocated it.
			note(pod, 0, 0, HoldClaim, "", 0)
			if reserved {
				retire(pod.UID)
			}
			continue
		}
		h, ok := holds(pod, node.Name, &st.Inventory, t.reqOpts)
		devices, milli := h.devices, h.milli
		if h.agrees {
			source := HoldAssignment
			var mask uint64
			if h.uses != nil {
				st.TakeUses(h.uses)
				source = HoldAgent
				mask = usesMask(h.uses, &st.Inventory)
			} else {
				st.TakeAssignment(h.a)
				mask = h.a.mask()
			}
			note(pod, devices, milli, source, "", mask)
			if reserved {
				retire(pod.UID)
			}
			continue
		}
		if reserved {
			st.TakeChoice(r.Choice)
			handled[pod.UID] = true
			note(pod, int32(bits.OnesCount64(r.Choice.Mask)), r.Choice.Milli, HoldReservation, "", r.Choice.Mask)
			continue
		}
		if !ok {
			continue
		}
		if h.uses != nil {
			st.TakeUses(h.uses)
			note(pod, devices, milli, HoldAgent, st.Agent+"'s device record does not match the pod's request: its devices count, each at no less than the request", usesMask(h.uses, &st.Inventory))
			continue
		}
		ignored := ""
		if v, has := pod.Annotations[AnnotationAssignment]; has && explain != nil {
			// A device that went away (allocatable shrank) is the node's
			// doing; anything else is an edited or stale annotation.
			if pa, err := ParseAssignment(v); st.agent == nil && (err != nil || pa.Node != node.Name || !pa.agrees(devices, milli, MaxDevices)) {
				ignored = "assignment " + strconv.Quote(v) + " does not match the pod's request and node"
			}
		}
		if st.agent != nil && !st.Claimed && explain != nil {
			if _, has := t.reqOpts.Agent.Uses(pod, node.Name); has {
				ignored = st.Agent + "'s device record does not match the pod's request and node"
			}
		}
		at := note(pod, devices, milli, HoldRequest, ignored, 0)
		loose = append(loose, held{devices: devices, milli: milli, share: h.share, order: pod.Namespace + "/" + pod.Name + "/" + string(pod.UID), at: at})
	}
	if len(s.pending) > 0 {
		t.countPending(st, s, pods, exclude, explain)
	}
	alive := t.alive.Load()
	for uid, r := range s.reservations {
		if handled[uid] || uid == exclude {
			continue
		}
		if claimConsumer(uid, claims) {
			// Its claim is allocated (the pod is binding, not yet in
			// this view): the claim holds its devices.
			if snapshot {
				delete(s.reservations, uid)
				s.bump()
				done = append(done, uid)
			}
			continue
		}
		if alive != nil && !(*alive)(uid, node.Name, r) {
			// The pod is gone, or bound elsewhere: the reservation is stale.
			// States cached with it are stale too.
			delete(s.reservations, uid)
			s.bump()
			done = append(done, uid)
			continue
		}
		st.TakeChoice(r.Choice)
		if explain != nil {
			*explain = append(*explain, Holding{Namespace: r.Namespace, Name: r.Name, UID: uid,
				Devices: int32(bits.OnesCount64(r.Choice.Mask)), Milli: r.Choice.Milli, Source: HoldReservation, Fits: true, Mask: r.Choice.Mask})
		}
	}
	for i := range claims {
		c := &claims[i]
		st.TakeUses(c.Uses)
		if explain != nil {
			ns, name, _ := strings.Cut(c.Name, "/")
			milli := int32(MilliPerGPU)
			if len(c.Uses) == 1 {
				if i := st.DeviceIndex(c.Uses[0].UUID); i >= 0 {
					u := c.Uses[0]
					milli = min(DeviceShare{MemoryMiB: u.MemoryMiB, Cores: u.Cores}.milliOn(&st.Devices[i]), MilliPerGPU)
				}
			}
			*explain = append(*explain, Holding{Namespace: ns, Name: name, Devices: int32(len(c.Uses)), Milli: milli,
				Source: HoldClaim, Fits: true, Mask: usesMask(c.Uses, &st.Inventory)})
		}
	}
	if len(loose) > 0 && st.agent != nil {
		st.layDownAgent(loose)
	} else if len(loose) > 0 {
		st.layDown(loose)
	}
	if explain != nil {
		for i := range loose {
			if loose[i].at >= 0 {
				(*explain)[loose[i].at].Fits = loose[i].fits
				(*explain)[loose[i].at].Mask = loose[i].mask
			}
		}
	}
	if len(nominees) > 0 {
		t.holdForNominees(st, nominees)
	}
	buildStats.read.Add(uint64(read))
	return st
}

// servedByClaim reports whether a GPU pod on a node whose devices DRA
// publishes gets them through a claim: its extended resource was allocated
// as one, or an allocated claim there is reserved for it. Any other GPU pod
// there (in flight, or served by a device plugin beside DRA) is laid down by
// its request.
func servedByClaim(pod *v1.Pod, claims []ClaimHold) bool {
	var ext string
	if s := pod.Status.ExtendedResourceClaimStatus; s != nil {
		ext = pod.Namespace + "/" + s.ResourceClaimName
	}
	for i := range claims {
		// The claim must be counted: until it is seen, the pod's request
		// holds its devices.
		if claims[i].Name == ext || slices.Contains(claims[i].Consumers, pod.UID) {
			return true
		}
	}
	return false
}

// claimConsumer reports whether an allocated claim serves the pod.
func claimConsumer(uid types.UID, claims []ClaimHold) bool {
	for i := range claims {
		if slices.Contains(claims[i].Consumers, uid) {
			return true
		}
	}
	return false
}

// usesMask is the devices an agent's record names.
func usesMask(uses []DeviceUse, inv *Inventory) uint64 {
	var m uint64
	for _, u := range uses {
		if i := inv.DeviceIndex(u.UUID); i >= 0 && i < MaxDevices {
			m |= 1 << uint(i)
		}
	}
	return m
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

// HasAssignment reports whether a pod carries a valid assignment for the node
// (well-formed and naming the node; whether it agrees with the pod's request
// is for Holds to say).
func HasAssignment(pod *v1.Pod, node string) bool {
	v, ok := pod.Annotations[AnnotationAssignment]
	if !ok {
		return false
	}
	a, err := ParseAssignment(v)
	return err == nil && a.Node == node
}

// Reserve records an in-flight choice. Reserving the same pod again replaces
// the earlier choice, wherever it was. It returns the reservation's Seq.
func (t *Tracker) Reserve(node string, uid types.UID, r Reservation) uint64 {
	r.Seq = t.seq.Add(1)
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
	s.bump()
	s.mu.Unlock()
	return r.Seq
}

// SetUncertain marks or clears the pod's reservation with the given Seq as
// one whose bind may still land. It reports whether that reservation is
// still there.
func (t *Tracker) SetUncertain(uid types.UID, seq uint64, v bool) bool {
	node, r, ok := t.Reserved(uid)
	if !ok || r.Seq != seq {
		return false
	}
	s := t.slot(node, false)
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, ok := s.reservations[uid]
	if !ok || cur.Seq != seq {
		return false
	}
	cur.Uncertain = v
	s.reservations[uid] = cur
	return true
}

// UnreserveIf drops a pod's reservation only if it is still the one with
// the given Seq: a release decided about an earlier reservation must not
// drop the pod's newer one.
func (t *Tracker) UnreserveIf(uid types.UID, seq uint64) bool {
	node, r, ok := t.Reserved(uid)
	if !ok || r.Seq != seq {
		return false
	}
	s := t.slot(node, false)
	if s == nil {
		return false
	}
	s.mu.Lock()
	cur, ok := s.reservations[uid]
	if ok && cur.Seq == seq {
		delete(s.reservations, uid)
		s.bump()
	}
	s.mu.Unlock()
	if ok && cur.Seq == seq {
		t.dropUID(uid)
		return true
	}
	return false
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
	s.bump()
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

// ReservationCount is how many pods have an in-flight reservation.
func (t *Tracker) ReservationCount() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.byUID)
}

// OldestReservation is when the oldest in-flight reservation was made
// (zero without any): one that outlives every bind and its verification is
// leaked.
func (t *Tracker) OldestReservation() time.Time {
	t.mu.RLock()
	defer t.mu.RUnlock()
	var oldest time.Time
	for uid, node := range t.byUID {
		s := t.slot(node, false)
		if s == nil {
			continue
		}
		s.mu.Lock()
		r, ok := s.reservations[uid]
		s.mu.Unlock()
		if ok && !r.Since.IsZero() && (oldest.IsZero() || r.Since.Before(oldest)) {
			oldest = r.Since
		}
	}
	return oldest
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

// Touch records a change of what a node's devices are or hold that neither
// the node object nor its pods show (a ResourceSlice, a ResourceClaim): no
// state computed before is current.
func (t *Tracker) Touch(node string) {
	if s := t.slot(node, false); s != nil {
		s.mu.Lock()
		s.bump()
		s.mu.Unlock()
	}
}

// ForgetNode drops a deleted node's cache and reservations.
func (t *Tracker) ForgetNode(node string) {
	t.mu.Lock()
	if s := t.removeSlot(node); s != nil {
		s.mu.Lock()
		// Nothing cached in it is current again, whatever still leads
		// here (fastSlots), and nothing is cached in it again.
		s.bump()
		s.gone = true
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

// countPending adds the in-flight pods of other schedulers: by their record,
// where it names devices of the node; not once bound (then they are among
// pods), reserved by us, or past their window.
func (t *Tracker) countPending(st *NodeState, s *slot, pods []*v1.Pod, exclude types.UID, explain *[]Holding) {
	now := time.Now()
	seen := make(map[types.UID]bool, len(pods))
	for _, p := range pods {
		seen[p.UID] = true
	}
	for uid, pp := range s.pending {
		if seen[uid] || uid == exclude || now.After(pp.until) {
			continue
		}
		// Bound elsewhere or gone since (a late event), it holds nothing
		// here.
		if alive := t.alive.Load(); alive != nil && !(*alive)(uid, st.Name, Reservation{Namespace: pp.pod.Namespace, Name: pp.pod.Name}) {
			continue
		}
		if _, reserved := s.reservations[uid]; reserved || st.agent == nil {
			continue
		}
		uses, ok := t.reqOpts.Agent.Uses(pp.pod, st.Name)
		if !ok || !usesKnown(uses, &st.Inventory) {
			continue
		}
		st.TakeUses(uses)
		if st.key.until == 0 || pp.until.UnixNano() < st.key.until {
			st.key.until = pp.until.UnixNano()
		}
		if explain != nil {
			*explain = append(*explain, Holding{Namespace: pp.pod.Namespace, Name: pp.pod.Name, UID: uid,
				Devices: int32(len(uses)), Source: HoldAgent, Fits: !st.Overcommitted, Mask: usesMask(uses, &st.Inventory)})
		}
	}
}
