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
	// AnnotationPendingReason is the scheduler's current explanation of why a
	// GPU pod is still pending (maintained by the requeue reconciler).
	AnnotationPendingReason = Prefix + "pending-reason"

	// KAI-style aliases.
	AnnotationKAIFraction           = "gpu-fraction"
	AnnotationKAIMemory             = "gpu-memory"
	AnnotationKAIFractionNumDevices = "gpu-fraction-num-devices"

	// HAMi-style aliases: case-insensitive substrings of the model,
	// separated by ','.
	AnnotationHAMiUseType   = "nvidia.com/use-gputype"
	AnnotationHAMiNoUseType = "nvidia.com/nouse-gputype"

	// GPU Feature Discovery labels.
	LabelGPUProduct = "nvidia.com/gpu.product"
	LabelGPUMemory  = "nvidia.com/gpu.memory"

	// ResourceNvidiaGPU is the default whole-GPU extended resource.
	ResourceNvidiaGPU = "nvidia.com/gpu"
)

// MilliPerGPU is the capacity of one device in milli-GPU.
const MilliPerGPU = 1000

// MaxDevices is the largest number of devices per node that we track.
// Devices beyond it are ignored (and logged by the adapters).
const MaxDevices = 32
