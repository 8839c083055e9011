package gpufit

import (
	"context"
	"slices"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	fwk "k8s.io/kube-scheduler/framework"
)

var _ fwk.PostFilterPlugin = &GPUFit{}

// PostFilter makes no pod schedulable: it tells the requeue reconciler which
// plugins rejected the pod's nodes, so that the reconciler activates only a
// pod whose every rejection it re-checks. A pod held by anything else (an
// anti-affinity, a volume, a port) is left to the scheduler's hints and
// backoff. It runs after DefaultPreemption, and only when that nominated
// nothing. A pod GPUFit alone rejected is also left out of the bound-pod
// events that free no GPU (narrow.go).
func (pl *GPUFit) PostFilter(_ context.Context, _ fwk.CycleState, pod *v1.Pod, statuses fwk.NodeToStatusReader) (*fwk.PostFilterResult, *fwk.Status) {
	if pl.rec == nil && pl.narrow == nil {
		return nil, fwk.NewStatus(fwk.Unschedulable)
	}
	nodes, err := pl.handle.SnapshotSharedLister().NodeInfos().List()
	if err != nil {
		return nil, fwk.NewStatus(fwk.Unschedulable)
	}
	// A handful of plugins at most: a slice beats a set.
	var plugins []string
	for _, ni := range nodes {
		s := statuses.Get(ni.Node().Name)
		name := ""
		if s != nil {
			name = s.Plugin()
		}
		if !slices.Contains(plugins, name) {
			plugins = append(plugins, name)
		}
	}
	if pl.rec != nil {
		pl.rec.RecordRejection(pod, plugins)
	}
	pl.recordRejectors(pod, plugins)
	return nil, fwk.NewStatus(fwk.Unschedulable)
}

// explainClient is the client of the pending reasons: a rate limit of its
// own, so that tens of thousands of pending pods never delay a bind.
func explainClient(h fwk.Handle, qps, burst int32) kubernetes.Interface {
	if c := h.KubeConfig(); c != nil {
		cfg := rest.CopyConfig(c)
		cfg.QPS, cfg.Burst, cfg.RateLimiter = float32(qps), int(burst), nil
		cfg = rest.AddUserAgent(cfg, "pending-reasons")
		if cs, err := kubernetes.NewForConfig(cfg); err == nil {
			return cs
		}
	}
	return h.ClientSet()
}

// dropLabels removes labels the scheduler never reads and that change all
// the time (GPU Feature Discovery's timestamp) from the scheduler's view of
// the nodes: a node update that changes only them is then no scheduling
// event at all, and wakes none of the pending pods, which the scheduling
// queue would otherwise visit one by one for each such update.
func dropLabels(keys []string) cache.TransformFunc {
	return func(obj interface{}) (interface{}, error) {
		n, ok := obj.(*v1.Node)
		if !ok {
			return obj, nil
		}
		for _, k := range keys {
			delete(n.Labels, k)
		}
		return n, nil
	}
}
