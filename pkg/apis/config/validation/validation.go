// Package validation checks our plugins' args. The scheduler only validates
// in-tree args when it loads a config, so each plugin calls these in New.
package validation

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	schedvalidation "k8s.io/kubernetes/pkg/scheduler/apis/config/validation"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
)

// ValidateGPUFitArgs validates GPUFitArgs.
func ValidateGPUFitArgs(path *field.Path, args *config.GPUFitArgs) error {
	var errs field.ErrorList
	namesPath := path.Child("gpuResourceNames")
	if len(args.GPUResourceNames) == 0 {
		errs = append(errs, field.Required(namesPath, "at least one GPU resource name, such as nvidia.com/gpu"))
	}
	seen := sets.New[string]()
	for i, n := range args.GPUResourceNames {
		p := namesPath.Index(i)
		if seen.Has(n) {
			errs = append(errs, field.Duplicate(p, n))
		}
		seen.Insert(n)
		if !strings.Contains(n, "/") || strings.Contains(n, "kubernetes.io/") {
			errs = append(errs, field.Invalid(p, n, "must be an extended resource name with a domain, such as nvidia.com/gpu"))
			continue
		}
		for _, msg := range validation.IsQualifiedName(n) {
			errs = append(errs, field.Invalid(p, n, msg))
		}
	}
	for _, l := range []struct {
		name, value string
	}{{"gpuProductLabel", args.GPUProductLabel}, {"gpuMemoryLabel", args.GPUMemoryLabel}} {
		for _, msg := range validation.IsQualifiedName(l.value) {
			errs = append(errs, field.Invalid(path.Child(l.name), l.value, msg))
		}
	}
	for i, l := range args.VolatileNodeLabels {
		p := path.Child("volatileNodeLabels").Index(i)
		for _, msg := range validation.IsQualifiedName(l) {
			errs = append(errs, field.Invalid(p, l, msg))
		}
		if l == args.GPUProductLabel || l == args.GPUMemoryLabel {
			errs = append(errs, field.Invalid(p, l, "the GPU product and memory labels are read: they cannot be volatile"))
		}
	}
	switch args.AssignmentWrite {
	case config.WriteAtBind, config.WriteAtPreBind:
	default:
		errs = append(errs, field.NotSupported(path.Child("assignmentWrite"), args.AssignmentWrite, []string{config.WriteAtBind, config.WriteAtPreBind}))
	}
	hp := path.Child("hami")
	if args.HAMi.NodeLockExpirySeconds < 1 {
		errs = append(errs, field.Invalid(hp.Child("nodeLockExpirySeconds"), args.HAMi.NodeLockExpirySeconds, "must be at least 1"))
	}
	if args.HAMi.LockWaitSeconds < 0 || args.HAMi.LockWaitSeconds > 600 {
		errs = append(errs, field.Invalid(hp.Child("lockWaitSeconds"), args.HAMi.LockWaitSeconds, "must be from 0 to 600"))
	}
	drivers := map[string]bool{}
	for i, d := range args.DRA.Drivers {
		p := path.Child("dra", "drivers").Index(i)
		switch {
		case d.Name == "":
			errs = append(errs, field.Required(p.Child("name"), "the driver's name"))
		case drivers[d.Name]:
			errs = append(errs, field.Duplicate(p.Child("name"), d.Name))
		default:
			for _, msg := range validation.IsDNS1123Subdomain(d.Name) {
				errs = append(errs, field.Invalid(p.Child("name"), d.Name, msg))
			}
		}
		drivers[d.Name] = true
		if d.TypeAttribute != "" && d.GPUType == "" {
			errs = append(errs, field.Required(p.Child("gpuType"), "the value of typeAttribute on a whole GPU"))
		}
		if d.MemoryCapacity == "" {
			errs = append(errs, field.Required(p.Child("memoryCapacity"), "the capacity with the device memory"))
		}
	}
	r := args.Requeue
	rp := path.Child("requeue")
	if r.Workers < 1 || r.Workers > 64 {
		errs = append(errs, field.Invalid(rp.Child("workers"), r.Workers, "must be from 1 to 64"))
	}
	if r.ResyncPeriodSeconds < 1 {
		errs = append(errs, field.Invalid(rp.Child("resyncPeriodSeconds"), r.ResyncPeriodSeconds, "must be at least 1"))
	}
	if r.BackoffBaseMilliseconds < 1 {
		errs = append(errs, field.Invalid(rp.Child("backoffBaseMilliseconds"), r.BackoffBaseMilliseconds, "must be at least 1"))
	}
	if r.BackoffMaxSeconds < 1 {
		errs = append(errs, field.Invalid(rp.Child("backoffMaxSeconds"), r.BackoffMaxSeconds, "must be at least 1"))
	} else if int64(r.BackoffMaxSeconds)*1000 < int64(r.BackoffBaseMilliseconds) {
		errs = append(errs, field.Invalid(rp.Child("backoffMaxSeconds"), r.BackoffMaxSeconds, "must not be shorter than backoffBaseMilliseconds"))
	}
	if r.ExplainMinIntervalSeconds < 0 {
		errs = append(errs, field.Invalid(rp.Child("explainMinIntervalSeconds"), r.ExplainMinIntervalSeconds, "must not be negative"))
	}
	if r.ExplainQPS < 1 || r.ExplainQPS > 1000 {
		errs = append(errs, field.Invalid(rp.Child("explainQPS"), r.ExplainQPS, "must be from 1 to 1000"))
	}
	if r.ExplainBurst < 1 || r.ExplainBurst > 10000 {
		errs = append(errs, field.Invalid(rp.Child("explainBurst"), r.ExplainBurst, "must be from 1 to 10000"))
	}
	return errs.ToAggregate()
}

// maxStrandedGPUWeightPercent bounds the stranded-GPU term: 10 times the
// fragmentation growth is already far past where it stopped helping. The
// model-scarcity term has the same bound.
const maxStrandedGPUWeightPercent = 1000

// ValidateGPUScoreArgs validates GPUScoreArgs.
func ValidateGPUScoreArgs(path *field.Path, args *config.GPUScoreArgs) error {
	var errs field.ErrorList
	if _, err := gpu.ParsePolicy(args.Policy); err != nil {
		errs = append(errs, field.NotSupported(path.Child("policy"), args.Policy, policyNames()))
	}
	switch args.Scoring.Resolution {
	case config.ResolutionBucketed, config.ResolutionExact:
	default:
		errs = append(errs, field.NotSupported(path.Child("scoring", "resolution"), args.Scoring.Resolution,
			[]string{config.ResolutionBucketed, config.ResolutionExact}))
	}
	if p := args.Scoring.StrandedGPUWeightPercent; p < 0 || p > maxStrandedGPUWeightPercent {
		errs = append(errs, field.Invalid(path.Child("scoring", "strandedGPUWeightPercent"), p,
			fmt.Sprintf("must be between 0 and %d", maxStrandedGPUWeightPercent)))
	}
	if p := args.Scoring.ModelScarcityWeightPercent; p < 0 || p > maxStrandedGPUWeightPercent {
		errs = append(errs, field.Invalid(path.Child("scoring", "modelScarcityWeightPercent"), p,
			fmt.Sprintf("must be between 0 and %d", maxStrandedGPUWeightPercent)))
	}
	w := args.TargetWorkload
	wp := path.Child("targetWorkload")
	switch w.Mode {
	case config.WorkloadLearned:
		if len(w.Tasks) > 0 {
			errs = append(errs, field.Forbidden(wp.Child("tasks"), "tasks are only used when mode is Static"))
		}
	case config.WorkloadStatic:
		if len(w.Tasks) == 0 {
			errs = append(errs, field.Required(wp.Child("tasks"), "mode Static needs at least one task"))
		}
		if len(w.Tasks) > gpu.MaxTasks {
			errs = append(errs, field.TooMany(wp.Child("tasks"), len(w.Tasks), gpu.MaxTasks))
		}
	default:
		errs = append(errs, field.NotSupported(wp.Child("mode"), w.Mode, []string{config.WorkloadLearned, config.WorkloadStatic}))
	}
	if w.CoveragePercent < 1 || w.CoveragePercent > 100 {
		errs = append(errs, field.Invalid(wp.Child("coveragePercent"), w.CoveragePercent, "must be from 1 to 100"))
	}
	if w.PublishTo != "" {
		ns, name, ok := strings.Cut(w.PublishTo, "/")
		switch {
		case !ok || len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0:
			errs = append(errs, field.Invalid(wp.Child("publishTo"), w.PublishTo, "must be namespace/name, the scheduler's lease"))
		case w.Mode != config.WorkloadLearned:
			errs = append(errs, field.Forbidden(wp.Child("publishTo"), "only a learned target is published (a static one is in the configuration)"))
		}
	}
	if w.HalfLifePods < 0 {
		errs = append(errs, field.Invalid(wp.Child("halfLifePods"), w.HalfLifePods, "must not be negative (0 never forgets)"))
	}
	for i, t := range w.Tasks {
		tp := wp.Child("tasks").Index(i)
		switch {
		case t.GPUMilli < 0 || t.GPUMilli > gpu.MilliPerGPU:
			errs = append(errs, field.Invalid(tp.Child("gpuMilli"), t.GPUMilli, "must be from 0 (CPU-only) to 1000 (whole GPUs)"))
		case t.GPUMilli == 0 && t.GPUCount != 0:
			errs = append(errs, field.Invalid(tp.Child("gpuCount"), t.GPUCount, "must be 0 for a CPU-only task"))
		case t.GPUMilli > 0 && t.GPUMilli < gpu.MilliPerGPU && t.GPUCount != 1:
			errs = append(errs, field.Invalid(tp.Child("gpuCount"), t.GPUCount, "must be 1 for a shared GPU task"))
		case t.GPUMilli == gpu.MilliPerGPU && (t.GPUCount < 1 || t.GPUCount > gpu.MaxDevices):
			errs = append(errs, field.Invalid(tp.Child("gpuCount"), t.GPUCount, "must be from 1 to 32 for a whole-GPU task"))
		}
		if t.CPUMilli < 0 {
			errs = append(errs, field.Invalid(tp.Child("cpuMilli"), t.CPUMilli, "must not be negative"))
		}
		if t.Weight < 1 {
			errs = append(errs, field.Invalid(tp.Child("weight"), t.Weight, "must be at least 1"))
		}
	}
	return errs.ToAggregate()
}

func policyNames() []string {
	var out []string
	for _, p := range gpu.Policies {
		out = append(out, string(p))
	}
	return out
}

// ValidateGPUPreemptionArgs validates GPUPreemptionArgs by DefaultPreemption's
// rules.
func ValidateGPUPreemptionArgs(path *field.Path, args *config.GPUPreemptionArgs) error {
	return schedvalidation.ValidateDefaultPreemptionArgs(path, &schedconfig.DefaultPreemptionArgs{
		MinCandidateNodesPercentage: args.MinCandidateNodesPercentage,
		MinCandidateNodesAbsolute:   args.MinCandidateNodesAbsolute,
	})
}

// ValidateLeastRequestedArgs validates LeastRequestedArgs.
func ValidateLeastRequestedArgs(path *field.Path, args *config.LeastRequestedArgs) error {
	var errs field.ErrorList
	rp := path.Child("resources")
	if len(args.Resources) == 0 {
		errs = append(errs, field.Required(rp, "at least one resource"))
	}
	seen := sets.New[string]()
	for i, r := range args.Resources {
		p := rp.Index(i)
		if r.Name == "" {
			errs = append(errs, field.Required(p.Child("name"), ""))
		} else if seen.Has(r.Name) {
			errs = append(errs, field.Duplicate(p.Child("name"), r.Name))
		}
		seen.Insert(r.Name)
		if r.Weight < 1 || r.Weight > 100 {
			errs = append(errs, field.Invalid(p.Child("weight"), r.Weight, "must be from 1 to 100"))
		}
	}
	return errs.ToAggregate()
}
