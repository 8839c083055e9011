package gpu

import (
	"cmp"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Agent is a node agent that knows the GPUs by identity and delivers and
// enforces shares of them: it reports each device (memory, cores, how many
// containers may share it), reads a per-device share from a pod, and keeps
// its own record of what each pod holds. HAMi's device plugin is one
// (pkg/agent/hami). The domain does not know which; nodes the agent does
// not serve keep the inventory of allocatable and labels.
type Agent interface {
	// AgentName names the agent in messages.
	AgentName() string
	// Devices returns the node's devices, in the agent's index order, and
	// whether the agent serves the node at all, and has reported them. A
	// node it serves whose report cannot be read has no device (never the
	// allocatable count, which counts the agent's slots, not GPUs).
	Devices(node *v1.Node) ([]Device, AgentState)
	// Share reads a per-device share in the agent's own request dialect:
	// count devices, each taking share. ok is false when the pod does not
	// use the dialect.
	Share(pod *v1.Pod) (count int32, share DeviceShare, ok bool, err error)
	// Uses reads the agent's record of what the pod holds on the node, per
	// device; ok is false when there is none.
	Uses(pod *v1.Pod, node string) ([]DeviceUse, bool)
	// Pending reads a record another scheduler wrote for a pod it has
	// chosen devices for and not bound yet: the node, and since when it
	// holds them (ok is false for any other pod, ours included).
	Pending(pod *v1.Pod) (node string, since time.Time, ok bool)
}

// ClaimSource is where a node's GPUs come from when a DRA driver publishes
// them (ResourceSlices) instead of a device plugin, and what the allocated
// ResourceClaims hold on them, whoever allocated them (pkg/agent/dra). The
// devices are handed out by the claims' allocator, never by a bind of ours:
// on such a node the scheduler counts, judges and scores, and delivers no
// share of its own dialect.
type ClaimSource interface {
	// SourceName names the source in messages.
	SourceName() string
	// NodeDevices are the GPUs published for the node, in a stable order,
	// each a whole device (a partition counts on its parent); ok is false
	// when nothing is published for it.
	NodeDevices(node string) (devs []Device, ok bool)
	// Claimed is what each allocated claim holds on the node's devices.
	Claimed(node string) []ClaimHold
}

// ClaimHold is what one allocated claim holds on a node.
type ClaimHold struct {
	// Name is namespace/name, for messages.
	Name string
	// Consumers are the pods the claim is reserved for or owned by: they
	// hold its devices through it, never a second time by their request.
	Consumers []types.UID
	Uses      []DeviceUse
}

// AgentState is what an agent says of a node.
type AgentState uint8

const (
	// NotServed: the agent does not run on the node.
	NotServed AgentState = iota
	// Reported: the agent runs there, and its devices are the ones given.
	Reported
	// Unregistered: the agent runs there but has not reported its devices
	// yet. Its allocatable counts the agent's slots, not GPUs, so the node
	// takes no GPU pod until the report comes.
	Unregistered
)

// Device is one GPU as an agent reports it.
type Device struct {
	UUID  string
	Model string
	// Type is the agent's own name of the model, if it differs; model
	// substrings (HAMi's use-gputype) match either.
	Type string
	// MemoryMiB and Cores (100 is the whole GPU) are what the agent hands
	// out; Slots is how many containers may share the device.
	MemoryMiB int64
	Cores     int32
	Slots     int32
	Healthy   bool
	// Cordoned devices take nothing new.
	Cordoned  bool
	modelFold string
}

// DeviceShare is what a request takes on each of its devices where an agent
// enforces shares: memory (MiB, or per mille of the device's) and cores (in
// percent; 0 takes none and is not throttled).
type DeviceShare struct {
	MemoryMiB int64
	Permille  int32
	Cores     int32
}

// Exclusive is the whole device: all its memory and cores.
var Exclusive = DeviceShare{Permille: MilliPerGPU, Cores: 100}

// MemoryOn is the MiB the share takes on a device with total MiB.
func (sh DeviceShare) MemoryOn(total int64) int64 {
	if sh.MemoryMiB > 0 {
		return sh.MemoryMiB
	}
	return total * int64(sh.Permille) / MilliPerGPU
}

// IsExclusive reports whether the share takes all of a device's cores: the
// device must be unused, as the agent's own scheduler requires.
func (sh DeviceShare) IsExclusive(d *Device) bool { return sh.Cores >= d.Cores }

// milliOn projects the share on a device to milli-GPU (for fragmentation
// and scores): the larger of its memory and core fractions, rounded up, at
// least 1.
func (sh DeviceShare) milliOn(d *Device) int32 {
	if d.MemoryMiB <= 0 || d.Cores <= 0 {
		return MilliPerGPU
	}
	m := (min(sh.MemoryOn(d.MemoryMiB), d.MemoryMiB)*MilliPerGPU + d.MemoryMiB - 1) / d.MemoryMiB
	c := int64(min(sh.Cores, d.Cores)) * MilliPerGPU / int64(d.Cores)
	return int32(max(m, c, 1))
}

// DeviceUse is what one pod holds on one device.
type DeviceUse struct {
	UUID      string
	MemoryMiB int64
	Cores     int32
	Slots     int32
}

// UUIDSelector restricts the devices by identity (HAMi's use-gpuuuid and
// nouse-gpuuuid).
type UUIDSelector struct {
	Use, NoUse []string
}

func (u *UUIDSelector) allows(uuid string) bool {
	if len(u.Use) > 0 && !contains(u.Use, uuid) {
		return false
	}
	return !contains(u.NoUse, uuid)
}

func contains(l []string, s string) bool {
	for _, v := range l {
		if v == s {
			return true
		}
	}
	return false
}

// agentState is what the devices of an agent's node hold, per dimension the
// agent enforces. NodeState.Free is derived from it: the largest even share
// of memory and cores still free on each device.
type agentState struct {
	devs  []Device
	mem   [MaxDevices]int64
	cores [MaxDevices]int32
	slots [MaxDevices]int32
}

func (a *agentState) free(i int) int32 {
	return freeOf(&a.devs[i], a.mem[i], a.cores[i], a.slots[i])
}

// freeOf is the largest even share of memory and cores a device still
// has, in milli-GPU, given what it holds.
func freeOf(d *Device, mem int64, cores, slots int32) int32 {
	if !d.Healthy || d.Cordoned || slots >= d.Slots || d.MemoryMiB <= 0 || d.Cores <= 0 {
		return 0
	}
	memLeft, coresLeft := d.MemoryMiB-mem, int64(d.Cores-cores)
	if memLeft <= 0 || coresLeft <= 0 {
		return 0
	}
	f := min(memLeft*MilliPerGPU/d.MemoryMiB, coresLeft*MilliPerGPU/int64(d.Cores))
	if slots > 0 {
		f = min(f, MilliPerGPU-1) // used: no longer a whole device
	}
	return int32(f)
}

// admits reports whether device i can take the share now, exactly as the
// agent would count it (HAMi's Fit): healthy, not cordoned, allowed by
// model and identity, a slot free, the memory and cores free, an exclusive
// share only on an unused device, and a share without cores only where
// cores are left.
func (a *agentState) admits(i int, r *Request, sh *DeviceShare) bool {
	d := &a.devs[i]
	if !d.Healthy || d.Cordoned || !a.allowed(i, r) {
		return false
	}
	if a.slots[i] >= d.Slots || a.mem[i]+sh.MemoryOn(d.MemoryMiB) > d.MemoryMiB || a.cores[i]+sh.Cores > d.Cores {
		return false
	}
	if sh.IsExclusive(d) && a.slots[i] > 0 {
		return false
	}
	return sh.Cores > 0 || a.cores[i] < d.Cores
}

// allowed checks what never changes while the device is there: model and
// identity, and that the share fits the empty device.
func (a *agentState) allowed(i int, r *Request) bool {
	d := &a.devs[i]
	if !r.Models.Empty() && !r.Models.Matches(d.Model, d.modelFold) {
		return false
	}
	return r.UUIDs.allows(d.UUID)
}

func (a *agentState) take(i int, mem int64, cores, slots int32) (over bool) {
	d := &a.devs[i]
	a.mem[i] += mem
	a.cores[i] += cores
	a.slots[i] += slots
	return a.mem[i] > d.MemoryMiB || a.cores[i] > d.Cores || a.slots[i] > d.Slots
}

// readAgentInventory is the inventory of a node an agent serves.
func readAgentInventory(devs []Device, agent string) Inventory {
	inv := Inventory{Agent: agent, Reported: int64(len(devs))}
	if len(devs) > MaxDevices {
		return inv
	}
	inv.Devices = make([]Device, len(devs))
	copy(inv.Devices, devs)
	inv.Count = int32(len(devs))
	for i := range inv.Devices {
		d := &inv.Devices[i]
		d.modelFold = strings.ToUpper(d.Model)
		if d.Type != "" && d.Type != d.Model {
			d.modelFold += "\n" + strings.ToUpper(d.Type)
		}
		d.MemoryMiB = min(max(d.MemoryMiB, 0), MaxGPUMemoryMiB)
		d.Cores = max(d.Cores, 0)
		d.Slots = max(d.Slots, 0)
		if !d.Healthy {
			inv.Unhealthy++
		}
		if inv.Model == "" {
			inv.Model, inv.MemoryMiB = d.Model, d.MemoryMiB
		}
	}
	inv.ModelFold = strings.ToUpper(inv.Model)
	return inv
}

// layDownAgent places the pods whose devices are not known on an agent's
// node, in an order that does not depend on how they are listed: exclusive
// and multi-device requests first, on unused devices from the highest
// index, then the shares, largest memory first, each on the device it fits
// most tightly. One that fits nowhere overcommits the node and still takes
// the device with the most room, so what is shown free is never more than
// what is free.
func (s *NodeState) layDownAgent(hs []held) {
	a := s.agent
	mem := func(h *held) int64 {
		if len(a.devs) == 0 {
			return 0
		}
		return h.share.MemoryOn(a.devs[0].MemoryMiB)
	}
	slices.SortFunc(hs, func(x, y held) int {
		if x.devices != y.devices {
			return cmp.Compare(y.devices, x.devices)
		}
		if c := cmp.Compare(y.share.Cores, x.share.Cores); c != 0 {
			return c
		}
		if c := cmp.Compare(mem(&y), mem(&x)); c != 0 {
			return c
		}
		return strings.Compare(x.order, y.order)
	})
	var any Request
	for k := range hs {
		h := &hs[k]
		h.fits = true
		var taken uint64
		for n := int32(0); n < h.devices; n++ {
			best := -1
			for i := int(s.Count) - 1; i >= 0; i-- {
				if taken&(1<<uint(i)) != 0 || !a.admits(i, &any, &h.share) {
					continue
				}
				if best < 0 || s.Free[i] < s.Free[best] {
					best = i
				}
			}
			if best < 0 {
				h.fits = false
				for i := int(s.Count) - 1; i >= 0; i-- {
					if taken&(1<<uint(i)) == 0 && (best < 0 || s.Free[i] > s.Free[best]) {
						best = i
					}
				}
			}
			if best < 0 {
				s.Overcommitted = true
				break
			}
			taken |= 1 << uint(best)
			s.takeShare(best, h.share)
		}
		h.mask = taken
		if !h.fits {
			s.Overcommitted = true
		}
	}
}

// Admits reports whether the devices of a choice can take its share now,
// on what the node holds (a recheck just before a bind).
func (s *NodeState) Admits(c Choice) bool {
	var none Request
	for i := 0; i < int(s.Count); i++ {
		if c.Mask&(1<<uint(i)) == 0 {
			continue
		}
		if s.agent != nil && !s.agent.admits(i, &none, &c.Share) || s.agent == nil && s.Free[i] < c.Milli {
			return false
		}
	}
	return c.Mask != 0 && !s.Overcommitted
}

// AgentUse is what device i holds in the agent's own dimensions (memory in
// MiB, cores out of 100, slots taken); ok is false on a node without an
// agent.
func (s *NodeState) AgentUse(i int) (memMiB int64, cores, slots int32, ok bool) {
	if s.agent == nil || i < 0 || i >= len(s.agent.devs) {
		return 0, 0, 0, false
	}
	return s.agent.mem[i], s.agent.cores[i], s.agent.slots[i], true
}

// Usable is how many devices can take pods: all of them on a node of
// allocatable and labels (the unhealthy are not counted there); the healthy,
// uncordoned ones on an agent's node, which reports every device.
func (s *NodeState) Usable() int32 {
	if s.agent == nil {
		return s.Count
	}
	var n int32
	for i := 0; i < int(s.Count); i++ {
		if d := &s.agent.devs[i]; d.Healthy && !d.Cordoned {
			n++
		}
	}
	return n
}
