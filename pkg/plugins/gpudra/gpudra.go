// Package gpudra is the in-tree DynamicResources plugin, unchanged, with the
// GPUs of our DRA drivers listed in our order. Its structured allocator
// takes the first device that fits, in slice order (there is no scoring
// hook upstream; enhancements#4970): ordering what it sees is the one lever
// that leaves every guarantee of the plugin in place (binding conditions,
// device taints, prioritized lists, admin access, consumable capacity),
// since the plugin's own code allocates. The order is best fit: the most
// used GPU first (gpu.NodeState.DeviceOrder), so a share lands where it
// fits most tightly and whole GPUs stay free.
//
// The profile runs this plugin in place of DynamicResources (the in-tree
// one cannot be registered twice, and takes its view of the slices from the
// framework's handle, which only this constructor can wrap). Statuses,
// metrics and queueing hints name it GPUDynamicResources.
package gpudra

import (
	"context"
	"fmt"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	configv1 "k8s.io/kube-scheduler/config/v1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
	plfeature "k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/agent/dra"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/plugins/internal/shared"
)

// Name is the plugin's name in the registry and in configs.
const Name = "GPUDynamicResources"

// New builds the in-tree plugin over a handle whose DRA view orders our
// GPUs. Its args are DynamicResources' (filterTimeout, bindingTimeout),
// defaulted as upstream's.
func New(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	args, err := argsFrom(obj)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	fts := plfeature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate)
	if m := h.SharedDRAManager(); m != nil {
		s := shared.For(h)
		h = &handle{Handle: h, dra: &manager{SharedDRAManager: m, slices: &ordered{inner: m.ResourceSlices(), s: s, h: h}}}
	}
	p, err := dynamicresources.New(ctx, args, h, fts)
	if err != nil {
		return nil, err
	}
	inner, ok := p.(*dynamicresources.DynamicResources)
	if !ok {
		return nil, fmt.Errorf("%s: the in-tree plugin is a %T", Name, p)
	}
	return &plugin{DynamicResources: inner}, nil
}

// plugin is the in-tree plugin under our name (the framework weighs scores
// and routes hints by a plugin's Name()); every extension point is its own.
type plugin struct {
	*dynamicresources.DynamicResources
}

// Name is the plugin's registry name.
func (*plugin) Name() string { return Name }

// argsFrom reads DynamicResourcesArgs (shared.InTreeArgs).
func argsFrom(obj runtime.Object) (*config.DynamicResourcesArgs, error) {
	return shared.InTreeArgs(obj, &configv1.DynamicResourcesArgs{}, &config.DynamicResourcesArgs{}, "DynamicResourcesArgs", Name+"Args")
}

type handle struct {
	fwk.Handle
	dra fwk.SharedDRAManager
}

func (h *handle) SharedDRAManager() fwk.SharedDRAManager { return h.dra }

type manager struct {
	fwk.SharedDRAManager
	slices fwk.ResourceSliceLister
}

func (m *manager) ResourceSlices() fwk.ResourceSliceLister { return m.slices }

// ordered lists the slices with each node's GPUs of our drivers in our
// order; other devices, and slices of other drivers, as they are.
type ordered struct {
	inner fwk.ResourceSliceLister
	s     *shared.Shared
	h     fwk.Handle
}

func (o *ordered) ListWithDeviceTaintRules() ([]*resourceapi.ResourceSlice, error) {
	list, err := o.inner.ListWithDeviceTaintRules()
	x := o.s.Claims()
	if err != nil || x == nil {
		return list, err
	}
	var out []*resourceapi.ResourceSlice
	nodes := map[string]*nodeRank{}
	var keys []int
	for i, sl := range list {
		if !x.Reads(sl.Spec.Driver) || len(sl.Spec.Devices) < 2 {
			continue
		}
		keys = keys[:0]
		sorted := true
		for j := range sl.Spec.Devices {
			k := o.rank(x, nodes, dra.DeviceID{Driver: sl.Spec.Driver, Pool: sl.Spec.Pool.Name, Device: sl.Spec.Devices[j].Name})
			if j > 0 && k < keys[j-1] {
				sorted = false
			}
			keys = append(keys, k)
		}
		if sorted {
			continue
		}
		if out == nil {
			out = slices.Clone(list)
		}
		out[i] = reorder(sl, keys)
	}
	if out == nil {
		return list, nil
	}
	return out, nil
}

// nodeRank is a node's device state and each device's place in its order.
type nodeRank struct {
	st   *gpu.NodeState
	rank []int
}

// rank is a device's place: its GPU's in the node's order; after every GPU
// for a device that is none.
func (o *ordered) rank(x *dra.Index, nodes map[string]*nodeRank, id dra.DeviceID) int {
	node, uuid, ok := x.GPUOf(id)
	if !ok {
		return gpu.MaxDevices
	}
	nr, done := nodes[node]
	if !done {
		if ni, err := o.h.SnapshotSharedLister().NodeInfos().Get(node); err == nil {
			if st := o.s.State(ni); st.Claimed {
				nr = &nodeRank{st: st, rank: st.DeviceOrder(nil)}
			}
		}
		nodes[node] = nr
	}
	if nr == nil {
		return gpu.MaxDevices
	}
	if i := nr.st.DeviceIndex(uuid); i >= 0 {
		return nr.rank[i]
	}
	return gpu.MaxDevices
}

// reorder is a shallow copy of the slice with its devices stably sorted by
// key (the informer's object is never written).
func reorder(sl *resourceapi.ResourceSlice, keys []int) *resourceapi.ResourceSlice {
	c := *sl
	idx := make([]int, len(keys))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return keys[a] - keys[b] })
	c.Spec.Devices = make([]resourceapi.Device, len(idx))
	for i, j := range idx {
		c.Spec.Devices[i] = sl.Spec.Devices[j]
	}
	return &c
}
