package v1

import (
	"slices"

	"k8s.io/apimachinery/pkg/conversion"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/agent/dra"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config"
)

func addConversionFuncs(s *runtime.Scheme) error {
	if err := s.AddConversionFunc((*GPUFitArgs)(nil), (*config.GPUFitArgs)(nil), func(a, b interface{}, _ conversion.Scope) error {
		Convert_v1_GPUFitArgs_To_config_GPUFitArgs(a.(*GPUFitArgs), b.(*config.GPUFitArgs))
		return nil
	}); err != nil {
		return err
	}
	if err := s.AddConversionFunc((*config.GPUFitArgs)(nil), (*GPUFitArgs)(nil), func(a, b interface{}, _ conversion.Scope) error {
		Convert_config_GPUFitArgs_To_v1_GPUFitArgs(a.(*config.GPUFitArgs), b.(*GPUFitArgs))
		return nil
	}); err != nil {
		return err
	}
	if err := s.AddConversionFunc((*GPUScoreArgs)(nil), (*config.GPUScoreArgs)(nil), func(a, b interface{}, _ conversion.Scope) error {
		Convert_v1_GPUScoreArgs_To_config_GPUScoreArgs(a.(*GPUScoreArgs), b.(*config.GPUScoreArgs))
		return nil
	}); err != nil {
		return err
	}
	if err := s.AddConversionFunc((*config.GPUScoreArgs)(nil), (*GPUScoreArgs)(nil), func(a, b interface{}, _ conversion.Scope) error {
		Convert_config_GPUScoreArgs_To_v1_GPUScoreArgs(a.(*config.GPUScoreArgs), b.(*GPUScoreArgs))
		return nil
	}); err != nil {
		return err
	}
	if err := s.AddConversionFunc((*GPUPreemptionArgs)(nil), (*config.GPUPreemptionArgs)(nil), func(a, b interface{}, _ conversion.Scope) error {
		Convert_v1_GPUPreemptionArgs_To_config_GPUPreemptionArgs(a.(*GPUPreemptionArgs), b.(*config.GPUPreemptionArgs))
		return nil
	}); err != nil {
		return err
	}
	if err := s.AddConversionFunc((*config.GPUPreemptionArgs)(nil), (*GPUPreemptionArgs)(nil), func(a, b interface{}, _ conversion.Scope) error {
		in, out := a.(*config.GPUPreemptionArgs), b.(*GPUPreemptionArgs)
		out.MinCandidateNodesPercentage = ptr.To(in.MinCandidateNodesPercentage)
		out.MinCandidateNodesAbsolute = ptr.To(in.MinCandidateNodesAbsolute)
		return nil
	}); err != nil {
		return err
	}
	if err := s.AddConversionFunc((*LeastRequestedArgs)(nil), (*config.LeastRequestedArgs)(nil), func(a, b interface{}, _ conversion.Scope) error {
		in, out := a.(*LeastRequestedArgs), b.(*config.LeastRequestedArgs)
		out.Resources = nil
		for _, r := range in.Resources {
			out.Resources = append(out.Resources, config.ResourceWeight{Name: r.Name, Weight: r.Weight})
		}
		return nil
	}); err != nil {
		return err
	}
	return s.AddConversionFunc((*config.LeastRequestedArgs)(nil), (*LeastRequestedArgs)(nil), func(a, b interface{}, _ conversion.Scope) error {
		in, out := a.(*config.LeastRequestedArgs), b.(*LeastRequestedArgs)
		out.Resources = nil
		for _, r := range in.Resources {
			out.Resources = append(out.Resources, ResourceWeight{Name: r.Name, Weight: r.Weight})
		}
		return nil
	})
}

// Convert_v1_GPUPreemptionArgs_To_config_GPUPreemptionArgs converts
// defaulted v1 args.
func Convert_v1_GPUPreemptionArgs_To_config_GPUPreemptionArgs(in *GPUPreemptionArgs, out *config.GPUPreemptionArgs) {
	out.MinCandidateNodesPercentage = ptr.Deref(in.MinCandidateNodesPercentage, 0)
	out.MinCandidateNodesAbsolute = ptr.Deref(in.MinCandidateNodesAbsolute, 0)
}

// Convert_v1_GPUFitArgs_To_config_GPUFitArgs converts defaulted v1 args.
func Convert_v1_GPUFitArgs_To_config_GPUFitArgs(in *GPUFitArgs, out *config.GPUFitArgs) {
	out.GPUResourceNames = slices.Clone(in.GPUResourceNames)
	out.VolatileNodeLabels = slices.Clone(in.VolatileNodeLabels)
	out.GPUProductLabel = ptr.Deref(in.GPUProductLabel, "")
	out.GPUMemoryLabel = ptr.Deref(in.GPUMemoryLabel, "")
	out.AssignmentWrite = ptr.Deref(in.AssignmentWrite, "")
	out.AccountingOnlySharing = ptr.Deref(in.AccountingOnlySharing, false)
	out.HAMi = config.HAMiArgs{}
	if h := in.HAMi; h != nil {
		out.HAMi = config.HAMiArgs{Enabled: ptr.Deref(h.Enabled, false), NodeLockExpirySeconds: ptr.Deref(h.NodeLockExpirySeconds, 0),
			LockWaitSeconds: ptr.Deref(h.LockWaitSeconds, 0)}
	}
	out.DRA = config.DRAArgs{}
	if d := in.DRA; d != nil {
		out.DRA.Enabled = ptr.Deref(d.Enabled, false)
		for _, v := range d.Drivers {
			out.DRA.Drivers = append(out.DRA.Drivers, dra.Driver(v))
		}
	}
	out.Requeue = config.RequeueArgs{}
	if r := in.Requeue; r != nil {
		out.Requeue = config.RequeueArgs{
			Enabled:                   ptr.Deref(r.Enabled, false),
			Workers:                   ptr.Deref(r.Workers, 0),
			ResyncPeriodSeconds:       ptr.Deref(r.ResyncPeriodSeconds, 0),
			BackoffBaseMilliseconds:   ptr.Deref(r.BackoffBaseMilliseconds, 0),
			BackoffMaxSeconds:         ptr.Deref(r.BackoffMaxSeconds, 0),
			QueueingHints:             ptr.Deref(r.QueueingHints, false),
			ExplainPending:            ptr.Deref(r.ExplainPending, false),
			ExplainMinIntervalSeconds: ptr.Deref(r.ExplainMinIntervalSeconds, 0),
			ExplainQPS:                ptr.Deref(r.ExplainQPS, 0),
			ExplainBurst:              ptr.Deref(r.ExplainBurst, 0),
		}
	}
}

// Convert_config_GPUFitArgs_To_v1_GPUFitArgs converts internal args back.
func Convert_config_GPUFitArgs_To_v1_GPUFitArgs(in *config.GPUFitArgs, out *GPUFitArgs) {
	out.GPUResourceNames = slices.Clone(in.GPUResourceNames)
	out.VolatileNodeLabels = slices.Clone(in.VolatileNodeLabels)
	if out.VolatileNodeLabels == nil {
		out.VolatileNodeLabels = []string{} // none, explicitly: defaulting must not add GFD's
	}
	out.GPUProductLabel = ptr.To(in.GPUProductLabel)
	out.GPUMemoryLabel = ptr.To(in.GPUMemoryLabel)
	out.AssignmentWrite = ptr.To(in.AssignmentWrite)
	out.AccountingOnlySharing = ptr.To(in.AccountingOnlySharing)
	out.HAMi = &HAMiArgs{Enabled: ptr.To(in.HAMi.Enabled), NodeLockExpirySeconds: ptr.To(in.HAMi.NodeLockExpirySeconds), LockWaitSeconds: ptr.To(in.HAMi.LockWaitSeconds)}
	out.DRA = &DRAArgs{Enabled: ptr.To(in.DRA.Enabled), Drivers: []DRADriver{}}
	for _, d := range in.DRA.Drivers {
		out.DRA.Drivers = append(out.DRA.Drivers, DRADriver(d))
	}
	r := in.Requeue
	out.Requeue = &RequeueArgs{
		Enabled:                   ptr.To(r.Enabled),
		Workers:                   ptr.To(r.Workers),
		ResyncPeriodSeconds:       ptr.To(r.ResyncPeriodSeconds),
		BackoffBaseMilliseconds:   ptr.To(r.BackoffBaseMilliseconds),
		BackoffMaxSeconds:         ptr.To(r.BackoffMaxSeconds),
		QueueingHints:             ptr.To(r.QueueingHints),
		ExplainPending:            ptr.To(r.ExplainPending),
		ExplainMinIntervalSeconds: ptr.To(r.ExplainMinIntervalSeconds),
		ExplainQPS:                ptr.To(r.ExplainQPS),
		ExplainBurst:              ptr.To(r.ExplainBurst),
	}
}

// Convert_v1_GPUScoreArgs_To_config_GPUScoreArgs converts defaulted v1 args.
func Convert_v1_GPUScoreArgs_To_config_GPUScoreArgs(in *GPUScoreArgs, out *config.GPUScoreArgs) {
	out.Policy = ptr.Deref(in.Policy, "")
	out.Scoring = config.ScoringOptions{}
	if sc := in.Scoring; sc != nil {
		out.Scoring = config.ScoringOptions{
			Resolution:                 ptr.Deref(sc.Resolution, ""),
			LeastIdleTieBreak:          ptr.Deref(sc.LeastIdleTieBreak, false),
			NodePriorityTieBreak:       ptr.Deref(sc.NodePriorityTieBreak, false),
			MemoryAware:                ptr.Deref(sc.MemoryAware, false),
			CPUOnlyLeastIdleTieBreak:   ptr.Deref(sc.CPUOnlyLeastIdleTieBreak, false),
			StrandedGPUWeightPercent:   ptr.Deref(sc.StrandedGPUWeightPercent, 0),
			ModelScarcityWeightPercent: ptr.Deref(sc.ModelScarcityWeightPercent, 0),
		}
	}
	out.TargetWorkload = config.TargetWorkload{}
	if w := in.TargetWorkload; w != nil {
		out.TargetWorkload.Mode = ptr.Deref(w.Mode, "")
		out.TargetWorkload.CoveragePercent = ptr.Deref(w.CoveragePercent, 0)
		out.TargetWorkload.HalfLifePods = ptr.Deref(w.HalfLifePods, 0)
		out.TargetWorkload.PublishTo = ptr.Deref(w.PublishTo, "")
		for _, t := range w.Tasks {
			out.TargetWorkload.Tasks = append(out.TargetWorkload.Tasks, config.WorkloadTask{
				CPUMilli: t.CPUMilli, MemoryMiB: t.MemoryMiB, GPUMilli: t.GPUMilli, GPUCount: t.GPUCount, Models: slices.Clone(t.Models), Weight: t.Weight})
		}
	}
}

// Convert_config_GPUScoreArgs_To_v1_GPUScoreArgs converts internal args back.
func Convert_config_GPUScoreArgs_To_v1_GPUScoreArgs(in *config.GPUScoreArgs, out *GPUScoreArgs) {
	out.Policy = ptr.To(in.Policy)
	out.Scoring = &ScoringOptions{
		Resolution:                 ptr.To(in.Scoring.Resolution),
		LeastIdleTieBreak:          ptr.To(in.Scoring.LeastIdleTieBreak),
		NodePriorityTieBreak:       ptr.To(in.Scoring.NodePriorityTieBreak),
		MemoryAware:                ptr.To(in.Scoring.MemoryAware),
		CPUOnlyLeastIdleTieBreak:   ptr.To(in.Scoring.CPUOnlyLeastIdleTieBreak),
		StrandedGPUWeightPercent:   ptr.To(in.Scoring.StrandedGPUWeightPercent),
		ModelScarcityWeightPercent: ptr.To(in.Scoring.ModelScarcityWeightPercent),
	}
	w := in.TargetWorkload
	out.TargetWorkload = &TargetWorkload{
		Mode:            ptr.To(w.Mode),
		CoveragePercent: ptr.To(w.CoveragePercent),
		HalfLifePods:    ptr.To(w.HalfLifePods),
	}
	if w.PublishTo != "" {
		out.TargetWorkload.PublishTo = ptr.To(w.PublishTo)
	}
	for _, t := range w.Tasks {
		out.TargetWorkload.Tasks = append(out.TargetWorkload.Tasks, WorkloadTask{
			CPUMilli: t.CPUMilli, MemoryMiB: t.MemoryMiB, GPUMilli: t.GPUMilli, GPUCount: t.GPUCount, Models: slices.Clone(t.Models), Weight: t.Weight})
	}
}
