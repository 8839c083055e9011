// Package gpufit is the GPUFit plugin: it reads a pod's GPU request once,
// filters nodes per device (whole GPUs, a share of one GPU, the model), keeps
// in-flight device reservations, and writes the assignment annotation.
package gpufit

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config/scheme"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config/validation"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/plugins/internal/shared"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/requeue"
)

// Name is the plugin's name in the registry and in configs.
const Name = "GPUFit"

const reserveStateKey fwk.StateKey = "Reserve" + Name

// Filter reasons: constant, so that "0/N nodes are available" aggregates them.
const (
	ErrReasonNoGPU          = "node(s) had no GPU"
	ErrReasonModel          = "node(s) had no allowed GPU model"
	ErrReasonMemoryUnknown  = "node(s) did not report GPU memory per device"
	ErrReasonShareTooLarge  = "node(s) had GPUs with less memory than requested"
	ErrReasonTooFewDevices  = "node(s) had fewer GPUs than requested"
	ErrReasonTooFewFree     = "node(s) had too few free GPUs"
	ErrReasonNoDeviceShare  = "node(s) had no single GPU with enough free milli-GPU"
	ErrReasonDevicesChanged = "node's free GPUs changed during scheduling"
)

var reasons = map[gpu.Outcome]string{
	gpu.NoGPU:             ErrReasonNoGPU,
	gpu.ModelNotAllowed:   ErrReasonModel,
	gpu.MemoryUnknown:     ErrReasonMemoryUnknown,
	gpu.ShareTooLarge:     ErrReasonShareTooLarge,
	gpu.TooFewDevices:     ErrReasonTooFewDevices,
	gpu.TooFewFreeDevices: ErrReasonTooFewFree,
	gpu.NoDeviceWithShare: ErrReasonNoDeviceShare,
}

// Reason returns the constant Filter reason of an outcome.
func Reason(o gpu.Outcome) string { return reasons[o] }

// GPUFit filters nodes by their devices and owns the device reservations.
type GPUFit struct {
	handle  fwk.Handle
	shared  *shared.Shared
	args    *config.GPUFitArgs
	reqOpts gpu.RequestOptions
	hints   bool
	// scheduling is set by the first scheduling cycle. Plugins exist on
	// standbys too, but only the leader runs cycles (and a leader that loses
	// the lease exits), so it tells the requeue reconciler it may act.
	scheduling atomic.Bool
}

var (
	_ fwk.PreFilterPlugin   = &GPUFit{}
	_ fwk.FilterPlugin      = &GPUFit{}
	_ fwk.ReservePlugin     = &GPUFit{}
	_ fwk.PreBindPlugin     = &GPUFit{}
	_ fwk.BindPlugin        = &GPUFit{}
	_ fwk.EnqueueExtensions = &GPUFit{}
	_ fwk.SignPlugin        = &GPUFit{}
)

// New builds the plugin from validated args.
func New(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	args, err := argsFrom(obj)
	if err != nil {
		return nil, err
	}
	if err := validation.ValidateGPUFitArgs(field.NewPath("args"), args); err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	opts := gpu.NodeOptions{ProductLabel: args.GPUProductLabel, MemoryLabel: args.GPUMemoryLabel}
	for _, n := range args.GPUResourceNames {
		opts.ResourceNames = append(opts.ResourceNames, v1.ResourceName(n))
	}
	s := shared.For(h)
	context.AfterFunc(ctx, func() { shared.Forget(h) })
	s.Configure(opts)
	pl := &GPUFit{
		handle:  h,
		shared:  s,
		args:    args,
		reqOpts: gpu.RequestOptions{ResourceNames: opts.ResourceNames},
		hints:   args.Requeue.QueueingHints,
	}
	if f := h.SharedInformerFactory(); f != nil {
		pods, nodes := f.Core().V1().Pods().Informer(), f.Core().V1().Nodes().Informer()
		if err := pl.watch(pods, nodes); err != nil {
			return nil, err
		}
		if r := args.Requeue; r.Enabled && h.ClientSet() != nil {
			rec, err := requeue.New(requeue.Config{
				SchedulerName: profileName(h),
				Workers:       int(r.Workers),
				ResyncPeriod:  time.Duration(r.ResyncPeriodSeconds) * time.Second,
				BackoffBase:   time.Duration(r.BackoffBaseMilliseconds) * time.Millisecond,
				BackoffMax:    time.Duration(r.BackoffMaxSeconds) * time.Second,
				Explain:       r.ExplainPending,
				ExplainEvery:  time.Duration(r.ExplainMinIntervalSeconds) * time.Second,
			}, s, h, h.ClientSet(), pods, nodes, pl.reqOpts, pl.scheduling.Load)
			if err != nil {
				return nil, err
			}
			go rec.Run(ctx)
		}
	}
	return pl, nil
}

// profileName is the scheduler name of the profile the plugin runs in.
func profileName(h fwk.Handle) string {
	if p, ok := h.(interface{ ProfileName() string }); ok && p.ProfileName() != "" {
		return p.ProfileName()
	}
	return gpu.SchedulerName
}

func argsFrom(obj runtime.Object) (*config.GPUFitArgs, error) {
	switch a := obj.(type) {
	case nil:
		return scheme.DefaultGPUFitArgs(), nil
	case *config.GPUFitArgs:
		return a, nil
	default:
		return nil, fmt.Errorf("want args of type GPUFitArgs, got %T", obj)
	}
}

// watch wires the level checks to the informers, and drops reservations of
// deleted pods and the state of deleted nodes.
func (pl *GPUFit) watch(pods, nodes cache.SharedIndexInformer) error {
	if err := pl.shared.UseInformer(pods); err != nil {
		return err
	}
	if _, err := pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		DeleteFunc: func(obj interface{}) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if p, ok := obj.(*v1.Pod); ok {
				pl.shared.Tracker().Unreserve(p.UID)
			}
		},
	}); err != nil {
		return err
	}
	_, err := nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		DeleteFunc: func(obj interface{}) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if n, ok := obj.(*v1.Node); ok {
				pl.shared.Tracker().ForgetNode(n.Name)
			}
		},
	})
	return err
}

// Shared exposes the profile's GPU state to the requeue reconciler.
func (pl *GPUFit) Shared() *shared.Shared { return pl.shared }

// Args returns the plugin's validated args.
func (pl *GPUFit) Args() *config.GPUFitArgs { return pl.args }

// Name returns the plugin's name.
func (pl *GPUFit) Name() string { return Name }

// SignPod: feasibility depends on the parsed GPU request only.
func (pl *GPUFit) SignPod(_ context.Context, pod *v1.Pod) ([]fwk.SignFragment, *fwk.Status) {
	return Sign(pod, pl.reqOpts)
}

// Sign is the signature fragment both GPU plugins use.
func Sign(pod *v1.Pod, opts gpu.RequestOptions) ([]fwk.SignFragment, *fwk.Status) {
	req, err := gpu.ParseRequest(pod, opts)
	if err != nil {
		return nil, fwk.NewStatus(fwk.Unschedulable, "invalid GPU request cannot be signed")
	}
	return []fwk.SignFragment{{Key: gpu.Prefix + "request", Value: req}}, nil
}

// PreFilter parses the request once. Pods without GPUs skip Filter, but their
// request (CPU) is still recorded for scoring and the learned workload.
func (pl *GPUFit) PreFilter(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, _ []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	pl.scheduling.Store(true)
	req, err := gpu.ParseRequest(pod, pl.reqOpts)
	if err != nil {
		klog.FromContext(ctx).V(4).Info("invalid GPU request", "pod", klog.KObj(pod), "err", err)
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, err.Error())
	}
	shared.WriteRequest(cs, req)
	pl.shared.Observe(pod.UID, &req)
	if !req.HasGPU() {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	return nil, nil
}

// PreFilterExtensions: Filter derives device usage from the node's pods, so
// pods added or removed by preemption are seen without extensions.
func (pl *GPUFit) PreFilterExtensions() fwk.PreFilterExtensions { return nil }

// Filter checks the node device by device.
func (pl *GPUFit) Filter(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodeInfo fwk.NodeInfo) *fwk.Status {
	req, err := shared.ReadRequest(cs)
	if err != nil {
		return fwk.AsStatus(err)
	}
	st := pl.shared.State(nodeInfo)
	out, _, _ := st.Fit(req)
	if out == gpu.Fits {
		return nil
	}
	if logger := klog.FromContext(ctx).V(4); logger.Enabled() {
		logger.Info("node's GPUs do not fit", "pod", klog.KObj(pod), "node", klog.KObj(nodeInfo.Node()), "reason", reasons[out], "free", st.Free[:st.Count])
	}
	if out.Unresolvable() {
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, reasons[out])
	}
	return fwk.NewStatus(fwk.Unschedulable, reasons[out])
}

type reserveState struct {
	node   string
	choice gpu.Choice
}

func (r *reserveState) Clone() fwk.StateData { return r }

// Reserve takes the devices the profile's policy chooses, the same choice the
// score assumed, and records them until the pod's annotation is seen.
func (pl *GPUFit) Reserve(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodeName string) *fwk.Status {
	req, err := shared.ReadRequest(cs)
	if err != nil {
		return fwk.AsStatus(err)
	}
	if !req.HasGPU() {
		return nil
	}
	nodeInfo, err := pl.handle.SnapshotSharedLister().NodeInfos().Get(nodeName)
	if err != nil {
		return fwk.AsStatus(err)
	}
	st := pl.shared.StateExcluding(nodeInfo, pod.UID)
	choice, _, ok := pl.shared.Evaluate(st, req)
	if !ok {
		return fwk.NewStatus(fwk.Unschedulable, ErrReasonDevicesChanged)
	}
	pl.shared.Tracker().Reserve(nodeName, pod.UID, gpu.Reservation{Namespace: pod.Namespace, Name: pod.Name, Choice: choice, Since: time.Now()})
	cs.Write(reserveStateKey, &reserveState{node: nodeName, choice: choice})
	klog.FromContext(ctx).V(4).Info("reserved GPUs", "pod", klog.KObj(pod), "node", nodeName, "devices", choice.Devices(), "milli", choice.Milli)
	return nil
}

// Unreserve releases the pod's devices. It is idempotent.
func (pl *GPUFit) Unreserve(_ context.Context, _ fwk.CycleState, pod *v1.Pod, _ string) {
	pl.shared.Tracker().Unreserve(pod.UID)
}

// PreBindPreFlight: only GPU pods have an annotation to write, and only
// when it is not written with the binding. (Success here also makes the
// scheduler record the nominated node: one more write.)
func (pl *GPUFit) PreBindPreFlight(_ context.Context, cs fwk.CycleState, _ *v1.Pod, _ string) (*fwk.PreBindPreFlightResult, *fwk.Status) {
	if _, err := cs.Read(reserveStateKey); err != nil || pl.args.AssignmentWrite != config.WriteAtPreBind {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	return &fwk.PreBindPreFlightResult{AllowParallel: true}, nil
}

// Bind binds a GPU pod with its assignment annotation in the same write:
// the binding subresource merges the Binding's annotations into the pod, so
// the devices and spec.nodeName land together. Other pods are left to the
// next binder.
func (pl *GPUFit) Bind(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodeName string) *fwk.Status {
	if pl.args.AssignmentWrite != config.WriteAtBind {
		return fwk.NewStatus(fwk.Skip)
	}
	d, err := cs.Read(reserveStateKey)
	if err != nil {
		return fwk.NewStatus(fwk.Skip)
	}
	rs := d.(*reserveState)
	binding := &v1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID,
			Annotations: map[string]string{gpu.AnnotationAssignment: gpu.NewAssignment(nodeName, rs.choice).String()}},
		Target: v1.ObjectReference{Kind: "Node", Name: nodeName},
	}
	client := pl.handle.ClientSet()
	if client == nil {
		return fwk.AsStatus(fmt.Errorf("no client to bind pod %s/%s", pod.Namespace, pod.Name))
	}
	if err := client.CoreV1().Pods(pod.Namespace).Bind(ctx, binding, metav1.CreateOptions{}); err != nil {
		return fwk.AsStatus(fmt.Errorf("binding pod %s/%s to %s: %w", pod.Namespace, pod.Name, nodeName, err))
	}
	return nil
}

// PreBind writes the self-contained assignment annotation when configured
// to (assignmentWrite: PreBind).
func (pl *GPUFit) PreBind(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodeName string) *fwk.Status {
	d, err := cs.Read(reserveStateKey)
	if err != nil || pl.args.AssignmentWrite != config.WriteAtPreBind {
		return nil
	}
	rs := d.(*reserveState)
	value := gpu.NewAssignment(nodeName, rs.choice).String()
	if pod.Annotations[gpu.AnnotationAssignment] == value {
		return nil
	}
	// No longer pending: the reason goes in the same write. The reconciler
	// may have written it after our copy of the pod was taken, so always.
	ann := map[string]any{gpu.AnnotationAssignment: value, gpu.AnnotationPendingReason: nil}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
	if err != nil {
		return fwk.AsStatus(err)
	}
	cs2 := pl.handle.ClientSet()
	if cs2 == nil {
		return fwk.AsStatus(fmt.Errorf("no client to write %s", gpu.AnnotationAssignment))
	}
	if _, err := cs2.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fwk.AsStatus(fmt.Errorf("writing %s on pod %s/%s: %w", gpu.AnnotationAssignment, pod.Namespace, pod.Name, err))
	}
	return nil
}
