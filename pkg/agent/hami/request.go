package hami

import (
	"math"

	v1 "k8s.io/api/core/v1"
)

// Config is what the device plugin's deployment sets for requests (HAMi's
// chart defaults: memory factor 1, default memory 0 = 100% of the device,
// default cores 0 = unthrottled).
type Config struct {
	MemoryFactor  int32
	DefaultMemory int32
	DefaultCores  int32
}

// ContainerRequest is what one container asks of HAMi's devices: Nums
// devices (each a different GPU), and on each Memreq MiB, or
// MemPercentagereq percent of the device's memory (101: unset), and
// Coresreq percent of its cores.
type ContainerRequest struct {
	Nums             int32
	Memreq           int32
	MemPercentagereq int32
	Coresreq         int32
}

// MemPercentUnset marks a request that gives its memory in MiB.
const MemPercentUnset = 101

// quantity is a container's value of a resource: limits before requests.
func quantity(c *v1.Container, name v1.ResourceName) (int64, bool, bool) {
	q, ok := c.Resources.Limits[name]
	if !ok {
		q, ok = c.Resources.Requests[name]
	}
	if !ok {
		return 0, false, false
	}
	n, isInt := q.AsInt64()
	return n, true, isInt
}

// ParseContainerRequest reads a container's request in HAMi's dialect, as
// HAMi's GenerateResourceRequests does: no (or a non-integer) nvidia.com/gpu
// is no request; a gpumem that is not a plain integer within int32 (after
// the factor) makes the container request nothing; a gpumem-percentage above
// 100 is 100 and one at 0 or below is ignored; gpumem wins over the
// percentage; no memory key means DefaultMemory, or 100% when that is 0.
// Cores are clamped to 0..100 (HAMi's Fit clamps above 100; a value beyond
// int32 wrapped there).
func ParseContainerRequest(c *v1.Container, cfg Config) ContainerRequest {
	n, has, isInt := quantity(c, ResourceGPU)
	if !has || !isInt || n <= 0 {
		return ContainerRequest{}
	}
	r := ContainerRequest{Nums: int32(min(n, math.MaxInt32)), MemPercentagereq: MemPercentUnset, Coresreq: cfg.DefaultCores}
	if mem, has, isInt := quantity(c, ResourceMemory); has {
		factor := max(int64(cfg.MemoryFactor), 1)
		if !isInt || mem < 0 || mem > math.MaxInt32/factor {
			return ContainerRequest{}
		}
		r.Memreq = int32(mem * factor)
	}
	if pct, has, isInt := quantity(c, ResourceMemoryPercent); has && isInt && pct > 0 {
		r.MemPercentagereq = int32(min(pct, 100))
	}
	if r.MemPercentagereq == MemPercentUnset && r.Memreq == 0 {
		if cfg.DefaultMemory != 0 {
			r.Memreq = cfg.DefaultMemory
		} else {
			r.MemPercentagereq = 100
		}
	}
	if cores, has, isInt := quantity(c, ResourceCores); has && isInt {
		r.Coresreq = int32(max(min(cores, 100), 0))
	}
	return r
}

// MemoryOn is the MiB the request takes on a device with devmem MiB: the
// MiB asked, or the percentage of the device (HAMi's Fit, integer).
func (r ContainerRequest) MemoryOn(devmem int32) int32 {
	if r.Memreq > 0 || r.MemPercentagereq == MemPercentUnset {
		return r.Memreq
	}
	return int32(int64(devmem) * int64(r.MemPercentagereq) / 100)
}
