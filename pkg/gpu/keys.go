// Package gpu is the scheduler's domain model of GPUs: what a pod asks for,
// what a node has, which devices are in use, whether a request fits, which
// devices to take, and how fragmented a node is. It knows nothing about the
// scheduling framework; the plugins are thin adapters over it.
package gpu

// Every annotation and label key the scheduler reads or writes lives here and
// is documented in docs/api.md. Change both together.
const (
	// Prefix is our own annotation domain.
	Prefix = "gpu-scheduler.io/"

	// SchedulerName is the profile name pods set in spec.schedulerName.
	SchedulerName = "gpu-scheduler"

	// AnnotationMilli requests a share of one GPU in milli-GPU, "1".."999".
	AnnotationMilli = Prefix + "gpu-milli"
	// AnnotationMemory requests a share of one GPU by memory, in MiB ("8192")
	// or as a quantity ("8Gi"). It is converted per node with LabelGPUMemory.
	AnnotationMemory = Prefix + "gpu-memory"
	// AnnotationModel restricts the GPU model: exact values of the node's
	// product label, separated by '|' or ','.
	AnnotationModel = Prefix + "gpu-model"
	// AnnotationAssignment is written at PreBind: the node and, per device,
	// the index and the milli-GPU taken. It alone rebuilds device accounting.
	// Format: "<node>:<index>=<milli>[,<index>=<milli>...]".
	AnnotationAssignment = Prefix + "assignment"
	// ConditionPending is the pod condition (status True while the pod is
	// pending) whose message is the scheduler's current explanation of why a
	// GPU pod is still pending, kept by the requeue reconciler through
	// pods/status, which the scheduler may write anyway.
	ConditionPending = Prefix + "PendingReason"

	// KAI-style aliases.
	AnnotationKAIFraction           = "gpu-fraction"
	AnnotationKAIMemory             = "gpu-memory"
	AnnotationKAIFractionNumDevices = "gpu-fraction-num-devices"

	// HAMi-style aliases: case-insensitive substrings of the model,
	// separated by ','.
	AnnotationHAMiUseType   = "nvidia.com/use-gputype"
	AnnotationHAMiNoUseType = "nvidia.com/nouse-gputype"
	// HAMi's device selectors by identity: exact UUIDs, separated by ','
	// (only nodes whose agent reports UUIDs can match use-gpuuuid).
	AnnotationHAMiUseUUID   = "nvidia.com/use-gpuuuid"
	AnnotationHAMiNoUseUUID = "nvidia.com/nouse-gpuuuid"

	// GPU Feature Discovery labels.
	LabelGPUProduct = "nvidia.com/gpu.product"
	LabelGPUMemory  = "nvidia.com/gpu.memory"
	// LabelGPUCount is the node's physical GPUs, and LabelGPUReplicas the
	// replicas per GPU NVIDIA's time-slicing or MPS advertises (GFD):
	// allocatable above count × replicas is a plugin that splits GPUs
	// into slots of its own (HAMi's).
	LabelGPUCount    = "nvidia.com/gpu.count"
	LabelGPUReplicas = "nvidia.com/gpu.replicas"

	// ResourceNvidiaGPU is the default whole-GPU extended resource.
	ResourceNvidiaGPU = "nvidia.com/gpu"
)

// RequestAnnotations are the annotations ParseRequest reads: with the GPU
// resources, they are what a pod holds. The admission policy freezes them on
// bound pods.
var RequestAnnotations = []string{
	AnnotationMilli, AnnotationMemory, AnnotationModel,
	AnnotationKAIFraction, AnnotationKAIMemory, AnnotationKAIFractionNumDevices,
	AnnotationHAMiUseType, AnnotationHAMiNoUseType,
	AnnotationHAMiUseUUID, AnnotationHAMiNoUseUUID,
}

// MilliPerGPU is the capacity of one device in milli-GPU.
const MilliPerGPU = 1000

// MaxDevices is the largest number of devices per node that we track: MIG's
// single strategy reports 56 on an 8-GPU node (7 slices each). A node that
// reports more is refused for GPU pods (TooManyDevices), never cut silently.
const MaxDevices = 64

// Bounds on numbers read from pods and nodes. Each is far beyond real
// hardware and keeps every product in the accounting inside int64.
const (
	// MaxGPUMemoryMiB is the largest GPU memory per device, in a request or
	// a node label: 1 TiB.
	MaxGPUMemoryMiB = 1 << 20
	// maxCPUMilli and maxMemoryMiB cap a pod's CPU and memory requests as
	// the fragmentation arithmetic sees them (about 10^9 cores, 1 EiB).
	maxCPUMilli  = 1 << 40
	maxMemoryMiB = 1 << 40
)
