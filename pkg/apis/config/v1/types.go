// Package v1 holds the versioned args of our plugins, in
// kubescheduler.config.k8s.io/v1 next to the scheduler's own. Each kind is
// named <PluginName>Args, which is how the scheduler finds it.
package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// GPUFitArgs configures GPUFit.
type GPUFitArgs struct {
	metav1.TypeMeta `json:",inline"`

	// GPUResourceNames are the extended resources that count as whole GPUs.
	// Default: [nvidia.com/gpu].
	GPUResourceNames []string `json:"gpuResourceNames,omitempty"`
	// GPUProductLabel is the node label with the GPU model.
	// Default: nvidia.com/gpu.product.
	GPUProductLabel *string `json:"gpuProductLabel,omitempty"`
	// GPUMemoryLabel is the node label with MiB per GPU.
	// Default: nvidia.com/gpu.memory.
	GPUMemoryLabel *string `json:"gpuMemoryLabel,omitempty"`
	// VolatileNodeLabels are node labels the scheduler never reads and that
	// change all the time: they are dropped from the scheduler's view of
	// the nodes, so that rewriting them wakes no pending pod. Default:
	// [nvidia.com/gfd.timestamp] (GPU Feature Discovery rewrites it on every
	// node once a minute); [] keeps every label.
	VolatileNodeLabels []string `json:"volatileNodeLabels,omitempty"`
	// Requeue configures the requeue reconciler.
	Requeue *RequeueArgs `json:"requeue,omitempty"`
	// AssignmentWrite is where the assignment annotation is written. Bind:
	// GPUFit binds GPU pods itself and the binding carries the annotation,
	// so the devices and spec.nodeName land in one write (put GPUFit before
	// DefaultBinder in the bind extension point). PreBind: a patch before
	// the default binder binds (three writes per pod with the nominated
	// node name). Default: Bind.
	AssignmentWrite *string `json:"assignmentWrite,omitempty"`
	// AccountingOnlySharing places GPU shares on nodes where nothing
	// delivers them: a share requested by annotation alone (no
	// nvidia.com/gpu) is then accounted but not enforced, and nodes without
	// HAMi's device plugin take shares too. For a device plugin of your own
	// that reads the assignment, and for simulation. Default: false.
	AccountingOnlySharing *bool `json:"accountingOnlySharing,omitempty"`
	// HAMi configures nodes that run HAMi's device plugin.
	HAMi *HAMiArgs `json:"hami,omitempty"`
	// DRA configures GPUs that DRA drivers publish.
	DRA *DRAArgs `json:"dra,omitempty"`
}

// DRAArgs configures GPUs published through Dynamic Resource Allocation.
type DRAArgs struct {
	// Enabled reads the GPUs that the drivers publish in ResourceSlices,
	// and the allocated ResourceClaims on them, whoever allocated them: a
	// node with such GPUs takes its inventory from there. Default: true.
	Enabled *bool `json:"enabled,omitempty"`
	// Drivers are the DRA drivers whose devices are GPUs, and how each
	// describes them. Default: NVIDIA's (gpu.nvidia.com) and HAMi's
	// (hami-core-gpu.project-hami.io).
	Drivers []DRADriver `json:"drivers,omitempty"`
}

// DRADriver says how one DRA driver describes a GPU. Attribute and capacity
// names may be given with or without the driver's domain.
type DRADriver struct {
	// Name is the driver (ResourceSlice spec.driver).
	Name string `json:"name"`
	// TypeAttribute, if set, must equal GPUType on a whole GPU; a device
	// of another type with a ParentAttribute is a partition of its GPU
	// (MIG); other devices are not GPUs.
	TypeAttribute string `json:"typeAttribute,omitempty"`
	GPUType       string `json:"gpuType,omitempty"`
	// UUIDAttribute identifies the GPU; ParentAttribute names a
	// partition's GPU.
	UUIDAttribute   string `json:"uuidAttribute,omitempty"`
	ParentAttribute string `json:"parentAttribute,omitempty"`
	// ProductAttribute is the model (as GFD's nvidia.com/gpu.product).
	ProductAttribute string `json:"productAttribute,omitempty"`
	// MemoryCapacity is the device memory in bytes; CoresCapacity, for a
	// driver that shares by compute, the cores in percent.
	MemoryCapacity string `json:"memoryCapacity,omitempty"`
	CoresCapacity  string `json:"coresCapacity,omitempty"`
}

// HAMiArgs configures how nodes that run HAMi's device plugin are served.
type HAMiArgs struct {
	// Enabled reads HAMi's device registration on the nodes that carry it
	// and speaks its device-plugin protocol there. Default: true.
	Enabled *bool `json:"enabled,omitempty"`
	// NodeLockExpirySeconds is when a node lock is stale and may be taken
	// over; keep it equal to HAMi's HAMI_NODELOCK_EXPIRE. Default: 300.
	NodeLockExpirySeconds *int32 `json:"nodeLockExpirySeconds,omitempty"`
	// LockWaitSeconds is how long a bind waits for another pod's node lock
	// before the pod goes back to the queue. Default: 30.
	LockWaitSeconds *int32 `json:"lockWaitSeconds,omitempty"`
}

// RequeueArgs configures the reconcile-style requeue of unschedulable pods.
type RequeueArgs struct {
	// Enabled starts the reconciler. Default: true.
	Enabled *bool `json:"enabled,omitempty"`
	// Workers reconciling in parallel. Default: 2.
	Workers *int32 `json:"workers,omitempty"`
	// ResyncPeriodSeconds re-enqueues every unschedulable pod. Default: 30.
	ResyncPeriodSeconds *int32 `json:"resyncPeriodSeconds,omitempty"`
	// BackoffBaseMilliseconds is the first retry delay of a failed
	// reconcile, doubled each time. Default: 5.
	BackoffBaseMilliseconds *int32 `json:"backoffBaseMilliseconds,omitempty"`
	// BackoffMaxSeconds caps the retry delay. Default: 1000.
	BackoffMaxSeconds *int32 `json:"backoffMaxSeconds,omitempty"`
	// QueueingHints enables the level-based queueing hints. Default: true.
	QueueingHints *bool `json:"queueingHints,omitempty"`
	// ExplainPending keeps a current reason on pending GPU pods. Default: true.
	ExplainPending *bool `json:"explainPending,omitempty"`
	// ExplainMinIntervalSeconds is the least time between two rewrites of a
	// pod's reason: a busy cluster changes the closest device often, and
	// every pending pod would be rewritten each time. The reason converges to
	// the current one when the interval ends. Default: 5.
	ExplainMinIntervalSeconds *int32 `json:"explainMinIntervalSeconds,omitempty"`
	// ExplainQPS and ExplainBurst rate-limit the reason writes, on a client
	// of their own: at tens of thousands of pending pods they must never
	// delay a bind, which goes through the scheduler's client. Defaults: 5
	// and 10.
	ExplainQPS   *int32 `json:"explainQPS,omitempty"`
	ExplainBurst *int32 `json:"explainBurst,omitempty"`
}

// GPUScoreArgs configures GPUScore.
type GPUScoreArgs struct {
	metav1.TypeMeta `json:",inline"`

	// Policy is Fragmentation, BestFit, Packing or Spread.
	// Default: Fragmentation.
	Policy *string `json:"policy,omitempty"`
	// TargetWorkload is what fragmentation is measured against.
	TargetWorkload *TargetWorkload `json:"targetWorkload,omitempty"`
	// Scoring refines the ranking. The defaults are what the trace replay
	// measured best; the alternatives exist for ablation.
	Scoring *ScoringOptions `json:"scoring,omitempty"`
}

// ScoringOptions refine how GPUScore ranks nodes.
type ScoringOptions struct {
	// Resolution of Fragmentation: Bucketed ranks nodes by FGD's integer
	// score ⌊100·σ(−ΔF/1000)⌋, so nodes within about 40 milli-GPU tie and
	// the tie-breaks decide; Exact ranks by the fragmentation growth itself.
	// Default: Bucketed.
	Resolution *string `json:"resolution,omitempty"`
	// LeastIdleTieBreak prefers, among equal nodes, the one left with the
	// least idle GPU. Default: false.
	LeastIdleTieBreak *bool `json:"leastIdleTieBreak,omitempty"`
	// NodePriorityTieBreak breaks the remaining ties by a stable per-node
	// order (a hash of the name), so equivalent placements concentrate.
	// Default: true.
	NodePriorityTieBreak *bool `json:"nodePriorityTieBreak,omitempty"`
	// CPUOnlyLeastIdleTieBreak sends a CPU-only pod, among equal GPU nodes,
	// to the one with the least idle GPU (before the node order): CPU next
	// to GPUs already taken is CPU no GPU pod will need. Fragmentation only;
	// the other policies rank CPU-only pods by idle GPU anyway.
	// Default: true.
	CPUOnlyLeastIdleTieBreak *bool `json:"cpuOnlyLeastIdleTieBreak,omitempty"`
	// MemoryAware counts a typical pod as fitting a node only if its memory
	// fits too. Default: true.
	MemoryAware *bool `json:"memoryAware,omitempty"`
	// StrandedGPUWeightPercent counts, in a GPU pod's fragmentation growth
	// under Fragmentation, this percentage of the growth of the node's
	// stranded GPU: idle GPU that the CPU and memory left on the node
	// cannot serve at the target workload's CPU and memory per GPU (its
	// tasks that the node's model can run). A CPU-heavy pod is then kept
	// off nodes already short of CPU for their GPUs, and a CPU-light one
	// sent there. 0 turns it off; at most 1000. Default: 100.
	StrandedGPUWeightPercent *int32 `json:"strandedGPUWeightPercent,omitempty"`
	// ModelScarcityWeightPercent counts, in a GPU pod's fragmentation
	// growth under Fragmentation, this percentage of the GPU it takes times
	// how much more loaded the node's GPU model is than the least loaded
	// model the pod allows. A model's load is the target workload's GPU
	// demand on it, each task's spread over the cluster's GPUs of the
	// models it allows, relative to the load were every task free to use
	// any model. Pods that accept many models then keep off the models
	// that pods restricted to few of them need. Nothing changes while no
	// task of the target restricts its model. 0 turns it off; at most
	// 1000. Default: 100.
	ModelScarcityWeightPercent *int32 `json:"modelScarcityWeightPercent,omitempty"`
}

// TargetWorkload is learned from the pods seen, or given.
type TargetWorkload struct {
	// Mode is Learned or Static. Default: Learned.
	Mode *string `json:"mode,omitempty"`
	// CoveragePercent keeps the most common tasks covering this share of the
	// pods seen. Default: 95.
	CoveragePercent *int32 `json:"coveragePercent,omitempty"`
	// HalfLifePods halves the weight of older observations every so many
	// pods; 0 never forgets. Default: 10000.
	HalfLifePods *int32 `json:"halfLifePods,omitempty"`
	// Tasks is the workload in Static mode.
	Tasks []WorkloadTask `json:"tasks,omitempty"`
	// PublishTo is the lease, "namespace/name" (the scheduler's own
	// leader-election lease), on which the leader publishes the learned
	// target (annotation gpu-scheduler.io/target-workload) for kubectl gpu
	// to read as the scheduler holds it. Learned mode only; unset publishes
	// nothing.
	PublishTo *string `json:"publishTo,omitempty"`
}

// WorkloadTask is one typical pod and its relative frequency.
type WorkloadTask struct {
	CPUMilli int64 `json:"cpuMilli"`
	// MemoryMiB is the task's memory; 0 leaves memory out of its fit.
	MemoryMiB int64    `json:"memoryMiB,omitempty"`
	GPUMilli  int32    `json:"gpuMilli"`
	GPUCount  int32    `json:"gpuCount"`
	Models    []string `json:"models,omitempty"`
	Weight    int64    `json:"weight"`
}

// LeastRequestedArgs configures LeastRequested.
type LeastRequestedArgs struct {
	metav1.TypeMeta `json:",inline"`

	// Resources and their weights. Default: cpu and memory, weight 1.
	Resources []ResourceWeight `json:"resources,omitempty"`
}

// GPUPreemptionArgs configures GPUPreemption.
type GPUPreemptionArgs struct {
	metav1.TypeMeta `json:",inline"`

	// MinCandidateNodesPercentage is the least share of nodes dry-run for
	// preemption, in percent. Default 10, as DefaultPreemption.
	MinCandidateNodesPercentage *int32 `json:"minCandidateNodesPercentage,omitempty"`
	// MinCandidateNodesAbsolute is the least number of nodes dry-run.
	// Default 100, as DefaultPreemption.
	MinCandidateNodesAbsolute *int32 `json:"minCandidateNodesAbsolute,omitempty"`
}

// ResourceWeight is a resource name and its weight.
type ResourceWeight struct {
	Name   string `json:"name"`
	Weight int64  `json:"weight"`
}
