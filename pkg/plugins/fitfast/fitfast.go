// Package fitfast is the in-tree NodeResourcesFit plugin with a Filter that
// answers "fits" without allocating. Upstream's Filter builds a slice of
// insufficient resources on every call (garbage per node and pod: the
// largest allocation site of a scheduling cycle at 5,000 nodes), and for
// each extended resource a pod asks for (nvidia.com/gpu) formats a string
// and runs a regular expression per node. Here a node where every resource
// the pod asks for is free outright (or is one upstream ignores) passes
// after a few comparisons; any other node goes to upstream's Filter, which
// gives the verdict and the reasons, so every status is upstream's.
//
// The shortcut is exact: upstream checks the request, or a smaller delta
// for a pod already on the node (in-place resize), against the same free
// amounts, and only ever skips a check (ignored resources, resources DRA
// serves); a request that fits outright fits there too, and an extended
// resource in ignoredResources is skipped here as upstream skips it.
//
// Every other extension point (PreFilter, queueing hints, SignPod, PreScore,
// Score) is the in-tree plugin's, unchanged. The shipped profile runs this
// plugin in place of NodeResourcesFit (the in-tree one cannot be registered
// twice); statuses, metrics and queueing hints name it NodeResourcesFitFast.
package fitfast

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	configv1 "k8s.io/kube-scheduler/config/v1"
	fwk "k8s.io/kube-scheduler/framework"
	v1helper "k8s.io/kubernetes/pkg/apis/core/v1/helper"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	plfeature "k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/names"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/noderesources"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/plugins/internal/shared"
)

// Name is the plugin's name in the registry and in configs.
const Name = "NodeResourcesFitFast"

// stateKey is where the in-tree PreFilter writes the pod's request
// (noderesources' preFilterStateKey: "PreFilter" + its own name, whatever
// this plugin is called).
const stateKey fwk.StateKey = "PreFilter" + names.NodeResourcesFit

// request is what the in-tree PreFilter state exposes of the pod's request
// (its framework.Resource's getters, promoted). Should a later version
// change that state, the assertion fails and every node goes to upstream's
// Filter: slower, never wrong (TestShortcutTaken catches it).
type request interface {
	GetMilliCPU() int64
	GetMemory() int64
	GetEphemeralStorage() int64
	GetScalarResources() map[v1.ResourceName]int64
}

// Plugin is the in-tree NodeResourcesFit under our name (the framework routes
// statuses and hints by Name()), with the Filter's shortcut.
type Plugin struct {
	*noderesources.Fit
	// ignored: the ignoredResources that are extended resources (upstream
	// skips those only), decided once. ignoredResourceGroups are not
	// modelled: a resource of such a group goes to upstream's Filter.
	ignored map[v1.ResourceName]bool
}

var _ fwk.FilterPlugin = &Plugin{}

// New builds the in-tree plugin from NodeResourcesFitArgs (ignoredResources,
// ignoredResourceGroups, scoringStrategy), defaulted and validated as
// upstream's.
func New(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	args, err := argsFrom(obj)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	p, err := noderesources.NewFit(ctx, args, h, plfeature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	fit, ok := p.(*noderesources.Fit)
	if !ok {
		return nil, fmt.Errorf("%s: the in-tree plugin is a %T", Name, p)
	}
	pl := &Plugin{Fit: fit, ignored: map[v1.ResourceName]bool{}}
	for _, r := range args.IgnoredResources {
		if v1helper.IsExtendedResourceName(v1.ResourceName(r)) {
			pl.ignored[v1.ResourceName(r)] = true
		}
	}
	return pl, nil
}

// Name is the plugin's registry name.
func (*Plugin) Name() string { return Name }

// Filter passes a node where the pod's whole request is free, and asks
// upstream's Filter about any other.
func (pl *Plugin) Filter(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, ni fwk.NodeInfo) *fwk.Status {
	if pl.fitsOutright(cs, ni) {
		return nil
	}
	return pl.Fit.Filter(ctx, cs, pod, ni)
}

// fitsOutright: one more pod is allowed, and every resource asked for is
// free in full or ignored. Upstream's checks, in its order.
func (pl *Plugin) fitsOutright(cs fwk.CycleState, ni fwk.NodeInfo) bool {
	d, err := cs.Read(stateKey)
	if err != nil {
		return false
	}
	r, ok := d.(request)
	if !ok {
		return false
	}
	alloc, used := ni.GetAllocatable(), ni.GetRequested()
	if len(ni.GetPods())+1 > alloc.GetAllowedPodNumber() {
		return false
	}
	if q := r.GetMilliCPU(); q > 0 && q > alloc.GetMilliCPU()-used.GetMilliCPU() {
		return false
	}
	if q := r.GetMemory(); q > 0 && q > alloc.GetMemory()-used.GetMemory() {
		return false
	}
	if q := r.GetEphemeralStorage(); q > 0 && q > alloc.GetEphemeralStorage()-used.GetEphemeralStorage() {
		return false
	}
	for name, q := range r.GetScalarResources() {
		if q > 0 && q > alloc.GetScalarResources()[name]-used.GetScalarResources()[name] && !pl.ignored[name] {
			return false
		}
	}
	return true
}

// argsFrom reads NodeResourcesFitArgs (shared.InTreeArgs).
func argsFrom(obj runtime.Object) (*config.NodeResourcesFitArgs, error) {
	return shared.InTreeArgs(obj, &configv1.NodeResourcesFitArgs{}, &config.NodeResourcesFitArgs{}, "NodeResourcesFitArgs", Name+"Args")
}
