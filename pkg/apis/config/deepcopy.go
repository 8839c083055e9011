package config

import (
	"slices"

	"k8s.io/apimachinery/pkg/runtime"
)

// Hand-written deep copies: the types are small and plain.

// DeepCopyObject implements runtime.Object.
func (in *GPUFitArgs) DeepCopyObject() runtime.Object {
	if in == nil {
		return nil
	}
	out := *in
	out.GPUResourceNames = slices.Clone(in.GPUResourceNames)
	out.VolatileNodeLabels = slices.Clone(in.VolatileNodeLabels)
	out.DRA.Drivers = slices.Clone(in.DRA.Drivers)
	return &out
}

// DeepCopyObject implements runtime.Object.
func (in *GPUScoreArgs) DeepCopyObject() runtime.Object {
	if in == nil {
		return nil
	}
	out := *in
	out.TargetWorkload.Tasks = make([]WorkloadTask, len(in.TargetWorkload.Tasks))
	for i, t := range in.TargetWorkload.Tasks {
		t.Models = slices.Clone(t.Models)
		out.TargetWorkload.Tasks[i] = t
	}
	if in.TargetWorkload.Tasks == nil {
		out.TargetWorkload.Tasks = nil
	}
	return &out
}

// DeepCopyObject implements runtime.Object.
func (in *GPUPreemptionArgs) DeepCopyObject() runtime.Object {
	if in == nil {
		return nil
	}
	out := *in
	return &out
}

// DeepCopyObject implements runtime.Object.
func (in *LeastRequestedArgs) DeepCopyObject() runtime.Object {
	if in == nil {
		return nil
	}
	out := *in
	out.Resources = slices.Clone(in.Resources)
	return &out
}
