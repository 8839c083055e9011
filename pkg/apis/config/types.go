// Package config holds the internal types of our plugins' args. The
// versioned types users write live in ./v1; defaults are applied there and
// validation happens in ./validation, called from each plugin's New.
package config

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/agent/dra"
)

// GPUFitArgs configures GPUFit: where devices and requests are read from, and
// the requeue reconciler.
type GPUFitArgs struct {
	metav1.TypeMeta

	// GPUResourceNames are the extended resources that count as whole GPUs.
	GPUResourceNames []string
	// GPUProductLabel is the node label holding the GPU model.
	GPUProductLabel string
	// VolatileNodeLabels are dropped from the scheduler's view of nodes.
	VolatileNodeLabels []string
	// GPUMemoryLabel is the node label holding MiB per GPU.
	GPUMemoryLabel string
	// Requeue configures the requeue reconciler.
	Requeue RequeueArgs
	// AssignmentWrite is where the assignment annotation is written: Bind
	// (with the binding, one write) or PreBind (a patch before binding).
	AssignmentWrite string
	// AccountingOnlySharing places shares where nothing delivers them
	// (accounted, not enforced).
	AccountingOnlySharing bool
	// HAMi configures the HAMi device-plugin protocol.
	HAMi HAMiArgs
	// DRA configures GPUs published through DRA.
	DRA DRAArgs
}

// DRAArgs configures GPUs published through Dynamic Resource Allocation.
type DRAArgs struct {
	// Enabled reads the drivers' ResourceSlices and the allocated claims.
	Enabled bool
	Drivers []dra.Driver
}

// HAMiArgs configures how nodes that run HAMi's device plugin are served.
type HAMiArgs struct {
	// Enabled reads HAMi's device registration on nodes that carry it.
	Enabled bool
	// NodeLockExpirySeconds is when a node lock is stale (HAMi's
	// HAMI_NODELOCK_EXPIRE).
	NodeLockExpirySeconds int32
	// LockWaitSeconds is how long a bind waits for a node's lock.
	LockWaitSeconds int32
}

// AssignmentWrite values.
const (
	WriteAtBind    = "Bind"
	WriteAtPreBind = "PreBind"
)

// RequeueArgs configures the reconcile-style requeue of unschedulable pods.
type RequeueArgs struct {
	// Enabled starts the reconciler with the plugin.
	Enabled bool
	// Workers is the number of reconcile workers.
	Workers int32
	// ResyncPeriodSeconds re-enqueues every unschedulable pod this often.
	ResyncPeriodSeconds int32
	// BackoffBaseMilliseconds and BackoffMaxSeconds bound the per-key
	// exponential backoff of failed reconciles.
	BackoffBaseMilliseconds int32
	BackoffMaxSeconds       int32
	// QueueingHints turns the level-based hints on; off, every registered
	// event requeues (for measurement).
	QueueingHints bool
	// ExplainPending keeps a current reason on pending GPU pods.
	ExplainPending bool
	// ExplainMinIntervalSeconds spaces rewrites of one pod's reason.
	ExplainMinIntervalSeconds int32
	// ExplainQPS and ExplainBurst rate-limit the reason writes (their own
	// client).
	ExplainQPS   int32
	ExplainBurst int32
}

// GPUScoreArgs configures GPUScore.
type GPUScoreArgs struct {
	metav1.TypeMeta

	// Policy is Fragmentation, BestFit, Packing or Spread.
	Policy string
	// TargetWorkload is what fragmentation is measured against.
	TargetWorkload TargetWorkload
	// Scoring refines the ranking (ablations; the defaults measured best).
	Scoring ScoringOptions
}

// ScoringOptions refine how GPUScore ranks nodes.
type ScoringOptions struct {
	// Resolution of Fragmentation: Bucketed (FGD's integer score) or Exact.
	Resolution string
	// LeastIdleTieBreak prefers, among equal nodes, the one left with the
	// least idle GPU.
	LeastIdleTieBreak bool
	// NodePriorityTieBreak breaks the remaining ties by a stable per-node
	// order.
	NodePriorityTieBreak bool
	// CPUOnlyLeastIdleTieBreak sends a CPU-only pod, among equal GPU nodes,
	// to the one with the least idle GPU.
	CPUOnlyLeastIdleTieBreak bool
	// MemoryAware counts memory in the fit of typical pods.
	MemoryAware bool
	// ReferenceNodeOrder breaks the last ties as the published simulator
	// does (its renamed nodes, smallest number first). Internal only: the
	// simulator sets it to reproduce published results; no versioned
	// field.
	ReferenceNodeOrder bool
	// ExactDeviceChoice picks a share's device by the exact fragmentation
	// growth (then the tighter device) instead of the first device of the
	// best bucket. Internal only: an ablation of the simulator.
	ExactDeviceChoice bool
	// ReferenceArithmetic computes Fragmentation's score as the published
	// simulator does, float rounding included, against a static workload
	// with TargetWorkload.ReferenceTracePods. Internal only, as
	// ReferenceNodeOrder.
	ReferenceArithmetic bool
	// StrandedGPUWeightPercent adds, to a GPU pod's fragmentation growth,
	// this percentage of the growth of the node's stranded GPU: idle GPU
	// that the CPU and memory left cannot serve at the target's mix.
	StrandedGPUWeightPercent int32
	// ModelScarcityWeightPercent adds, to a GPU pod's fragmentation growth,
	// this percentage of the GPU it takes times how much more the target's
	// model-restricted demand loads the node's model than the least loaded
	// model the pod allows.
	ModelScarcityWeightPercent int32
}

// Resolution values.
const (
	ResolutionBucketed = "Bucketed"
	ResolutionExact    = "Exact"
)

// TargetWorkload is learned from the pods seen, or given.
type TargetWorkload struct {
	// Mode is Learned or Static.
	Mode string
	// CoveragePercent keeps the most common tasks covering this share of pods.
	CoveragePercent int32
	// HalfLifePods halves the weight of older observations every so many
	// pods; 0 never forgets.
	HalfLifePods int32
	// Tasks is the workload for Static mode.
	Tasks []WorkloadTask
	// ReferenceTracePods is how many pods the trace the static tasks were
	// counted from has (Scoring.ReferenceArithmetic). Internal only.
	ReferenceTracePods int64
	// BucketCPU groups learned kinds by a bucket of their CPU request from
	// the first pod, not by the exact request (an ablation of the
	// simulator's: the grouping before exact keys). Internal only.
	BucketCPU bool
	// PublishTo is the lease ("namespace/name", the scheduler's own) on
	// which the leader publishes the learned target, for kubectl gpu; ""
	// publishes nothing.
	PublishTo string
}

// WorkloadTask is one typical pod and its relative frequency.
type WorkloadTask struct {
	CPUMilli int64
	// MemoryMiB is the task's memory; 0 leaves memory out of its fit.
	MemoryMiB int64
	GPUMilli  int32
	GPUCount  int32
	Models    []string
	Weight    int64
}

// LeastRequestedArgs configures LeastRequested.
type LeastRequestedArgs struct {
	metav1.TypeMeta

	// Resources and their weights; cpu and memory with weight 1 by default.
	Resources []ResourceWeight
}

// GPUPreemptionArgs configures GPUPreemption: the upstream DefaultPreemption's
// candidate counts, with device-level victims.
type GPUPreemptionArgs struct {
	metav1.TypeMeta

	// MinCandidateNodesPercentage and MinCandidateNodesAbsolute bound the
	// nodes dry-run for preemption, as in DefaultPreemptionArgs.
	MinCandidateNodesPercentage int32
	MinCandidateNodesAbsolute   int32
}

// ResourceWeight is a resource name and its weight in the score.
type ResourceWeight struct {
	Name   string
	Weight int64
}

// Mode values of TargetWorkload.
const (
	WorkloadLearned = "Learned"
	WorkloadStatic  = "Static"
)
