package gpufit

import (
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/utils/ptr"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/agent/dra"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
)

// feedClaimIndex feeds the DRA index from the scheduler's own informers
// (the DynamicResources plugin watches the same objects: no new watch).
// released is told when GPUs may have been freed or added: the requeue
// reconciler looks again (the DynamicResources plugin requeues nothing on
// a claim deleted while allocated, as the garbage collector deletes a
// deleted pod's claim).
func feedClaimIndex(x *dra.Index, f informers.SharedInformerFactory, released func()) error {
	slices := f.Resource().V1().ResourceSlices().Informer()
	if _, err := slices.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj interface{}) {
			if s, ok := obj.(*resourceapi.ResourceSlice); ok {
				x.SliceChanged(nil, s)
				if x.Reads(s.Spec.Driver) {
					released()
				}
			}
		},
		UpdateFunc: func(old, obj interface{}) {
			o, _ := old.(*resourceapi.ResourceSlice)
			if s, ok := obj.(*resourceapi.ResourceSlice); ok {
				x.SliceChanged(o, s)
				if x.Reads(s.Spec.Driver) {
					released()
				}
			}
		},
		DeleteFunc: func(obj interface{}) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if s, ok := obj.(*resourceapi.ResourceSlice); ok {
				x.SliceChanged(s, nil)
			}
		},
	}); err != nil {
		return err
	}
	claims := f.Resource().V1().ResourceClaims().Informer()
	_, err := claims.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj interface{}) {
			if c, ok := obj.(*resourceapi.ResourceClaim); ok {
				x.ClaimChanged(nil, c)
			}
		},
		UpdateFunc: func(old, obj interface{}) {
			o, _ := old.(*resourceapi.ResourceClaim)
			if c, ok := obj.(*resourceapi.ResourceClaim); ok {
				x.ClaimChanged(o, c)
				if o != nil && x.HoldsAny(o) && c.Status.Allocation == nil {
					released()
				}
			}
		},
		DeleteFunc: func(obj interface{}) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if c, ok := obj.(*resourceapi.ResourceClaim); ok {
				x.ClaimChanged(c, nil)
				if x.HoldsAny(c) {
					released()
				}
			}
		},
	})
	return err
}

// claimRequest reads what the pod's claims ask of our drivers' GPUs (a
// claim from a template is named in the pod's status once created).
func (pl *GPUFit) claimRequest(pod *v1.Pod) (gpu.Request, bool) {
	m := pl.handle.SharedDRAManager()
	if m == nil {
		return gpu.Request{}, false
	}
	var claims []*resourceapi.ResourceClaim
	for _, pc := range pod.Spec.ResourceClaims {
		name := ""
		if pc.ResourceClaimName != nil {
			name = *pc.ResourceClaimName
		}
		for _, s := range pod.Status.ResourceClaimStatuses {
			if name == "" && s.Name == pc.Name && s.ResourceClaimName != nil {
				name = *s.ResourceClaimName
			}
		}
		if name == "" {
			continue
		}
		if c, err := m.ResourceClaims().Get(pod.Namespace, name); err == nil {
			claims = append(claims, c)
		}
	}
	return pl.claims.ClaimRequest(claims, func(name string) *resourceapi.DeviceClass {
		c, err := m.DeviceClasses().Get(name)
		if err != nil {
			return nil
		}
		return c
	})
}

// isSchedulableAfterSliceChange: a slice of one of our drivers may add GPUs,
// or make a tainted one healthy.
func (pl *GPUFit) isSchedulableAfterSliceChange(logger klog.Logger, pod *v1.Pod, oldObj, newObj interface{}) (fwk.QueueingHint, error) {
	s, ok := newObj.(*resourceapi.ResourceSlice)
	if !ok || !pl.claims.Reads(s.Spec.Driver) {
		return fwk.QueueSkip, nil
	}
	if old, ok := oldObj.(*resourceapi.ResourceSlice); ok && apiequality.Semantic.DeepEqual(old.Spec.Devices, s.Spec.Devices) &&
		ptr.Equal(old.Spec.NodeName, s.Spec.NodeName) {
		// Republished as it was (a new generation of the same devices).
		return fwk.QueueSkip, nil
	}
	if !pl.usesGPU(pod) {
		return fwk.QueueSkip, nil
	}
	logger.V(5).Info("GPUs published through DRA changed", "pod", klog.KObj(pod), "slice", klog.KObj(s))
	return fwk.Queue, nil
}

// isSchedulableAfterClaimChange: a claim on our drivers' devices that is
// deallocated or deleted frees them.
func (pl *GPUFit) isSchedulableAfterClaimChange(logger klog.Logger, pod *v1.Pod, oldObj, newObj interface{}) (fwk.QueueingHint, error) {
	old, _ := oldObj.(*resourceapi.ResourceClaim)
	if old == nil {
		if t, ok := oldObj.(cache.DeletedFinalStateUnknown); ok {
			old, _ = t.Obj.(*resourceapi.ResourceClaim)
		}
	}
	if old == nil || old.Status.Allocation == nil || !pl.claims.HoldsAny(old) {
		return fwk.QueueSkip, nil
	}
	if c, ok := newObj.(*resourceapi.ResourceClaim); ok && c.Status.Allocation != nil {
		return fwk.QueueSkip, nil // still allocated: nothing freed
	}
	if !pl.usesGPU(pod) {
		return fwk.QueueSkip, nil
	}
	logger.V(5).Info("a claim freed GPUs", "pod", klog.KObj(pod), "claim", klog.KObj(old))
	return fwk.Queue, nil
}
