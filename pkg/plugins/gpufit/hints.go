package gpufit

import (
	"context"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	schedutil "k8s.io/kubernetes/pkg/scheduler/util"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/agent/hami"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/fault"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/internal/objects"
)

// EventsToRegister lists every event that can turn a GPUFit rejection into a
// fit. Each hint asks one level question: could the pod fit on the node in
// the event, given that node's current devices and reservations?
func (pl *GPUFit) EventsToRegister(_ context.Context) ([]fwk.ClusterEventWithHint, error) {
	events := []fwk.ClusterEventWithHint{
		{Event: fwk.ClusterEvent{Resource: fwk.Node, ActionType: fwk.Add | fwk.UpdateNodeAllocatable | fwk.UpdateNodeLabel | fwk.UpdateNodeAnnotation}, QueueingHintFn: pl.isSchedulableAfterNodeChange},
		{Event: fwk.ClusterEvent{Resource: fwk.AssignedPod, ActionType: fwk.Delete}, QueueingHintFn: pl.isSchedulableAfterPodDelete},
		// Annotation changes come as the general Update.
		{Event: fwk.ClusterEvent{Resource: fwk.AssignedPod, ActionType: fwk.Update}, QueueingHintFn: pl.isSchedulableAfterPodUpdate},
		{Event: fwk.ClusterEvent{Resource: fwk.TargetPod, ActionType: fwk.Update}, QueueingHintFn: pl.isSchedulableAfterTargetPodUpdate},
	}
	if !pl.hints {
		// Measured baseline: every registered event requeues.
		for i := range events {
			events[i].QueueingHintFn = nil
		}
	}
	return events, nil
}

// fitsNow is the level check. Without an informer it knows the node's
// inventory only, and answers Queue whenever the inventory could host the pod.
func (pl *GPUFit) fitsNow(logger klog.Logger, pod *v1.Pod, node *v1.Node) fwk.QueueingHint {
	req, err := gpu.ParseRequest(pod, pl.reqOpts)
	if err != nil {
		// Only the pod's own update can fix an invalid request.
		return fwk.QueueSkip
	}
	if !req.HasGPU() {
		return fwk.QueueSkip
	}
	st, ok := pl.shared.CurrentState(node)
	if !ok {
		st = gpu.NewNodeState(node.Name, gpu.ReadInventory(node, pl.shared.Tracker().Options()), 0)
	}
	out, _, _ := st.Fit(&req)
	if out == gpu.Fits {
		logger.V(5).Info("pod now fits the node's GPUs", "pod", klog.KObj(pod), "node", klog.KObj(node))
		return fwk.Queue
	}
	logger.V(5).Info("pod still does not fit the node's GPUs", "pod", klog.KObj(pod), "node", klog.KObj(node), "reason", reasons[out])
	return fwk.QueueSkip
}

func (pl *GPUFit) isSchedulableAfterNodeChange(logger klog.Logger, pod *v1.Pod, oldObj, newObj interface{}) (fwk.QueueingHint, error) {
	old, node, err := schedutil.As[*v1.Node](oldObj, newObj)
	if err != nil {
		return fwk.Queue, err
	}
	if old != nil && sameDevices(old, node) {
		// A node lock taken or released, a heartbeat annotation: no
		// device came or went.
		return fwk.QueueSkip, nil
	}
	return pl.fitsNow(logger, pod, node), nil
}

// sameDevices reports whether two versions of a node report the same GPUs:
// labels, allocatable, and the device agent's registration and cordon.
func sameDevices(a, b *v1.Node) bool {
	return objects.EqualLabels(a.Labels, b.Labels) && objects.EqualResources(a.Status.Allocatable, b.Status.Allocatable) &&
		objects.EqualResources(a.Status.Capacity, b.Status.Capacity) &&
		a.Annotations[hami.AnnotationRegister] == b.Annotations[hami.AnnotationRegister] &&
		a.Annotations[hami.AnnotationCordon] == b.Annotations[hami.AnnotationCordon]
}

// usesGPU is whether a bound pod holds devices: what it requests, whoever
// bound it (an assignment on a pod that asks for no GPU holds nothing).
func (pl *GPUFit) usesGPU(p *v1.Pod) bool { return gpu.UsesGPU(p, pl.reqOpts) }

func (pl *GPUFit) nodeOf(logger klog.Logger, name string) *v1.Node {
	f := pl.handle.SharedInformerFactory()
	if f == nil {
		return nil
	}
	n, err := f.Core().V1().Nodes().Lister().Get(name)
	if err != nil {
		logger.V(5).Info("node of the event is gone", "node", name)
		return nil
	}
	return n
}

func (pl *GPUFit) isSchedulableAfterPodDelete(logger klog.Logger, pod *v1.Pod, oldObj, newObj interface{}) (fwk.QueueingHint, error) {
	deleted, _, err := schedutil.As[*v1.Pod](oldObj, newObj)
	if err != nil {
		return fwk.Queue, err
	}
	if deleted.Spec.NodeName == "" || !pl.usesGPU(deleted) || fault.DropFreedGPU() {
		return fwk.QueueSkip, nil
	}
	return pl.fitsOnNodeOf(logger, pod, deleted), nil
}

func (pl *GPUFit) isSchedulableAfterPodUpdate(logger klog.Logger, pod *v1.Pod, oldObj, newObj interface{}) (fwk.QueueingHint, error) {
	oldPod, newPod, err := schedutil.As[*v1.Pod](oldObj, newObj)
	if err != nil {
		return fwk.Queue, err
	}
	// Most updates of bound pods are status changes: the devices they hold
	// are the same, nothing can have been freed. Neither can a pod that asks
	// for no GPU free one, whatever its annotations say.
	if oldPod.Annotations[gpu.AnnotationAssignment] == newPod.Annotations[gpu.AnnotationAssignment] &&
		oldPod.Annotations[hami.AnnotationAllocated] == newPod.Annotations[hami.AnnotationAllocated] &&
		oldPod.Annotations[hami.AnnotationVGPUNode] == newPod.Annotations[hami.AnnotationVGPUNode] &&
		terminal(oldPod) == terminal(newPod) &&
		sameGPURequest(oldPod, newPod, pl.reqOpts) || (!pl.usesGPU(oldPod) && !pl.usesGPU(newPod)) || fault.DropFreedGPU() {
		return fwk.QueueSkip, nil
	}
	return pl.fitsOnNodeOf(logger, pod, newPod), nil
}

// fitsOnNodeOf checks the node of a bound pod; a node that is gone cannot
// take the pod.
func (pl *GPUFit) fitsOnNodeOf(logger klog.Logger, pod, bound *v1.Pod) fwk.QueueingHint {
	if pl.handle.SharedInformerFactory() == nil {
		return fwk.Queue
	}
	node := pl.nodeOf(logger, bound.Spec.NodeName)
	if node == nil {
		return fwk.QueueSkip
	}
	return pl.fitsNow(logger, pod, node)
}

func (pl *GPUFit) isSchedulableAfterTargetPodUpdate(logger klog.Logger, pod *v1.Pod, oldObj, newObj interface{}) (fwk.QueueingHint, error) {
	oldPod, newPod, err := schedutil.As[*v1.Pod](oldObj, newObj)
	if err != nil {
		return fwk.Queue, err
	}
	if sameGPURequest(oldPod, newPod, pl.reqOpts) {
		return fwk.QueueSkip, nil
	}
	logger.V(5).Info("the pod's GPU request changed", "pod", klog.KObj(pod))
	return fwk.Queue, nil
}

// terminal pods hold nothing.
func terminal(p *v1.Pod) bool {
	return p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed
}

// sameGPURequest compares what ParseRequest reads, without parsing.
func sameGPURequest(a, b *v1.Pod, opts gpu.RequestOptions) bool {
	return gpu.SameRequestAnnotations(a, b) && gpu.WholeGPUs(a, opts) == gpu.WholeGPUs(b, opts)
}
