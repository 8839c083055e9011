package v1

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/agent/dra"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
)

// Defaults allocate fresh values each time: shared pointers or slices would
// let one profile's args change another's.

// SetDefaults_GPUFitArgs fills GPUFitArgs.
func SetDefaults_GPUFitArgs(obj *GPUFitArgs) {
	if obj.VolatileNodeLabels == nil {
		obj.VolatileNodeLabels = []string{LabelGFDTimestamp}
	}
	if len(obj.GPUResourceNames) == 0 {
		obj.GPUResourceNames = []string{gpu.ResourceNvidiaGPU}
	}
	if obj.GPUProductLabel == nil {
		obj.GPUProductLabel = ptr.To(gpu.LabelGPUProduct)
	}
	if obj.GPUMemoryLabel == nil {
		obj.GPUMemoryLabel = ptr.To(gpu.LabelGPUMemory)
	}
	if obj.AssignmentWrite == nil {
		obj.AssignmentWrite = ptr.To("Bind")
	}
	if obj.AccountingOnlySharing == nil {
		obj.AccountingOnlySharing = ptr.To(false)
	}
	if obj.HAMi == nil {
		obj.HAMi = &HAMiArgs{}
	}
	if obj.HAMi.Enabled == nil {
		obj.HAMi.Enabled = ptr.To(true)
	}
	if obj.HAMi.NodeLockExpirySeconds == nil {
		obj.HAMi.NodeLockExpirySeconds = ptr.To[int32](300)
	}
	if obj.HAMi.LockWaitSeconds == nil {
		obj.HAMi.LockWaitSeconds = ptr.To[int32](30)
	}
	if obj.DRA == nil {
		obj.DRA = &DRAArgs{}
	}
	if obj.DRA.Enabled == nil {
		obj.DRA.Enabled = ptr.To(true)
	}
	if obj.DRA.Drivers == nil {
		for _, d := range dra.DefaultDrivers {
			obj.DRA.Drivers = append(obj.DRA.Drivers, DRADriver(d))
		}
	}
	if obj.Requeue == nil {
		obj.Requeue = &RequeueArgs{}
	}
	r := obj.Requeue
	if r.Enabled == nil {
		r.Enabled = ptr.To(true)
	}
	if r.Workers == nil {
		r.Workers = ptr.To[int32](2)
	}
	if r.ResyncPeriodSeconds == nil {
		r.ResyncPeriodSeconds = ptr.To[int32](30)
	}
	if r.BackoffBaseMilliseconds == nil {
		r.BackoffBaseMilliseconds = ptr.To[int32](5)
	}
	if r.BackoffMaxSeconds == nil {
		r.BackoffMaxSeconds = ptr.To[int32](1000)
	}
	if r.QueueingHints == nil {
		r.QueueingHints = ptr.To(true)
	}
	if r.ExplainPending == nil {
		r.ExplainPending = ptr.To(true)
	}
	if r.ExplainMinIntervalSeconds == nil {
		r.ExplainMinIntervalSeconds = ptr.To[int32](5)
	}
	if r.ExplainQPS == nil {
		r.ExplainQPS = ptr.To[int32](5)
	}
	if r.ExplainBurst == nil {
		r.ExplainBurst = ptr.To[int32](10)
	}
}

// SetDefaults_GPUScoreArgs fills GPUScoreArgs.
func SetDefaults_GPUScoreArgs(obj *GPUScoreArgs) {
	if obj.Policy == nil {
		obj.Policy = ptr.To(string(gpu.Fragmentation))
	}
	if obj.TargetWorkload == nil {
		obj.TargetWorkload = &TargetWorkload{}
	}
	w := obj.TargetWorkload
	if w.Mode == nil {
		w.Mode = ptr.To("Learned")
	}
	if w.CoveragePercent == nil {
		w.CoveragePercent = ptr.To[int32](95)
	}
	if w.HalfLifePods == nil {
		w.HalfLifePods = ptr.To[int32](10000)
	}
	if obj.Scoring == nil {
		obj.Scoring = &ScoringOptions{}
	}
	sc := obj.Scoring
	if sc.Resolution == nil {
		sc.Resolution = ptr.To("Bucketed")
	}
	if sc.LeastIdleTieBreak == nil {
		sc.LeastIdleTieBreak = ptr.To(false)
	}
	if sc.NodePriorityTieBreak == nil {
		sc.NodePriorityTieBreak = ptr.To(true)
	}
	if sc.MemoryAware == nil {
		sc.MemoryAware = ptr.To(true)
	}
	if sc.CPUOnlyLeastIdleTieBreak == nil {
		sc.CPUOnlyLeastIdleTieBreak = ptr.To(true)
	}
	if sc.StrandedGPUWeightPercent == nil {
		sc.StrandedGPUWeightPercent = ptr.To[int32](100)
	}
	if sc.ModelScarcityWeightPercent == nil {
		sc.ModelScarcityWeightPercent = ptr.To[int32](100)
	}
}

// SetDefaults_GPUPreemptionArgs fills GPUPreemptionArgs with
// DefaultPreemption's defaults.
func SetDefaults_GPUPreemptionArgs(obj *GPUPreemptionArgs) {
	if obj.MinCandidateNodesPercentage == nil {
		obj.MinCandidateNodesPercentage = ptr.To[int32](10)
	}
	if obj.MinCandidateNodesAbsolute == nil {
		obj.MinCandidateNodesAbsolute = ptr.To[int32](100)
	}
}

// SetDefaults_LeastRequestedArgs fills LeastRequestedArgs.
func SetDefaults_LeastRequestedArgs(obj *LeastRequestedArgs) {
	if len(obj.Resources) == 0 {
		obj.Resources = []ResourceWeight{{Name: string(v1.ResourceCPU), Weight: 1}, {Name: string(v1.ResourceMemory), Weight: 1}}
	}
}

// LabelGFDTimestamp is the label GPU Feature Discovery rewrites on every
// node at each pass (once a minute by default).
const LabelGFDTimestamp = "nvidia.com/gfd.timestamp"
