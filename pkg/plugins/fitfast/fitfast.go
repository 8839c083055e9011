// Package fitfast is the in-tree NodeResourcesFit plugin with a Filter that
// answers "fits" without allocating. Upstream's Filter builds a slice of
// insufficient resources on every call (garbage per node and pod: the
// largest allocation site of a scheduling cycle at 5,000 nodes), and for
// each extended resource a pod asks for (nvidia.com/gpu) formats a string
// and runs a regular expression per node. Here a node where every resource
// the pod asks for is free outright (or is one upstream ignores) passes
// after a few comparisons. A node where it does not fit gets upstream's
// status, its reasons in upstream's order, built here with each extended
// resource's reason and ignore rule decided once per name: a scheduling
// cycle of a pod that fits nowhere (a full cluster, a pod waiting for room)
// refuses every node, and upstream's Filter was most of such a cycle's
// time. Where the answer needs what is not modelled here (a pod already on
// the node, whose growth upstream checks; an extended resource the node
// does not list, which DRA may serve) the node goes to upstream's Filter.
//
// The shortcuts are exact: upstream checks the request, or a smaller delta
// for a pod already on the node (in-place resize), against the same free
// amounts, and only ever skips a check (ignored resources, resources DRA
// serves); a request that fits outright fits there too, and an extended
// resource in ignoredResources is skipped here as upstream skips it.
// TestFilterMatchesUpstream compares the two on random nodes and pods.
//
// Every other extension point (PreFilter, queueing hints, SignPod, PreScore,
// Score) is the in-tree plugin's, unchanged. The shipped profile runs this
// plugin in place of NodeResourcesFit (the in-tree one cannot be registered
// twice); statuses, metrics and queueing hints name it NodeResourcesFitFast.
package fitfast

import (
	"context"
	"fmt"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
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
	// skips those only), decided once. fitsOutright does not model
	// ignoredResourceGroups: a node short only of a resource of such a
	// group goes to refuse, which does.
	ignored map[v1.ResourceName]bool
	// ignoredNames and groups are the args', for the refusals' rule.
	ignoredNames, groups sets.Set[string]
	// draExtended: a scalar resource a node does not list may be served
	// by DRA (upstream skips it then), so such a refusal is upstream's to
	// decide. inPlace: upstream checks only the growth of a pod bound to
	// the node (an in-place resize), so its refusal is upstream's too.
	draExtended, inPlace bool

	mu sync.RWMutex
	// scalars: per scalar resource asked for, whether upstream ignores it
	// and its reason, decided on first use; at most maxScalars names (pods
	// choose them), the others decided on each use.
	scalars map[v1.ResourceName]scalar
}

const maxScalars = 256

type scalar struct {
	ignored bool
	reason  string
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
	feats := plfeature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate)
	p, err := noderesources.NewFit(ctx, args, h, feats)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	fit, ok := p.(*noderesources.Fit)
	if !ok {
		return nil, fmt.Errorf("%s: the in-tree plugin is a %T", Name, p)
	}
	pl := &Plugin{Fit: fit, ignored: map[v1.ResourceName]bool{},
		ignoredNames: sets.New(args.IgnoredResources...), groups: sets.New(args.IgnoredResourceGroups...),
		draExtended: feats.EnableDRAExtendedResource, inPlace: feats.EnableInPlacePodVerticalScalingSchedulerPreemption,
		scalars: map[v1.ResourceName]scalar{}}
	for _, r := range args.IgnoredResources {
		if v1helper.IsExtendedResourceName(v1.ResourceName(r)) {
			pl.ignored[v1.ResourceName(r)] = true
		}
	}
	return pl, nil
}

// Name is the plugin's registry name.
func (*Plugin) Name() string { return Name }

// Filter passes a node where the pod's whole request is free, refuses one
// where it is not with upstream's status, and asks upstream's Filter where
// that status needs more than is modelled here.
func (pl *Plugin) Filter(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, ni fwk.NodeInfo) *fwk.Status {
	r := pl.request(cs)
	if r == nil {
		return pl.Fit.Filter(ctx, cs, pod, ni)
	}
	if pl.fitsOutright(r, ni) {
		return nil
	}
	if s, ok := pl.refuse(r, pod, ni); ok {
		return s
	}
	return pl.Fit.Filter(ctx, cs, pod, ni)
}

// request is the in-tree PreFilter's, or nil.
func (pl *Plugin) request(cs fwk.CycleState) request {
	d, err := cs.Read(stateKey)
	if err != nil {
		return nil
	}
	r, _ := d.(request)
	return r
}

// fitsOutright: one more pod is allowed, and every resource asked for is
// free in full or ignored. Upstream's checks, in its order.
func (pl *Plugin) fitsOutright(r request, ni fwk.NodeInfo) bool {
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

// refuse is upstream's fitsRequest and Filter for a pod not on this node:
// the reasons in its order (the pod limit, CPU, memory, ephemeral storage,
// then the scalar resources in map order, as upstream iterates them), and
// UnschedulableAndUnresolvable where a request exceeds the node's
// allocatable. ok is false where upstream checks a delta (the pod is bound
// to this node and in-place resize is on) or might let DRA serve a
// resource (one the node does not list, or lists at zero).
func (pl *Plugin) refuse(r request, pod *v1.Pod, ni fwk.NodeInfo) (*fwk.Status, bool) {
	if pod == nil || ni.Node() == nil || (pl.inPlace && pod.Spec.NodeName == ni.Node().Name) {
		return nil, false
	}
	alloc, used := ni.GetAllocatable(), ni.GetRequested()
	var reasons []string
	code := fwk.Unschedulable
	if len(ni.GetPods())+1 > alloc.GetAllowedPodNumber() {
		reasons = append(reasons, "Too many pods")
	}
	check := func(q, capacity, inUse int64, reason string) {
		if q > 0 && q > capacity-inUse {
			reasons = append(reasons, reason)
			if q > capacity {
				code = fwk.UnschedulableAndUnresolvable
			}
		}
	}
	check(r.GetMilliCPU(), alloc.GetMilliCPU(), used.GetMilliCPU(), "Insufficient cpu")
	check(r.GetMemory(), alloc.GetMemory(), used.GetMemory(), "Insufficient memory")
	check(r.GetEphemeralStorage(), alloc.GetEphemeralStorage(), used.GetEphemeralStorage(), "Insufficient ephemeral-storage")
	for name, q := range r.GetScalarResources() {
		if q == 0 {
			continue
		}
		sc := pl.scalar(name)
		if sc.ignored {
			continue
		}
		capacity := alloc.GetScalarResources()[name]
		if pl.draExtended && capacity <= 0 {
			return nil, false
		}
		check(q, capacity, used.GetScalarResources()[name], sc.reason)
	}
	if len(reasons) == 0 {
		// Not reached: fitsOutright passed such a node. Upstream decides.
		return nil, false
	}
	return fwk.NewStatus(code, reasons...), true
}

// scalar is upstream's ignore rule and reason for a scalar resource,
// decided once per name (upstream runs a regular expression and formats the
// reason per node).
func (pl *Plugin) scalar(name v1.ResourceName) scalar {
	pl.mu.RLock()
	sc, ok := pl.scalars[name]
	pl.mu.RUnlock()
	if ok {
		return sc
	}
	sc = scalar{reason: fmt.Sprintf("Insufficient %v", name)}
	if v1helper.IsExtendedResourceName(name) {
		prefix, _, _ := strings.Cut(string(name), "/")
		sc.ignored = pl.ignoredNames.Has(string(name)) || pl.groups.Has(prefix)
	}
	pl.mu.Lock()
	if len(pl.scalars) < maxScalars {
		pl.scalars[name] = sc
	}
	pl.mu.Unlock()
	return sc
}

// argsFrom reads NodeResourcesFitArgs (shared.InTreeArgs).
func argsFrom(obj runtime.Object) (*config.NodeResourcesFitArgs, error) {
	return shared.InTreeArgs(obj, &configv1.NodeResourcesFitArgs{}, &config.NodeResourcesFitArgs{}, "NodeResourcesFitArgs", Name+"Args")
}
