package v1

import (
	"slices"

	"k8s.io/apimachinery/pkg/runtime"
)

func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

// DeepCopyObject implements runtime.Object.
func (in *GPUFitArgs) DeepCopyObject() runtime.Object {
	if in == nil {
		return nil
	}
	out := &GPUFitArgs{TypeMeta: in.TypeMeta, GPUResourceNames: slices.Clone(in.GPUResourceNames),
		GPUProductLabel: clonePtr(in.GPUProductLabel), GPUMemoryLabel: clonePtr(in.GPUMemoryLabel), AssignmentWrite: clonePtr(in.AssignmentWrite)}
	out.AccountingOnlySharing = clonePtr(in.AccountingOnlySharing)
	out.VolatileNodeLabels = slices.Clone(in.VolatileNodeLabels)
	if h := in.HAMi; h != nil {
		out.HAMi = &HAMiArgs{Enabled: clonePtr(h.Enabled), NodeLockExpirySeconds: clonePtr(h.NodeLockExpirySeconds), LockWaitSeconds: clonePtr(h.LockWaitSeconds)}
	}
	if d := in.DRA; d != nil {
		out.DRA = &DRAArgs{Enabled: clonePtr(d.Enabled), Drivers: slices.Clone(d.Drivers)}
	}
	if r := in.Requeue; r != nil {
		out.Requeue = &RequeueArgs{Enabled: clonePtr(r.Enabled), Workers: clonePtr(r.Workers),
			ResyncPeriodSeconds: clonePtr(r.ResyncPeriodSeconds), BackoffBaseMilliseconds: clonePtr(r.BackoffBaseMilliseconds),
			BackoffMaxSeconds: clonePtr(r.BackoffMaxSeconds), QueueingHints: clonePtr(r.QueueingHints), ExplainPending: clonePtr(r.ExplainPending),
			ExplainMinIntervalSeconds: clonePtr(r.ExplainMinIntervalSeconds), ExplainQPS: clonePtr(r.ExplainQPS), ExplainBurst: clonePtr(r.ExplainBurst)}
	}
	return out
}

// DeepCopyObject implements runtime.Object.
func (in *GPUScoreArgs) DeepCopyObject() runtime.Object {
	if in == nil {
		return nil
	}
	out := &GPUScoreArgs{TypeMeta: in.TypeMeta, Policy: clonePtr(in.Policy)}
	if sc := in.Scoring; sc != nil {
		out.Scoring = &ScoringOptions{Resolution: clonePtr(sc.Resolution), LeastIdleTieBreak: clonePtr(sc.LeastIdleTieBreak),
			NodePriorityTieBreak: clonePtr(sc.NodePriorityTieBreak), MemoryAware: clonePtr(sc.MemoryAware),
			CPUOnlyLeastIdleTieBreak: clonePtr(sc.CPUOnlyLeastIdleTieBreak), StrandedGPUWeightPercent: clonePtr(sc.StrandedGPUWeightPercent),
			ModelScarcityWeightPercent: clonePtr(sc.ModelScarcityWeightPercent)}
	}
	if w := in.TargetWorkload; w != nil {
		out.TargetWorkload = &TargetWorkload{Mode: clonePtr(w.Mode), CoveragePercent: clonePtr(w.CoveragePercent), HalfLifePods: clonePtr(w.HalfLifePods),
			PublishTo: clonePtr(w.PublishTo)}
		for _, t := range w.Tasks {
			t.Models = slices.Clone(t.Models)
			out.TargetWorkload.Tasks = append(out.TargetWorkload.Tasks, t)
		}
	}
	return out
}

// DeepCopyObject implements runtime.Object.
func (in *GPUPreemptionArgs) DeepCopyObject() runtime.Object {
	if in == nil {
		return nil
	}
	return &GPUPreemptionArgs{TypeMeta: in.TypeMeta, MinCandidateNodesPercentage: clonePtr(in.MinCandidateNodesPercentage), MinCandidateNodesAbsolute: clonePtr(in.MinCandidateNodesAbsolute)}
}

// DeepCopyObject implements runtime.Object.
func (in *LeastRequestedArgs) DeepCopyObject() runtime.Object {
	if in == nil {
		return nil
	}
	return &LeastRequestedArgs{TypeMeta: in.TypeMeta, Resources: slices.Clone(in.Resources)}
}
