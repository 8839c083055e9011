// Package hami speaks the node-side protocol of HAMi's device plugin
// (NVIDIA, hami-core mode, as of HAMi v2.10.0): the device registration a
// node publishes, the per-container device lists a scheduler writes for the
// plugin, the node lock that serialises binds, and how the pods' device lists
// add up on a device. It knows nothing about the scheduling framework; the
// GPU domain (pkg/gpu) does not know it exists. The reference is
// docs/hami-protocol.md of the shared docs, with citations to HAMi's source;
// the function names below follow HAMi's.
package hami

import "time"

// Keys. Node annotations first, then pod annotations.
const (
	// AnnotationRegister is the device plugin's registration: a JSON array,
	// one object per physical GPU (or the legacy string of plugins up to
	// v2.7).
	AnnotationRegister = "hami.io/node-nvidia-register"
	// AnnotationHandshake is HAMi's scheduler's own bookkeeping; gpu-scheduler
	// neither reads nor writes it.
	AnnotationHandshake = "hami.io/node-handshake"
	// AnnotationCordon lists GPU UUIDs, comma-separated, barred from new
	// allocations.
	AnnotationCordon = "hami.io/device-cordon"
	// AnnotationNodeLock serialises binds on a node: the plugin serves the
	// pod that holds it.
	AnnotationNodeLock = "hami.io/mutex.lock"

	// AnnotationVGPUNode names the node a pod's devices are on (also a
	// label of that name).
	AnnotationVGPUNode = "hami.io/vgpu-node"
	// AnnotationVGPUTime is when the devices were chosen, in Unix seconds.
	AnnotationVGPUTime = "hami.io/vgpu-time"
	// AnnotationToAllocate is the device list the plugin consumes, one
	// container at a time.
	AnnotationToAllocate = "hami.io/vgpu-devices-to-allocate"
	// AnnotationAllocated is the same list, never changed afterwards: what
	// the pod holds.
	AnnotationAllocated = "hami.io/vgpu-devices-allocated"
	// AnnotationBindPhase is allocating (written by the scheduler), then
	// success or failed (written by the plugin).
	AnnotationBindPhase = "hami.io/bind-phase"
	// AnnotationBindTime is when the bind began, in Unix seconds; the
	// plugin only checks that it is there.
	AnnotationBindTime = "hami.io/bind-time"

	// Pod annotations that constrain the devices (with the model ones in
	// pkg/gpu: nvidia.com/use-gputype and nouse-gputype).
	AnnotationUseUUID   = "nvidia.com/use-gpuuuid"
	AnnotationNoUseUUID = "nvidia.com/nouse-gpuuuid"
)

// Bind phases.
const (
	BindAllocating = "allocating"
	BindSuccess    = "success"
	BindFailed     = "failed"
)

// Resources of HAMi's request dialect.
const (
	ResourceGPU           = "nvidia.com/gpu"
	ResourceMemory        = "nvidia.com/gpumem"
	ResourceMemoryPercent = "nvidia.com/gpumem-percentage"
	ResourceCores         = "nvidia.com/gpucores"
	ResourcePriority      = "nvidia.com/priority"
)

// Family is the device family word in a device list entry (not the model).
const Family = "NVIDIA"

// ModeHAMiCore is the default device mode: memory and SM limits enforced by
// HAMi-core inside the container.
const ModeHAMiCore = "hami-core"

// NodeLockTimeout is when a lock is stale and may be taken over (HAMi's
// default; HAMI_NODELOCK_EXPIRE changes it on HAMi's side).
const NodeLockTimeout = 5 * time.Minute

// Separators of the device list and the legacy registration.
const (
	deviceSep    = ":" // ends each device of a container, and each legacy GPU
	containerSep = ";" // ends each container
	lockSep      = ","
)
