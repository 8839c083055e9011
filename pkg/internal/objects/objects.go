// Package objects compares the parts of Kubernetes objects that event
// handlers look at to tell a real change from a heartbeat.
package objects

import (
	v1 "k8s.io/api/core/v1"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/agent/hami"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
)

// SameDevices reports whether two versions of a node report the same GPUs:
// only what the device inventory reads (gpu.ReadInventory and the HAMi
// agent: the product and memory labels, the GPU resources' allocatable and
// capacity, the agent's registration and cordon), not the other labels,
// which GPU Feature Discovery alone rewrites every minute.
func SameDevices(a, b *v1.Node, opts gpu.NodeOptions) bool {
	if a.Labels[opts.ProductLabel] != b.Labels[opts.ProductLabel] || a.Labels[opts.MemoryLabel] != b.Labels[opts.MemoryLabel] ||
		a.Annotations[hami.AnnotationRegister] != b.Annotations[hami.AnnotationRegister] ||
		a.Annotations[hami.AnnotationCordon] != b.Annotations[hami.AnnotationCordon] ||
		a.Labels[gpu.LabelGPUCount] != b.Labels[gpu.LabelGPUCount] || a.Labels[gpu.LabelGPUReplicas] != b.Labels[gpu.LabelGPUReplicas] ||
		!sameQuantity(a, b, hami.ResourceGPU) {
		return false
	}
	for _, r := range opts.ResourceNames {
		if !sameQuantity(a, b, r) {
			return false
		}
	}
	return true
}

func sameQuantity(a, b *v1.Node, r v1.ResourceName) bool {
	qa, oka := a.Status.Allocatable[r]
	qb, okb := b.Status.Allocatable[r]
	if oka != okb || qa.Cmp(qb) != 0 {
		return false
	}
	qa, oka = a.Status.Capacity[r]
	qb, okb = b.Status.Capacity[r]
	return oka == okb && qa.Cmp(qb) == 0
}
