// Package leastrequested is the LeastRequested plugin: the classic spread
// over CPU and memory (or any configured resources), with weights.
package leastrequested

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	resourcehelper "k8s.io/component-helpers/resource"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/features"
	schedutil "k8s.io/kubernetes/pkg/scheduler/util"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config/scheme"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config/validation"
)

// Name is the plugin's name in the registry and in configs.
const Name = "LeastRequested"

// LeastRequested favours nodes with more of their allocatable unrequested:
// score = Σ w_r·(allocatable_r − requested_r)·100/allocatable_r / Σ w_r,
// in integer arithmetic per resource, as the in-tree LeastAllocated does.
type LeastRequested struct {
	resources         []config.ResourceWeight
	podLevelResources bool
}

var (
	_ fwk.PreScorePlugin = &LeastRequested{}
	_ fwk.ScorePlugin    = &LeastRequested{}
	_ fwk.SignPlugin     = &LeastRequested{}
)

// New builds the plugin from validated args.
func New(_ context.Context, obj runtime.Object, _ fwk.Handle) (fwk.Plugin, error) {
	var args *config.LeastRequestedArgs
	switch a := obj.(type) {
	case nil:
		args = scheme.DefaultLeastRequestedArgs()
	case *config.LeastRequestedArgs:
		args = a
	default:
		return nil, fmt.Errorf("want args of type LeastRequestedArgs, got %T", obj)
	}
	if err := validation.ValidateLeastRequestedArgs(field.NewPath("args"), args); err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	return &LeastRequested{
		resources:         args.Resources,
		podLevelResources: utilfeature.DefaultFeatureGate.Enabled(features.PodLevelResources),
	}, nil
}

// Name returns the plugin's name.
func (pl *LeastRequested) Name() string { return Name }

// SignPod: the score depends on the pod's resource requests only.
func (pl *LeastRequested) SignPod(_ context.Context, pod *v1.Pod) ([]fwk.SignFragment, *fwk.Status) {
	return []fwk.SignFragment{{Key: fwk.ResourcesSignerName, Value: pl.podRequests(pod)}}, nil
}

type preScoreState struct {
	podRequests []int64
}

func (s *preScoreState) Clone() fwk.StateData { return s }

const preScoreStateKey fwk.StateKey = "PreScore" + Name

// PreScore computes the pod's requests once, in the order of the resources.
func (pl *LeastRequested) PreScore(_ context.Context, cs fwk.CycleState, pod *v1.Pod, _ []fwk.NodeInfo) *fwk.Status {
	cs.Write(preScoreStateKey, &preScoreState{podRequests: pl.podRequests(pod)})
	return nil
}

// podRequests uses the scheduler's non-zero defaults for containers that
// request no CPU or memory, so many empty pods do not pile onto one node.
func (pl *LeastRequested) podRequests(pod *v1.Pod) []int64 {
	reqs := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{
		SkipPodLevelResources: !pl.podLevelResources,
		NonMissingContainerRequests: v1.ResourceList{
			v1.ResourceCPU:    *resource.NewMilliQuantity(schedutil.DefaultMilliCPURequest, resource.DecimalSI),
			v1.ResourceMemory: *resource.NewQuantity(schedutil.DefaultMemoryRequest, resource.DecimalSI),
		},
	})
	out := make([]int64, len(pl.resources))
	for i, r := range pl.resources {
		q := reqs[v1.ResourceName(r.Name)]
		if r.Name == string(v1.ResourceCPU) {
			out[i] = q.MilliValue()
		} else {
			out[i] = q.Value()
		}
	}
	return out
}

// Score computes the weighted least-requested score without allocating.
func (pl *LeastRequested) Score(_ context.Context, cs fwk.CycleState, pod *v1.Pod, nodeInfo fwk.NodeInfo) (int64, *fwk.Status) {
	var podRequests []int64
	if d, err := cs.Read(preScoreStateKey); err == nil {
		podRequests = d.(*preScoreState).podRequests
	} else {
		podRequests = pl.podRequests(pod)
	}
	var nodeScore, weightSum int64
	for i, r := range pl.resources {
		allocatable, requested := nodeAmounts(nodeInfo, v1.ResourceName(r.Name), podRequests[i])
		if allocatable == 0 {
			continue
		}
		requested += podRequests[i]
		var s int64
		if requested <= allocatable {
			s = (allocatable - requested) * fwk.MaxNodeScore / allocatable
		}
		nodeScore += s * r.Weight
		weightSum += r.Weight
	}
	if weightSum == 0 {
		return 0, nil
	}
	return nodeScore / weightSum, nil
}

// nodeAmounts returns the node's allocatable and already requested amount of
// a resource; extended resources the pod does not ask for are left out.
func nodeAmounts(nodeInfo fwk.NodeInfo, name v1.ResourceName, podRequest int64) (int64, int64) {
	switch name {
	case v1.ResourceCPU:
		return nodeInfo.GetAllocatable().GetMilliCPU(), nodeInfo.GetNonZeroRequested().GetMilliCPU()
	case v1.ResourceMemory:
		return nodeInfo.GetAllocatable().GetMemory(), nodeInfo.GetNonZeroRequested().GetMemory()
	case v1.ResourceEphemeralStorage:
		return nodeInfo.GetAllocatable().GetEphemeralStorage(), nodeInfo.GetRequested().GetEphemeralStorage()
	}
	if podRequest == 0 {
		return 0, 0
	}
	return nodeInfo.GetAllocatable().GetScalarResources()[name], nodeInfo.GetRequested().GetScalarResources()[name]
}

// ScoreExtensions: scores are already 0-100.
func (pl *LeastRequested) ScoreExtensions() fwk.ScoreExtensions { return nil }
