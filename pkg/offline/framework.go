package offline

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/informers"
	clientset "k8s.io/client-go/kubernetes"
	resourceslicetracker "k8s.io/dynamic-resource-allocation/resourceslice/tracker"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/kubernetes/pkg/scheduler"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	intree "k8s.io/kubernetes/pkg/scheduler/framework/plugins"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/nodevolumelimits"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	"k8s.io/kubernetes/pkg/scheduler/metrics"
	"k8s.io/kubernetes/pkg/scheduler/util/assumecache"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/plugins"
)

// Options for NewFramework.
type Options struct {
	// Parallelism of Filter and Score, as the scheduler's parallelism.
	Parallelism int
	// OutOfTree adds plugins beyond ours (tests).
	OutOfTree frameworkruntime.Registry
}

// NewFramework builds a profile's framework the way scheduler.New does: the
// in-tree registry plus ours, a pod informer as the scheduler's, the DRA and
// CSI managers, and the cluster as the snapshot. The informers are started
// and synced; client may be a fake.
func NewFramework(ctx context.Context, profile *config.KubeSchedulerProfile, cluster *Cluster, client clientset.Interface, opts Options) (framework.Framework, informers.SharedInformerFactory, error) {
	metrics.Register() // idempotent; the framework instruments plugins with it
	registry := intree.NewInTreeRegistry()
	if err := registry.Merge(plugins.Registry()); err != nil {
		return nil, nil, err
	}
	if opts.OutOfTree != nil {
		if err := registry.Merge(opts.OutOfTree); err != nil {
			return nil, nil, err
		}
	}
	informerFactory := scheduler.NewInformerFactory(client, 0, nil)

	var draManager fwk.SharedDRAManager
	if utilfeature.DefaultFeatureGate.Enabled(features.DynamicResourceAllocation) {
		claims := assumecache.NewAssumeCache(klogFrom(ctx), informerFactory.Resource().V1().ResourceClaims().Informer(), "ResourceClaim", "", nil)
		sliceOpts := resourceslicetracker.Options{
			EnableDeviceTaintRules:   utilfeature.DefaultFeatureGate.Enabled(features.DRADeviceTaintRules),
			EnableConsumableCapacity: utilfeature.DefaultFeatureGate.Enabled(features.DRAConsumableCapacity),
			SliceInformer:            informerFactory.Resource().V1().ResourceSlices(),
			KubeClient:               client,
		}
		if sliceOpts.EnableDeviceTaintRules {
			sliceOpts.TaintInformer = informerFactory.Resource().V1().DeviceTaintRules()
		}
		slices, err := resourceslicetracker.StartTracker(ctx, sliceOpts)
		if err != nil {
			return nil, nil, fmt.Errorf("resource slice tracker: %w", err)
		}
		draManager = dynamicresources.NewDRAManager(ctx, claims, slices, informerFactory)
	}
	parallelism := opts.Parallelism
	if parallelism <= 0 {
		parallelism = 16
	}
	f, err := frameworkruntime.NewFramework(ctx, registry, profile,
		frameworkruntime.WithClientSet(client),
		frameworkruntime.WithInformerFactory(informerFactory),
		frameworkruntime.WithSharedDRAManager(draManager),
		frameworkruntime.WithSharedCSIManager(nodevolumelimits.NewCSIManager(informerFactory.Storage().V1().CSINodes().Lister())),
		frameworkruntime.WithSnapshotSharedLister(cluster),
		frameworkruntime.WithParallelism(parallelism),
		// Offline there is no queue: nothing to move to it.
		frameworkruntime.WithPodActivator(noQueue{}),
	)
	if err != nil {
		return nil, nil, err
	}
	informerFactory.Start(ctx.Done())
	for typ, ok := range informerFactory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return nil, nil, fmt.Errorf("informer for %v did not sync", typ)
		}
	}
	return f, informerFactory, nil
}

// noQueue is the pod activator of a framework without a scheduling queue.
type noQueue struct{}

func (noQueue) Activate(klog.Logger, map[string]*v1.Pod) {}
