package dra

import (
	"cmp"
	"slices"
	"strings"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
)

// SharedSlots is how many claims one device may serve at once where the
// driver allows multiple allocations: its capacities, not a count, limit
// them.
const SharedSlots = 1 << 10

// DeviceID names a published device as allocation results do.
type DeviceID struct{ Driver, Pool, Device string }

type poolID struct{ driver, pool string }

// deviceInfo is where a published device counts: a GPU of a node (index
// into its list), or a partition of one.
type deviceInfo struct {
	node   string
	uuid   string // the GPU's, a partition's parent's
	driver *Driver
	part   bool
	shared bool
	memMiB int64
}

type nodeDevices struct {
	devs  []gpu.Device
	pools []poolID
	ids   []DeviceID
}

type claimEntry struct {
	name      string
	consumers []types.UID
	results   []resourceapi.DeviceRequestAllocationResult
}

// Index is the GPUs that DRA drivers publish, per node, and the allocated
// claims, fed by the informers' events (level: every event carries the
// object, and each rebuilds what it touches from all it knows). It is a
// gpu.ClaimSource. Changed is told each node whose devices or claims
// changed.
type Index struct {
	drivers map[string]*Driver
	order   []Driver
	changed func(node string)
	// listeners are told after changed (AddListener).
	lmu       sync.Mutex
	listeners []func(node string)

	mu      sync.RWMutex
	slices  map[string]*resourceapi.ResourceSlice
	byNode  map[string]map[string]bool // node → slice names
	nodes   map[string]*nodeDevices
	devices map[DeviceID]deviceInfo
	claims  map[types.UID]*claimEntry
	byPool  map[poolID]map[types.UID]bool
}

var _ gpu.ClaimSource = (*Index)(nil)

// NewIndex reads the given drivers' devices; changed may be nil.
func NewIndex(drivers []Driver, changed func(node string)) *Index {
	x := &Index{drivers: map[string]*Driver{}, changed: changed, slices: map[string]*resourceapi.ResourceSlice{},
		byNode: map[string]map[string]bool{}, nodes: map[string]*nodeDevices{}, devices: map[DeviceID]deviceInfo{},
		claims: map[types.UID]*claimEntry{}, byPool: map[poolID]map[types.UID]bool{}, order: slices.Clone(drivers)}
	for i := range drivers {
		d := drivers[i]
		x.drivers[d.Name] = &d
	}
	return x
}

// Drivers are the drivers the index reads, as given.
func (x *Index) Drivers() []Driver { return x.order }

// GPUOf is the GPU a published device is, or is a partition of, and the
// node it is on.
func (x *Index) GPUOf(id DeviceID) (node, uuid string, ok bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	d, ok := x.devices[id]
	return d.node, d.uuid, ok
}

// Reads reports whether the index reads the driver's devices.
func (x *Index) Reads(driver string) bool {
	_, ok := x.drivers[driver]
	return ok
}

// HoldsAny reports whether a claim's allocation names a device of one of
// the index's drivers.
func (x *Index) HoldsAny(c *resourceapi.ResourceClaim) bool {
	if c.Status.Allocation == nil {
		return false
	}
	for _, r := range c.Status.Allocation.Devices.Results {
		if x.Reads(r.Driver) {
			return true
		}
	}
	return false
}

// SourceName names DRA in messages.
func (x *Index) SourceName() string { return SourceName }

// NodeDevices are the GPUs published for the node, in the allocator's
// order (pools by name, slices by name, devices as listed).
func (x *Index) NodeDevices(node string) ([]gpu.Device, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	n := x.nodes[node]
	if n == nil || len(n.devs) == 0 {
		return nil, false
	}
	return n.devs, true
}

// sliceNodes are the nodes a slice's devices are on (node-local slices;
// devices with a node of their own under perDeviceNodeSelection).
func sliceNodes(s *resourceapi.ResourceSlice) []string {
	var out []string
	if s.Spec.NodeName != nil && *s.Spec.NodeName != "" {
		out = append(out, *s.Spec.NodeName)
	}
	for i := range s.Spec.Devices {
		if n := s.Spec.Devices[i].NodeName; n != nil && *n != "" && !slices.Contains(out, *n) {
			out = append(out, *n)
		}
	}
	return out
}

// SliceChanged records a slice as it is now; nil new is a deletion.
func (x *Index) SliceChanged(old, new *resourceapi.ResourceSlice) {
	var touched []string
	x.mu.Lock()
	if old != nil {
		if cur := x.slices[old.Name]; cur != nil {
			delete(x.slices, old.Name)
			for _, n := range sliceNodes(cur) {
				delete(x.byNode[n], cur.Name)
				touched = append(touched, n)
			}
		}
	}
	if new != nil {
		if cur := x.slices[new.Name]; cur != nil {
			for _, n := range sliceNodes(cur) {
				delete(x.byNode[n], cur.Name)
				touched = append(touched, n)
			}
		}
		if _, ours := x.drivers[new.Spec.Driver]; ours {
			x.slices[new.Name] = new
			for _, n := range sliceNodes(new) {
				if x.byNode[n] == nil {
					x.byNode[n] = map[string]bool{}
				}
				x.byNode[n][new.Name] = true
				touched = append(touched, n)
			}
		}
	}
	slices.Sort(touched)
	touched = slices.Compact(touched)
	for _, n := range touched {
		x.rebuild(n)
	}
	x.mu.Unlock()
	x.tell(touched)
}

func (x *Index) tell(nodes []string) {
	x.lmu.Lock()
	ls := x.listeners
	x.lmu.Unlock()
	for _, n := range nodes {
		if x.changed != nil {
			x.changed(n)
		}
		for _, l := range ls {
			l(n)
		}
	}
}

// AddListener has f told of every node whose devices or claims change.
func (x *Index) AddListener(f func(node string)) {
	x.lmu.Lock()
	defer x.lmu.Unlock()
	x.listeners = append(slices.Clip(x.listeners), f)
}

// rebuild derives a node's devices from its slices (x.mu held): only each
// pool's newest generation counts, as for the allocator.
func (x *Index) rebuild(node string) {
	if old := x.nodes[node]; old != nil {
		for _, id := range old.ids {
			if x.devices[id].node == node {
				delete(x.devices, id)
			}
		}
	}
	names := x.byNode[node]
	if len(names) == 0 {
		delete(x.byNode, node)
		delete(x.nodes, node)
		return
	}
	newest := map[poolID]int64{}
	var ss []*resourceapi.ResourceSlice
	for name := range names {
		s := x.slices[name]
		ss = append(ss, s)
		p := poolID{s.Spec.Driver, s.Spec.Pool.Name}
		newest[p] = max(newest[p], s.Spec.Pool.Generation)
	}
	slices.SortFunc(ss, func(a, b *resourceapi.ResourceSlice) int {
		return cmp.Or(cmp.Compare(a.Spec.Driver, b.Spec.Driver), cmp.Compare(a.Spec.Pool.Name, b.Spec.Pool.Name), cmp.Compare(a.Name, b.Name))
	})
	var devs []gpu.Device
	var pools []poolID
	var ids []DeviceID
	at := map[string]int{} // GPU UUID → index in devs
	type part struct {
		id     DeviceID
		parent string
		mem    int64
		model  string
		taint  bool
		drv    *Driver
	}
	var parts []part
	for _, s := range ss {
		if s.Spec.Pool.Generation < newest[poolID{s.Spec.Driver, s.Spec.Pool.Name}] {
			continue
		}
		drv := x.drivers[s.Spec.Driver]
		if p := (poolID{s.Spec.Driver, s.Spec.Pool.Name}); !slices.Contains(pools, p) {
			pools = append(pools, p)
		}
		for i := range s.Spec.Devices {
			dev := &s.Spec.Devices[i]
			if dev.NodeName != nil && *dev.NodeName != "" && *dev.NodeName != node {
				continue
			}
			if dev.NodeName == nil && (s.Spec.NodeName == nil || *s.Spec.NodeName != node) {
				continue
			}
			id := DeviceID{s.Spec.Driver, s.Spec.Pool.Name, dev.Name}
			mem := int64(0)
			if q, ok := drv.capacity(dev, drv.MemoryCapacity); ok {
				mem = mib(q)
			}
			switch drv.kindOf(dev) {
			case wholeGPU:
				uuid := drv.str(dev, drv.UUIDAttribute)
				if uuid == "" {
					uuid = id.Driver + "/" + id.Pool + "/" + id.Device
				}
				if _, dup := at[uuid]; dup {
					continue
				}
				shared := dev.AllowMultipleAllocations != nil && *dev.AllowMultipleAllocations
				cores := int32(100)
				if q, ok := drv.capacity(dev, drv.CoresCapacity); ok && percent(q) > 0 {
					cores = percent(q)
				}
				slots := int32(1)
				if shared {
					slots = SharedSlots
				}
				at[uuid] = len(devs)
				devs = append(devs, gpu.Device{UUID: uuid, Model: model(drv.str(dev, drv.ProductAttribute)), MemoryMiB: mem,
					Cores: cores, Slots: slots, Healthy: !tainted(dev)})
				x.devices[id] = deviceInfo{node: node, uuid: uuid, driver: drv, shared: shared, memMiB: mem}
				ids = append(ids, id)
			case partition:
				parts = append(parts, part{id: id, parent: drv.str(dev, drv.ParentAttribute), mem: mem,
					model: model(drv.str(dev, drv.ProductAttribute)), taint: tainted(dev), drv: drv})
			}
		}
	}
	// A partition holds a share of its GPU. A GPU published only through
	// its partitions (MIG mode) is there, but takes no whole-GPU request.
	perParent := map[string]int32{}
	for _, p := range parts {
		i, ok := at[p.parent]
		if !ok {
			at[p.parent] = len(devs)
			devs = append(devs, gpu.Device{UUID: p.parent, Model: p.model, Cores: 100, Slots: 0, Healthy: true, Cordoned: true})
			i = len(devs) - 1
		}
		d := &devs[i]
		if d.Cordoned {
			d.MemoryMiB += p.mem
		}
		if p.taint {
			// A partition tainted (a lost GPU, a fatal XID): its GPU
			// takes nothing new.
			d.Healthy = false
		}
		perParent[p.parent]++
		x.devices[p.id] = deviceInfo{node: node, uuid: p.parent, driver: p.drv, part: true, memMiB: p.mem}
		ids = append(ids, p.id)
	}
	for uuid, n := range perParent {
		d := &devs[at[uuid]]
		d.Slots = max(d.Slots, n)
	}
	x.nodes[node] = &nodeDevices{devs: devs, pools: pools, ids: ids}
}

// model is a driver's product name as GPU Feature Discovery labels it
// (nvidia.com/gpu.product: NVML's name with dashes for spaces), which model
// constraints are written against.
func model(product string) string { return strings.ReplaceAll(strings.TrimSpace(product), " ", "-") }

// ClaimChanged records a claim as it is now; nil new is a deletion. Only
// allocated claims count.
func (x *Index) ClaimChanged(old, new *resourceapi.ResourceClaim) {
	var touched []string
	x.mu.Lock()
	if old != nil {
		touched = x.dropClaim(old.UID, touched)
	}
	if new != nil {
		touched = x.dropClaim(new.UID, touched)
		// Allocated, it holds its devices, even while it is deleted: the
		// kubelet frees them only when the claim is gone.
		if a := new.Status.Allocation; a != nil {
			e := &claimEntry{name: new.Namespace + "/" + new.Name}
			for _, r := range new.Status.ReservedFor {
				if r.Resource == "pods" && r.APIGroup == "" {
					e.consumers = append(e.consumers, r.UID)
				}
			}
			for _, o := range new.OwnerReferences {
				if o.Kind == "Pod" && o.APIVersion == "v1" && !slices.Contains(e.consumers, o.UID) {
					e.consumers = append(e.consumers, o.UID)
				}
			}
			for _, r := range a.Devices.Results {
				if _, ours := x.drivers[r.Driver]; !ours || r.AdminAccess != nil && *r.AdminAccess {
					// Admin access reaches a device without holding it.
					continue
				}
				e.results = append(e.results, r)
			}
			if len(e.results) > 0 {
				x.claims[new.UID] = e
				for _, r := range e.results {
					p := poolID{r.Driver, r.Pool}
					if x.byPool[p] == nil {
						x.byPool[p] = map[types.UID]bool{}
					}
					x.byPool[p][new.UID] = true
					touched = x.nodeOf(r, touched)
				}
			}
		}
	}
	x.mu.Unlock()
	slices.Sort(touched)
	x.tell(slices.Compact(touched))
}

func (x *Index) nodeOf(r resourceapi.DeviceRequestAllocationResult, touched []string) []string {
	if d, ok := x.devices[DeviceID{r.Driver, r.Pool, r.Device}]; ok {
		return append(touched, d.node)
	}
	return touched
}

func (x *Index) dropClaim(uid types.UID, touched []string) []string {
	e := x.claims[uid]
	if e == nil {
		return touched
	}
	delete(x.claims, uid)
	for _, r := range e.results {
		p := poolID{r.Driver, r.Pool}
		delete(x.byPool[p], uid)
		if len(x.byPool[p]) == 0 {
			delete(x.byPool, p)
		}
		touched = x.nodeOf(r, touched)
	}
	return touched
}

// Claimed is what each allocated claim holds on the node's GPUs: a whole
// device, what it consumes of a shared one (its consumed capacity), or a
// partition's memory of its GPU.
func (x *Index) Claimed(node string) []gpu.ClaimHold {
	x.mu.RLock()
	defer x.mu.RUnlock()
	n := x.nodes[node]
	if n == nil {
		return nil
	}
	seen := map[types.UID]bool{}
	var out []gpu.ClaimHold
	for _, p := range n.pools {
		for uid := range x.byPool[p] {
			if seen[uid] {
				continue
			}
			seen[uid] = true
			e := x.claims[uid]
			h := gpu.ClaimHold{Name: e.name, Consumers: e.consumers}
			for _, r := range e.results {
				rd, ok := x.devices[DeviceID{r.Driver, r.Pool, r.Device}]
				if !ok || rd.node != node {
					continue
				}
				h.Uses = append(h.Uses, use(n.devs, rd, r))
			}
			if len(h.Uses) > 0 {
				out = append(out, h)
			}
		}
	}
	slices.SortFunc(out, func(a, b gpu.ClaimHold) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// use is what one allocation result holds of its GPU.
func use(devs []gpu.Device, d deviceInfo, r resourceapi.DeviceRequestAllocationResult) gpu.DeviceUse {
	var g *gpu.Device
	for i := range devs {
		if devs[i].UUID == d.uuid {
			g = &devs[i]
			break
		}
	}
	u := gpu.DeviceUse{UUID: d.uuid, Slots: 1}
	if g == nil {
		return u
	}
	switch {
	case d.part:
		u.MemoryMiB = d.memMiB
		if g.MemoryMiB > 0 {
			u.Cores = int32(min((d.memMiB*int64(g.Cores)+g.MemoryMiB-1)/g.MemoryMiB, int64(g.Cores)))
		}
	case d.shared && r.ConsumedCapacity != nil:
		if q, ok := d.driver.consumed(r.ConsumedCapacity, d.driver.MemoryCapacity); ok {
			u.MemoryMiB = mib(q)
		}
		if q, ok := d.driver.consumed(r.ConsumedCapacity, d.driver.CoresCapacity); ok {
			u.Cores = percent(q)
		}
	default:
		u.MemoryMiB, u.Cores = g.MemoryMiB, g.Cores
	}
	return u
}
