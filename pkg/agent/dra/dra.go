// Package dra reads GPUs that a DRA driver publishes in ResourceSlices, and
// what allocated ResourceClaims hold on them, into the GPU domain's terms
// (gpu.ClaimSource). The allocator that hands the devices out is the
// DynamicResources plugin's, never a bind of ours: this package only counts.
// It knows nothing of the scheduling framework; an Index is fed by
// informers' events.
package dra

import (
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Driver says how one DRA driver describes its GPUs. Attribute and capacity
// names are looked up as given and qualified by the driver's name.
type Driver struct {
	// Name is the ResourceSlice's spec.driver.
	Name string
	// TypeAttribute, if set, must be GPUType on a whole GPU; a device of
	// another type with a ParentAttribute is a partition of its parent
	// (MIG); any other device is not a GPU and is ignored.
	TypeAttribute string
	GPUType       string
	// UUIDAttribute identifies the GPU (driver/pool/device without it);
	// ParentAttribute names a partition's GPU.
	UUIDAttribute   string
	ParentAttribute string
	// ProductAttribute is the model, as GFD's nvidia.com/gpu.product
	// labels it.
	ProductAttribute string
	// MemoryCapacity is the device memory (a quantity in bytes);
	// CoresCapacity, if the driver shares devices by compute, the cores
	// in percent of the GPU.
	MemoryCapacity string
	CoresCapacity  string
}

// Default drivers, as they publish on 2026-08:
//   - NVIDIA's GPU driver (kubernetes-sigs/dra-driver-nvidia-gpu): a device
//     of type "gpu" per GPU with uuid, productName and memory in bytes;
//     MIG devices of type "mig" with parentUUID; with its ConsumableShares
//     gate, a GPU allows multiple allocations by memory;
//   - HAMi's (Project-HAMi/k8s-dra-driver): one "hami-gpu" device per GPU,
//     shared by consumable capacity: cores (percent) and memory (bytes).
var (
	NVIDIA = Driver{Name: "gpu.nvidia.com", TypeAttribute: "type", GPUType: "gpu", UUIDAttribute: "uuid",
		ParentAttribute: "parentUUID", ProductAttribute: "productName", MemoryCapacity: "memory"}
	HAMi = Driver{Name: "hami-core-gpu.project-hami.io", TypeAttribute: "type", GPUType: "hami-gpu", UUIDAttribute: "uuid",
		ProductAttribute: "productName", MemoryCapacity: "memory", CoresCapacity: "cores"}
	DefaultDrivers = []Driver{NVIDIA, HAMi}
)

// SourceName is how messages name DRA.
const SourceName = "DRA"

func (d *Driver) attr(dev *resourceapi.Device, name string) (resourceapi.DeviceAttribute, bool) {
	if name == "" {
		return resourceapi.DeviceAttribute{}, false
	}
	if a, ok := dev.Attributes[resourceapi.QualifiedName(name)]; ok {
		return a, true
	}
	a, ok := dev.Attributes[resourceapi.QualifiedName(d.Name+"/"+name)]
	return a, ok
}

func (d *Driver) str(dev *resourceapi.Device, name string) string {
	a, ok := d.attr(dev, name)
	if !ok {
		return ""
	}
	switch {
	case a.StringValue != nil:
		return *a.StringValue
	case a.VersionValue != nil:
		return *a.VersionValue
	}
	return ""
}

func (d *Driver) capacity(dev *resourceapi.Device, name string) (resource.Quantity, bool) {
	if name == "" {
		return resource.Quantity{}, false
	}
	if c, ok := dev.Capacity[resourceapi.QualifiedName(name)]; ok {
		return c.Value, true
	}
	c, ok := dev.Capacity[resourceapi.QualifiedName(d.Name+"/"+name)]
	return c.Value, ok
}

// consumed reads a capacity from an allocation's consumedCapacity.
func (d *Driver) consumed(m map[resourceapi.QualifiedName]resource.Quantity, name string) (resource.Quantity, bool) {
	if name == "" || m == nil {
		return resource.Quantity{}, false
	}
	if q, ok := m[resourceapi.QualifiedName(name)]; ok {
		return q, true
	}
	q, ok := m[resourceapi.QualifiedName(d.Name+"/"+name)]
	return q, ok
}

// kind is what a published device is to the GPU domain.
type kind uint8

const (
	notGPU kind = iota
	wholeGPU
	partition
)

func (d *Driver) kindOf(dev *resourceapi.Device) kind {
	if d.TypeAttribute == "" {
		if d.str(dev, d.ParentAttribute) != "" {
			return partition
		}
		return wholeGPU
	}
	t := d.str(dev, d.TypeAttribute)
	switch {
	case strings.EqualFold(t, d.GPUType):
		return wholeGPU
	case d.str(dev, d.ParentAttribute) != "":
		return partition
	}
	return notGPU
}

// mib is a byte quantity in MiB, rounded down.
func mib(q resource.Quantity) int64 {
	v, ok := q.AsInt64()
	if !ok || v <= 0 {
		return 0
	}
	return v >> 20
}

// percent is a cores quantity in percent of a GPU: a plain number (100 is
// the GPU), capped at 100.
func percent(q resource.Quantity) int32 {
	v := q.Value()
	if v <= 0 {
		return 0
	}
	return int32(min(v, 100))
}

// tainted reports whether a device's taints keep a pod without tolerations
// off it (NoSchedule, NoExecute): the allocator skips it for an extended
// resource's claim, which tolerates nothing.
func tainted(dev *resourceapi.Device) bool {
	for _, t := range dev.Taints {
		if t.Effect == resourceapi.DeviceTaintEffectNoSchedule || t.Effect == resourceapi.DeviceTaintEffectNoExecute {
			return true
		}
	}
	return false
}
