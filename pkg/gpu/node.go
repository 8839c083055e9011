package gpu

import (
	"cmp"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
)

// NodeOptions say where a node's GPU inventory is read from.
type NodeOptions struct {
	ResourceNames []v1.ResourceName
	ProductLabel  string
	MemoryLabel   string
	// Agent, if set, reports the devices of the nodes it serves.
	Agent Agent
	// Claims, if set, reports the devices DRA publishes, and the claims
	// on them. A node it reports devices for takes them from there, even
	// where a device plugin also advertises GPUs (DoubleView).
	Claims ClaimSource
}

// DefaultNodeOptions reads nvidia.com/gpu and the GFD labels.
var DefaultNodeOptions = NodeOptions{
	ResourceNames: []v1.ResourceName{ResourceNvidiaGPU},
	ProductLabel:  LabelGPUProduct,
	MemoryLabel:   LabelGPUMemory,
}

// Inventory is what a node has: schedulable devices (allocatable), devices
// that are installed but unhealthy (capacity minus allocatable), the model and
// the memory per device.
type Inventory struct {
	Count     int32
	Unhealthy int32
	// Unregistered: the node's agent runs there but has not reported its
	// devices yet (gpu.Unregistered).
	Unregistered bool
	// Reported is the allocatable device count as the node reports it. A
	// node reporting more than MaxDevices is refused for GPU pods (Count is
	// then 0; see TooMany), never cut to a part of its devices.
	Reported  int64
	Model     string
	ModelFold string
	MemoryMiB int64
	// Agent names the node agent whose report this is ("" for allocatable
	// and labels); Devices are its devices, in its order.
	Agent   string
	Devices []Device
	// Claimed: the devices come from a ClaimSource, whose claims hold
	// them; shares of the request dialect are not delivered there.
	Claimed bool
	// DoubleView says why the node's GPUs are also advertised by a device
	// plugin, the same devices seen twice ("" when not): they count once,
	// as the ClaimSource publishes them.
	DoubleView string
}

// Delivers reports whether the node's agent delivers and enforces shares of
// the request dialect.
func (inv *Inventory) Delivers() bool { return inv.Agent != "" && !inv.Claimed }

// DeviceIndex is the index of the device with the UUID, or -1.
func (inv *Inventory) DeviceIndex(uuid string) int {
	for i := range inv.Devices {
		if inv.Devices[i].UUID == uuid {
			return i
		}
	}
	return -1
}

// TooMany reports whether the node has more devices than we track.
func (inv *Inventory) TooMany() bool { return inv.Reported > MaxDevices }

// ReadInventory reads a node's devices from its allocatable and GFD labels.
func ReadInventory(node *v1.Node, opts NodeOptions) Inventory {
	if opts.Claims != nil {
		if devs, ok := opts.Claims.NodeDevices(node.Name); ok && len(devs) > 0 {
			if m := node.Labels[opts.ProductLabel]; m != "" {
				// GFD's label, which model constraints are written
				// against, names the model; the driver's, the type.
				devs = slices.Clone(devs)
				for i := range devs {
					devs[i].Type, devs[i].Model = devs[i].Model, m
				}
			}
			inv := readAgentInventory(devs, opts.Claims.SourceName())
			inv.Claimed = true
			inv.DoubleView = doubleView(node, opts)
			return inv
		}
	}
	if opts.Agent != nil {
		switch devs, st := opts.Agent.Devices(node); st {
		case Reported:
			return readAgentInventory(devs, opts.Agent.AgentName())
		case Unregistered:
			inv := readAgentInventory(nil, opts.Agent.AgentName())
			inv.Unregistered = true
			return inv
		}
	}
	var inv Inventory
	var capacity, alloc int64
	for _, name := range opts.ResourceNames {
		if q, ok := node.Status.Allocatable[name]; ok && q.Sign() > 0 {
			alloc = addSat(alloc, min(q.Value(), maxQuantity))
		}
		if q, ok := node.Status.Capacity[name]; ok && q.Sign() > 0 {
			capacity = addSat(capacity, min(q.Value(), maxQuantity))
		}
	}
	if capacity > alloc {
		inv.Unhealthy = int32(min(capacity-alloc, 1<<30))
	}
	inv.Reported = alloc
	if alloc <= MaxDevices {
		inv.Count = int32(alloc)
	}
	inv.Model = node.Labels[opts.ProductLabel]
	inv.ModelFold = strings.ToUpper(inv.Model)
	inv.MemoryMiB = parseGPUMemoryLabel(node.Labels[opts.MemoryLabel])
	return inv
}

// doubleView says which device plugin also advertises a node's GPUs ("" for
// none). A GPU handed out by both would be handed out twice; DRA drivers
// and device plugins are not meant to serve one GPU together (HAMi's docs
// forbid it), so the node is reported.
func doubleView(node *v1.Node, opts NodeOptions) string {
	if opts.Agent != nil {
		if _, st := opts.Agent.Devices(node); st != NotServed {
			return opts.Agent.AgentName() + "'s device plugin also serves the node"
		}
	}
	for _, name := range opts.ResourceNames {
		if q, ok := node.Status.Allocatable[name]; ok && q.Sign() > 0 {
			return "a device plugin also advertises " + string(name) + " " + q.String()
		}
	}
	return ""
}

// parseGPUMemoryLabel reads MiB per device. Some GFD versions wrote bytes;
// nothing has more than a TiB per device yet, so anything larger is bytes.
func parseGPUMemoryLabel(v string) int64 {
	if v == "" {
		return 0
	}
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || n <= 0 {
		return 0
	}
	if n > MaxGPUMemoryMiB {
		n >>= 20
	}
	if n > MaxGPUMemoryMiB {
		return 0 // not a real device: treated as not reported
	}
	return n
}

// Choice is a set of devices on one node, each taking Milli milli-GPU.
type Choice struct {
	Mask  uint64
	Milli int32
	// Share is what each device gives on a node whose agent enforces
	// shares (Milli is then its projection).
	Share DeviceShare
}

// Empty reports whether no device is chosen.
func (c Choice) Empty() bool { return c.Mask == 0 }

// Devices returns the chosen indices in ascending order.
func (c Choice) Devices() []int {
	var out []int
	for i := 0; i < MaxDevices; i++ {
		if c.Mask&(1<<uint(i)) != 0 {
			out = append(out, i)
		}
	}
	return out
}

// Share is one device's part of an assignment.
type Share struct {
	Index int
	Milli int32
}

// Assignment is the decision written on a pod: its node and, per device, how
// much it takes. It is self-contained, so that accounting can be rebuilt from
// the pods alone after a restart.
type Assignment struct {
	Node   string
	Shares []Share
}

// NewAssignment turns a choice into an assignment.
func NewAssignment(node string, c Choice) Assignment {
	a := Assignment{Node: node}
	for _, i := range c.Devices() {
		a.Shares = append(a.Shares, Share{Index: i, Milli: c.Milli})
	}
	return a
}

// String renders "<node>:<index>=<milli>[,<index>=<milli>...]".
func (a Assignment) String() string {
	var b strings.Builder
	b.WriteString(a.Node)
	b.WriteByte(':')
	for i, s := range a.Shares {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(s.Index))
		b.WriteByte('=')
		b.WriteString(strconv.Itoa(int(s.Milli)))
	}
	return b.String()
}

// ParseAssignment reads the assignment annotation. It rejects anything that
// String would not produce, so that a corrupt annotation is never half-read.
func ParseAssignment(v string) (Assignment, error) {
	invalid := func(rule string) (Assignment, error) {
		return Assignment{}, &InvalidError{Key: AnnotationAssignment, Value: v, Rule: rule}
	}
	colon := strings.LastIndexByte(v, ':')
	if colon <= 0 || colon == len(v)-1 {
		return invalid("must be <node>:<index>=<milli>[,<index>=<milli>...]")
	}
	a := Assignment{Node: v[:colon]}
	var seen uint64
	for _, part := range strings.Split(v[colon+1:], ",") {
		eq := strings.IndexByte(part, '=')
		if eq <= 0 {
			return invalid("each device must be <index>=<milli>")
		}
		idx, err := strconv.Atoi(part[:eq])
		if err != nil || idx < 0 || idx >= MaxDevices || part[:eq] != strconv.Itoa(idx) {
			return invalid("device index must be an integer from 0 to " + strconv.Itoa(MaxDevices-1))
		}
		if seen&(1<<uint(idx)) != 0 {
			return invalid("device " + strconv.Itoa(idx) + " is listed twice")
		}
		seen |= 1 << uint(idx)
		m, err := strconv.Atoi(part[eq+1:])
		if err != nil || m < 1 || m > MilliPerGPU || part[eq+1:] != strconv.Itoa(m) {
			return invalid("milli-GPU per device must be an integer from 1 to 1000")
		}
		a.Shares = append(a.Shares, Share{Index: idx, Milli: int32(m)})
	}
	return a, nil
}

// mask is the devices the assignment names.
func (a *Assignment) mask() uint64 {
	var m uint64
	for _, sh := range a.Shares {
		m |= 1 << uint(sh.Index)
	}
	return m
}

// agrees reports whether the assignment is what a request taking devices
// devices of milli each holds on a node with count devices. Only then does
// it say which devices the pod holds; an assignment anyone could have
// written is a record of our decision, never a source of capacity.
func (a *Assignment) agrees(devices, milli, count int32) bool {
	if int32(len(a.Shares)) != devices {
		return false
	}
	for _, sh := range a.Shares {
		if sh.Milli != milli || sh.Index >= int(count) {
			return false
		}
	}
	return true
}

// Outcome is the verdict of Fit. Each non-fitting outcome has one constant
// reason in the plugins.
type Outcome uint8

const (
	Fits Outcome = iota
	NoGPU
	ModelNotAllowed
	MemoryUnknown
	ShareTooLarge
	TooFewDevices
	TooFewFreeDevices
	NoDeviceWithShare
	// TooManyDevices: the node reports more devices than MaxDevices.
	TooManyDevices
	// Overcommitted: the pods bound to the node hold more than its devices
	// have. It takes no GPU pod until what is bound fits again.
	Overcommitted
	// NoShareDelivery: a share where nothing would deliver it (no agent
	// that enforces shares, or the pod does not ask the agent for it).
	NoShareDelivery
	// DeviceNotAllowed: no device the pod allows by identity.
	DeviceNotAllowed
	// AgentUnregistered: the node's agent has not reported its devices
	// yet; the node takes GPU pods once it has.
	AgentUnregistered
)

// Unresolvable reports whether removing pods from the node could never help.
func (o Outcome) Unresolvable() bool {
	return o != Fits && o != TooFewFreeDevices && o != NoDeviceWithShare && o != Overcommitted
}

// NodeState is a node's inventory and the milli-GPU left on each device, after
// the pods bound to it and the scheduler's in-flight reservations. It is
// immutable once built; CPUFree is carried for fragmentation.
type NodeState struct {
	// What a CPU-only pod's score reads comes first, in one cache line: at
	// thousands of nodes, each line of a state read per node is a miss.
	key stateKey
	// stale: the tracker no longer serves this state (slot.store, bump).
	stale atomic.Bool
	// idle and gpuNode are Idle() and whether the node counts as a GPU
	// node, kept by seal once the state is final (sealed).
	idle    int64
	CPUFree int64
	// MemFree is the memory left, in MiB.
	MemFree int64
	// Prio is a stable pseudo-random rank of the node (a hash of its name):
	// the last tie-break, so that equivalent nodes are always taken in the
	// same order and placements concentrate instead of scattering.
	Prio uint16
	// Overcommitted is true when the pods on the node hold more than its
	// devices have: another binder placed a pod we counted no room for, the
	// allocatable shrank under running pods, or assignments collide.
	Overcommitted bool
	sealed        bool
	gpuNode       bool

	Name string
	Inventory
	Free [MaxDevices]int32

	// agent holds what each device holds per dimension, on a node whose
	// agent enforces shares (nil otherwise).
	agent *agentState

	frag fragSlot
	// base is what Build computed the state from (nil for Compute's).
	base *buildBase
}

// NewNodeState starts a node with every device free.
func NewNodeState(name string, inv Inventory, cpuFree int64) *NodeState {
	s := &NodeState{Name: name, Inventory: inv, CPUFree: cpuFree, Prio: nodePrio(name)}
	if inv.Devices != nil {
		s.agent = &agentState{devs: inv.Devices}
		for i := 0; i < int(inv.Count); i++ {
			s.Free[i] = s.agent.free(i)
		}
		return s
	}
	for i := int32(0); i < inv.Count; i++ {
		s.Free[i] = MilliPerGPU
	}
	return s
}

// DeviceOrder ranks the node's devices for an allocator that takes the
// first that fits (DRA's): the most used first, so that a share goes to the
// device it fits most tightly and whole devices stay free for requests that
// need them (best fit); equal ones, and the free ones, in index order;
// devices that take nothing (unhealthy, cordoned) last. rank[i] is device
// i's place.
func (s *NodeState) DeviceOrder(rank []int) []int {
	n := int(s.Count)
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	usable := func(i int) bool {
		if s.agent == nil {
			return true
		}
		d := &s.agent.devs[i]
		return d.Healthy && !d.Cordoned
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		ua, ub := usable(a), usable(b)
		if ua != ub {
			if ua {
				return -1
			}
			return 1
		}
		return cmp.Compare(s.Free[a], s.Free[b])
	})
	rank = slices.Grow(rank[:0], n)[:n]
	for place, i := range idx {
		rank[i] = place
	}
	return rank
}

// FirstFit is the choice of an allocator that takes the first devices that
// fit the request in the order rank gives (nil: index order): DRA's
// structured allocator over the slices it is shown. ok is false when the
// request does not fit.
func (s *NodeState) FirstFit(r *Request, rank []int) (Choice, bool) {
	out, devices, milli, mask := s.fit(r)
	if out != Fits {
		return Choice{}, false
	}
	c := Choice{Milli: milli}
	if s.agent != nil {
		_, c.Share = r.AgentShare()
	}
	order := make([]int, s.Count)
	for i := range order {
		order[i] = i
	}
	if rank != nil {
		slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(rank[a], rank[b]) })
	}
	n := int32(0)
	for _, i := range order {
		if n < devices && mask&(1<<uint(i)) != 0 {
			c.Mask |= 1 << uint(i)
			n++
		}
	}
	return c, n == devices
}

// Clone copies the state, without its memoised fragmentation.
func (s *NodeState) Clone() *NodeState {
	c := &NodeState{Name: s.Name, Inventory: s.Inventory, Free: s.Free, CPUFree: s.CPUFree, MemFree: s.MemFree, Overcommitted: s.Overcommitted, Prio: s.Prio}
	if s.agent != nil {
		a := *s.agent
		c.agent = &a
	}
	return c
}

// nodePrio is FNV-1a of the name, folded to 16 bits.
func nodePrio(name string) uint16 {
	h := uint32(2166136261)
	for i := 0; i < len(name); i++ {
		h = (h ^ uint32(name[i])) * 16777619
	}
	return uint16(h ^ h>>16)
}

// Idle is the total milli-GPU left on the node.
func (s *NodeState) Idle() int64 {
	if s.sealed {
		return s.idle
	}
	var l int64
	for i := int32(0); i < s.Count; i++ {
		l += int64(s.Free[i])
	}
	return l
}

// seal keeps what Idle and IsGPUNode compute, beside the key: a cached
// state never changes (the tracker hands it to every goroutine), and a
// change starts from an unsealed Clone.
func (s *NodeState) seal() {
	s.sealed = false
	s.idle, s.gpuNode = s.Idle(), s.Count > 0 || s.TooMany()
	s.sealed = true
}

// IsGPUNode reports whether the node has GPUs, or reports more than can be
// counted (TooMany): either way, not a node for CPU-only pods first.
func (s *NodeState) IsGPUNode() bool {
	if s.sealed {
		return s.gpuNode
	}
	return s.Count > 0 || s.TooMany()
}

// FullyFree counts the devices nobody uses.
func (s *NodeState) FullyFree() int32 {
	var n int32
	for i := int32(0); i < s.Count; i++ {
		if s.Free[i] == MilliPerGPU {
			n++
		}
	}
	return n
}

// take subtracts a share. Taking more than is left marks the node
// overcommitted; the device then has nothing left, whatever the order of the
// takes (the result depends on the sum only).
func (s *NodeState) take(idx int, milli int32) {
	s.sealed = false
	if idx < 0 || idx >= int(s.Count) {
		s.Overcommitted = true
		return
	}
	s.Free[idx] -= milli
	if s.Free[idx] < 0 {
		s.Overcommitted = true
		s.Free[idx] = 0
	}
}

// TakeChoice applies a choice.
func (s *NodeState) TakeChoice(c Choice) {
	for i := 0; i < MaxDevices; i++ {
		if c.Mask&(1<<uint(i)) == 0 {
			continue
		}
		if s.agent != nil {
			s.takeShare(i, c.Share)
			continue
		}
		s.take(i, c.Milli)
	}
}

// takeShare applies a share to a device of an agent's node.
func (s *NodeState) takeShare(i int, sh DeviceShare) {
	if i < 0 || i >= int(s.Count) {
		s.Overcommitted = true
		return
	}
	s.takeUse(i, sh.MemoryOn(s.agent.devs[i].MemoryMiB), sh.Cores, 1)
}

func (s *NodeState) takeUse(i int, mem int64, cores, slots int32) {
	s.sealed = false
	if s.agent.take(i, mem, cores, slots) {
		s.Overcommitted = true
	}
	s.Free[i] = s.agent.free(i)
}

// TakeUses applies an agent's record of what a pod holds; each use names a
// device of the node (holds checks that).
func (s *NodeState) TakeUses(uses []DeviceUse) {
	for _, u := range uses {
		if i := s.DeviceIndex(u.UUID); i >= 0 && i < int(s.Count) && s.agent != nil {
			s.takeUse(i, u.MemoryMiB, u.Cores, u.Slots)
		}
	}
}

// TakeAssignment applies an assignment that names this node.
func (s *NodeState) TakeAssignment(a Assignment) {
	for _, sh := range a.Shares {
		s.take(sh.Index, sh.Milli)
	}
}

// held is a pod whose devices are not known (no agreeing assignment, no
// reservation): what its request takes, to be laid down on the devices left.
type held struct {
	devices, milli int32
	share          DeviceShare // on an agent's node
	// order makes the layout independent of the order pods are listed in.
	order string
	// at is the pod's index in an explanation, or -1.
	at int
	// fits and mask (the devices it got) are set by layDown.
	fits bool
	mask uint64
}

// layDown places the pods whose devices are unknown on what the known ones
// left, independently of the order they come in (they are sorted first):
// whole GPUs on fully free devices from the highest index (our own choices
// start from the lowest; which free device does not matter), then the
// shares, largest first, by an exact search for a packing that fits them
// all (best fit is its first try, and usually succeeds). Only when no
// packing exists is the node overcommitted: a pod that fits nowhere then
// still takes what is left, so that what is shown free is never more than
// what is free. The search is bounded; past the bound, best fit decides.
func (s *NodeState) layDown(hs []held) {
	slices.SortFunc(hs, func(a, b held) int {
		if a.milli != b.milli {
			return cmp.Compare(b.milli, a.milli)
		}
		if a.devices != b.devices {
			return cmp.Compare(b.devices, a.devices)
		}
		return strings.Compare(a.order, b.order)
	})
	first := len(hs) // the first share
	for i := range hs {
		h := &hs[i]
		if h.milli < MilliPerGPU && h.devices <= 1 {
			first = i
			break
		}
		h.fits = true
		need := h.devices
		for d := int(s.Count) - 1; d >= 0 && need > 0; d-- {
			if s.Free[d] == MilliPerGPU {
				s.Free[d] = 0
				h.mask |= 1 << uint(d)
				need--
			}
		}
		if need > 0 {
			h.fits = false
			s.Overcommitted = true
			for d := int(s.Count) - 1; d >= 0 && need > 0; d-- {
				if s.Free[d] > 0 {
					s.Free[d] = 0
					h.mask |= 1 << uint(d)
					need--
				}
			}
		}
	}
	shares := hs[first:]
	if len(shares) == 0 {
		return
	}
	p := packer{free: s.Free, count: int(s.Count), budget: packBudget * 8 / max(int(s.Count), 8)}
	for i := range shares {
		p.items = append(p.items, shares[i].milli)
	}
	p.at = make([]int, len(shares))
	p.left = make([]int64, len(shares)+1)
	for i := len(shares) - 1; i >= 0; i-- {
		p.left[i] = p.left[i+1] + int64(shares[i].milli)
	}
	for d := 0; d < p.count; d++ {
		p.room += int64(p.free[d])
	}
	if p.pack(0) {
		for i := range shares {
			shares[i].fits = true
			shares[i].mask = 1 << uint(p.at[i])
			s.Free[p.at[i]] -= shares[i].milli
		}
		return
	}
	// No packing (or none found within the bound): best fit, and what
	// does not fit takes the most free device.
	for i := range shares {
		h := &shares[i]
		best, fits := tightestIn(&s.Free, int(s.Count), h.milli)
		h.fits = fits
		if best >= 0 {
			s.Free[best] = max(s.Free[best]-h.milli, 0)
			h.mask = 1 << uint(best)
		}
		if !fits {
			s.Overcommitted = true
		}
	}
}

// packBudget bounds the packing search (tries of a share on a device) on a
// node of 8 devices or fewer; larger nodes get proportionally fewer tries,
// each of which scans more devices. A tenant can bind pods of awkward sizes
// to a node, and every rebuild of it runs the search.
const packBudget = 20000

// packer searches for a placement of shares on devices, largest share first,
// each tried on the tightest device that fits it first, then on devices with
// more room, each amount of room once (devices with the same room are
// interchangeable).
type packer struct {
	free   [MaxDevices]int32
	count  int
	items  []int32
	at     []int
	left   []int64 // left[i]: the sum of items[i:]
	room   int64   // the sum of free
	budget int
}

func (p *packer) pack(i int) bool {
	if i == len(p.items) {
		return true
	}
	if p.left[i] > p.room {
		return false
	}
	m := p.items[i]
	last := int32(-1) // the room tried last; the next try has more
	for {
		best := -1
		for d := p.count - 1; d >= 0; d-- {
			f := p.free[d]
			if f >= m && f > last && (best < 0 || f < p.free[best]) {
				best = d
			}
		}
		if best < 0 || p.budget <= 0 {
			return false
		}
		p.budget--
		last = p.free[best]
		p.free[best] -= m
		p.room -= int64(m)
		p.at[i] = best
		if p.pack(i + 1) {
			return true
		}
		p.free[best] += m
		p.room += int64(m)
	}
}

// tightestIn is the device with the least room that fits milli (highest
// index on ties); when none fits, the one with the most room, and false.
func tightestIn(free *[MaxDevices]int32, count int, milli int32) (int, bool) {
	best := -1
	for d := count - 1; d >= 0; d-- {
		if free[d] >= milli && (best < 0 || free[d] < free[best]) {
			best = d
		}
	}
	if best >= 0 {
		return best, true
	}
	for d := count - 1; d >= 0; d-- {
		if best < 0 || free[d] > free[best] {
			best = d
		}
	}
	return best, false
}

// Fit decides whether the request fits the node, without allocating. It
// returns the devices and milli per device the request would take here.
func (s *NodeState) Fit(r *Request) (Outcome, int32, int32) {
	out, devices, milli, _ := s.fit(r)
	return out, devices, milli
}

// FitOn is Fit with the request's devices taken from on alone: a request
// pinned to the devices a preemption plans to free for it.
func (s *NodeState) FitOn(r *Request, on uint64) Outcome {
	out, devices, milli, mask := s.fit(r)
	if out != Fits || int32(bits.OnesCount64(mask&on)) >= devices {
		return out
	}
	if devices > 1 || milli == MilliPerGPU {
		return TooFewFreeDevices
	}
	return NoDeviceWithShare
}

// delivers reports whether a share would be delivered here: a share the
// agent is asked for (its resource is requested) on a node whose agent
// enforces shares, or, where the operator allows accounting-only sharing, a
// share by annotation alone. Whole GPUs are delivered everywhere.
func (s *NodeState) delivers(r *Request) bool {
	if r.ByClaim {
		return s.Claimed
	}
	if !r.Shared() {
		return true
	}
	if s.Claimed {
		// DRA's allocator hands the GPUs out: a share it is not asked for
		// would be a whole device, or none.
		return false
	}
	if s.Delivers() {
		return r.Slot || r.ShareCount > 0 || !r.NeedsDelivery
	}
	// The plain device plugin hands a whole device for its resource.
	return !r.NeedsDelivery && !r.Slot && r.ShareCount == 0
}

// Hosts answers, from the node's inventory alone, whether it has a device
// of a model the request allows (Fits), healthy or not, free or not, or the
// unresolvable outcome Fit gives here whatever the node's pods do (no GPU,
// no delivery, no allowed model): only a change of the node can alter it.
func (s *NodeState) Hosts(r *Request) Outcome {
	switch {
	case !r.HasGPU():
		return Fits
	case s.Unregistered:
		return AgentUnregistered
	case s.TooMany():
		return TooManyDevices
	case s.Count == 0:
		return NoGPU
	case !s.delivers(r):
		return NoShareDelivery
	case r.Models.Empty():
		return Fits
	case s.agent == nil:
		if r.Models.Matches(s.Model, s.ModelFold) {
			return Fits
		}
		return ModelNotAllowed
	}
	for i := 0; i < int(s.Count); i++ {
		if d := &s.agent.devs[i]; r.Models.Matches(d.Model, d.modelFold) {
			return Fits
		}
	}
	return ModelNotAllowed
}

// fit is Fit with the devices the request could take now (as a mask).
func (s *NodeState) fit(r *Request) (Outcome, int32, int32, uint64) {
	if !r.HasGPU() {
		return Fits, 0, 0, 0
	}
	if s.Unregistered {
		return AgentUnregistered, 0, 0, 0
	}
	if s.TooMany() {
		return TooManyDevices, 0, 0, 0
	}
	if s.Count == 0 {
		return NoGPU, 0, 0, 0
	}
	if !s.delivers(r) {
		return NoShareDelivery, 0, 0, 0
	}
	if s.agent != nil {
		return s.fitAgent(r)
	}
	if !r.Models.Empty() && !r.Models.Matches(s.Model, s.ModelFold) {
		return ModelNotAllowed, 0, 0, 0
	}
	if len(r.UUIDs.Use) > 0 {
		return DeviceNotAllowed, 0, 0, 0 // no identities here
	}
	devices, milli, out := r.PerDevice(s.MemoryMiB)
	if out != Fits {
		return out, 0, 0, 0
	}
	if devices > s.Count {
		return TooFewDevices, 0, 0, 0
	}
	if s.Overcommitted {
		return Overcommitted, devices, milli, 0
	}
	var n int32
	var mask uint64
	for i := int32(0); i < s.Count; i++ {
		if s.Free[i] >= milli {
			n++
			mask |= 1 << uint(i)
		}
	}
	if n >= devices {
		return Fits, devices, milli, mask
	}
	if devices > 1 || milli == MilliPerGPU {
		return TooFewFreeDevices, devices, milli, mask
	}
	return NoDeviceWithShare, devices, milli, mask
}

// fitAgent is fit on a node whose agent enforces shares: every dimension
// the agent counts, device by device.
func (s *NodeState) fitAgent(r *Request) (Outcome, int32, int32, uint64) {
	a := s.agent
	devices, sh := r.AgentShare()
	var usable, allowed, big, n int32
	var mask uint64
	first := -1
	for i := 0; i < int(s.Count); i++ {
		d := &a.devs[i]
		if !d.Healthy || d.Cordoned {
			continue
		}
		usable++
		if !a.allowed(i, r) {
			continue
		}
		allowed++
		if sh.MemoryOn(d.MemoryMiB) > d.MemoryMiB || sh.Cores > d.Cores || d.Slots <= 0 {
			continue
		}
		big++
		if first < 0 {
			first = i
		}
		if a.admits(i, r, &sh) {
			n++
			mask |= 1 << uint(i)
		}
	}
	switch {
	case usable < devices:
		return TooFewDevices, 0, 0, 0
	case allowed == 0 && !r.Models.Empty():
		return ModelNotAllowed, 0, 0, 0
	case allowed < devices:
		return DeviceNotAllowed, 0, 0, 0
	case big < devices && devices == 1:
		return ShareTooLarge, 0, 0, 0
	case big < devices:
		return TooFewDevices, 0, 0, 0
	}
	milli := sh.milliOn(&a.devs[first])
	if sh == Exclusive {
		milli = MilliPerGPU
	}
	if s.Overcommitted {
		return Overcommitted, devices, milli, 0
	}
	if n >= devices {
		return Fits, devices, milli, mask
	}
	if devices > 1 || milli == MilliPerGPU {
		return TooFewFreeDevices, devices, milli, mask
	}
	return NoDeviceWithShare, devices, milli, mask
}

// freeAfter is what device i would have free once the request's share is
// on it.
func (s *NodeState) freeAfter(i int, milli int32, sh *DeviceShare) int32 {
	if s.agent == nil {
		return s.Free[i] - milli
	}
	a := s.agent
	d := &a.devs[i]
	return freeOf(d, a.mem[i]+sh.MemoryOn(d.MemoryMiB), a.cores[i]+sh.Cores, a.slots[i]+1)
}
