package dra

import (
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
)

// ClaimRequest reads what a pod's claims ask of the GPUs the index reads,
// as a request for placement to score (the DynamicResources plugin decides
// whether they fit): whole GPUs, a count; or a share of one GPU by
// capacity (cores in percent, memory). A class is a GPU class when its
// selectors name one of the drivers and that driver's GPU type. Claims
// already allocated ask for nothing new. ok is false when the claims ask
// for no GPU of ours, or for what a request cannot say (all devices, a
// prioritized list, several shares, partitions): the pod is then scored
// as one without GPUs.
func (x *Index) ClaimRequest(claims []*resourceapi.ResourceClaim, class func(name string) *resourceapi.DeviceClass) (gpu.Request, bool) {
	var r gpu.Request
	for _, c := range claims {
		if c == nil || c.Status.Allocation != nil {
			continue
		}
		for i := range c.Spec.Devices.Requests {
			e := c.Spec.Devices.Requests[i].Exactly
			if e == nil {
				return gpu.Request{}, false
			}
			d := x.gpuClass(class(e.DeviceClassName))
			if d == nil {
				continue
			}
			if e.AllocationMode != "" && e.AllocationMode != resourceapi.DeviceAllocationModeExactCount || e.Count < 1 || e.Count > gpu.MaxDevices {
				return gpu.Request{}, false
			}
			var sh gpu.DeviceShare
			if e.Capacity != nil {
				if q, ok := d.consumed(e.Capacity.Requests, d.MemoryCapacity); ok {
					sh.MemoryMiB = max(mib(q), 1)
				}
				if q, ok := d.consumed(e.Capacity.Requests, d.CoresCapacity); ok {
					sh.Cores = percent(q)
				}
			}
			switch {
			case sh == (gpu.DeviceShare{}) || sh.Cores >= 100 && sh.MemoryMiB == 0:
				if r.ShareCount > 0 {
					return gpu.Request{}, false
				}
				r.Count += int32(e.Count)
			case r.Count > 0 || r.ShareCount > 0 || e.Count > 1:
				return gpu.Request{}, false
			default:
				r.ShareCount, r.Share = 1, sh
			}
		}
	}
	if r.Count > gpu.MaxDevices {
		return gpu.Request{}, false
	}
	r.ByClaim = true
	return r, r.HasGPU()
}

// gpuClass is the driver whose whole GPUs a DeviceClass selects (nil for
// any other class): its selectors name the driver and its GPU type.
func (x *Index) gpuClass(c *resourceapi.DeviceClass) *Driver {
	if c == nil {
		return nil
	}
	var expr strings.Builder
	for _, s := range c.Spec.Selectors {
		if s.CEL != nil {
			expr.WriteString(s.CEL.Expression)
			expr.WriteByte('\n')
		}
	}
	e := expr.String()
	mentions := func(v string) bool { return strings.Contains(e, `"`+v+`"`) || strings.Contains(e, `'`+v+`'`) }
	for i := range x.order {
		d := &x.order[i]
		if mentions(d.Name) && (d.TypeAttribute == "" || mentions(d.GPUType)) {
			return x.drivers[d.Name]
		}
	}
	return nil
}
