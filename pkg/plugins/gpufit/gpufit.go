// Package gpufit is the GPUFit plugin: it reads a pod's GPU request once,
// filters nodes per device (whole GPUs, a share of one GPU, the model), keeps
// in-flight device reservations, and writes the assignment annotation.
package gpufit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/features"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/agent"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/agent/dra"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/agent/hami"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config/scheme"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config/validation"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/fault"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/overcommit"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/plugins/internal/shared"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/requeue"
)

// Name is the plugin's name in the registry and in configs.
const Name = "GPUFit"

const reserveStateKey fwk.StateKey = "Reserve" + Name

// Filter reasons: constant, so that "0/N nodes are available" aggregates them.
const (
	ErrReasonNoGPU            = "node(s) had no GPU"
	ErrReasonModel            = "node(s) had no allowed GPU model"
	ErrReasonMemoryUnknown    = "node(s) did not report GPU memory per device"
	ErrReasonShareTooLarge    = "node(s) had GPUs with less memory than requested"
	ErrReasonTooFewDevices    = "node(s) had fewer GPUs than requested"
	ErrReasonTooFewFree       = "node(s) had too few free GPUs"
	ErrReasonNoDeviceShare    = "node(s) had no single GPU with enough free milli-GPU"
	ErrReasonTooManyDevices   = "node(s) had more than 64 GPUs (more than gpu-scheduler tracks)"
	ErrReasonOvercommitted    = "node(s) had GPUs overcommitted by the pods bound to them"
	ErrReasonDevicesChanged   = "node's free GPUs changed during scheduling"
	ErrReasonBindInDoubt      = "the pod's previous bind failed but may still land; it waits until the API server says"
	ErrReasonNoDelivery       = "node(s) had no device plugin that delivers GPU shares (HAMi's); request nvidia.com/gpu: 1 with the share on such nodes"
	ErrReasonDeviceNotAllowed = "node(s) had none of the GPUs the pod allows (nvidia.com/use-gpuuuid, nouse-gpuuuid)"
	ErrReasonNodeLocked       = "node's HAMi lock is held by another pod's bind"
	ErrReasonUnregistered     = "node(s) had a device plugin that has not registered its GPUs yet (HAMi's hami.io/node-nvidia-register)"
	ErrReasonGangMemberFailed = "another pod of its gang failed after the gang was placed: the gang is tried again"
)

var reasons = map[gpu.Outcome]string{
	gpu.NoGPU:             ErrReasonNoGPU,
	gpu.ModelNotAllowed:   ErrReasonModel,
	gpu.MemoryUnknown:     ErrReasonMemoryUnknown,
	gpu.ShareTooLarge:     ErrReasonShareTooLarge,
	gpu.TooFewDevices:     ErrReasonTooFewDevices,
	gpu.TooFewFreeDevices: ErrReasonTooFewFree,
	gpu.NoDeviceWithShare: ErrReasonNoDeviceShare,
	gpu.TooManyDevices:    ErrReasonTooManyDevices,
	gpu.Overcommitted:     ErrReasonOvercommitted,
	gpu.NoShareDelivery:   ErrReasonNoDelivery,
	gpu.DeviceNotAllowed:  ErrReasonDeviceNotAllowed,
	gpu.AgentUnregistered: ErrReasonUnregistered,
}

// Reason returns the constant Filter reason of an outcome.
func Reason(o gpu.Outcome) string { return reasons[o] }

// GPUFit filters nodes by their devices and owns the device reservations.
type GPUFit struct {
	handle fwk.Handle
	shared *shared.Shared
	// claims is the DRA index (nil when DRA is not read).
	claims  *dra.Index
	args    *config.GPUFitArgs
	reqOpts gpu.RequestOptions
	hints   bool
	// ctx lives as long as the plugin: release checks run under it.
	ctx context.Context
	// inFlight is how long a bind whose outcome is unknown may still land on
	// the server: the API server's default request timeout, plus margin.
	// (Atomic: tests shorten it while a check runs.)
	inFlight atomic.Int64
	// rec is the profile's requeue reconciler (nil when off).
	rec *requeue.Reconciler
	// memo is the last event the queueing hints judged.
	memo atomic.Pointer[hintMemo]
	// narrow names the pending pods worth visiting for a bound pod that
	// comes or goes (nil without hints or informers).
	narrow *narrower
	// hostless gates the pods waiting for a model no node hosts (nil
	// without hints or the reconciler).
	hostless *hostless
	// binder is the node agent's side of a bind (nil without an agent).
	binder agent.Binder
	// waits is whether the framework keeps waiting pods: one built without
	// (tests, the simulator) panics when asked.
	waitsOnce sync.Once
	waits     bool
}

// bindInFlight is GPUFit.inFlight's default.
const bindInFlight = 65 * time.Second

// abandonAfter is how long after a hold's renewal (just before its
// binding was sent, hami.Delivery.Verify) a successor may judge the bind
// abandoned: a Binding can land until the API server's request timeout
// (60 s by default; a longer --request-timeout needs more), and the
// clocks of two replicas may differ by a little.
const abandonAfter = bindInFlight + 25*time.Second

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
		if n == hami.ResourceGPU && args.HAMi.Enabled {
			// HAMi's device plugin serves NVIDIA GPUs only.
			opts.Agent = hami.Agent{ProductLabel: args.GPUProductLabel}
		}
	}
	s := shared.For(h)
	context.AfterFunc(ctx, func() { shared.Forget(h) })
	var claims *dra.Index
	if f := h.SharedInformerFactory(); f != nil && args.DRA.Enabled && len(args.DRA.Drivers) > 0 {
		x, fresh, err := s.ClaimIndex(args.DRA.Drivers)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", Name, err)
		}
		if fresh {
			if err := feedClaimIndex(x, f, s.Released); err != nil {
				return nil, fmt.Errorf("%s: %w", Name, err)
			}
		}
		opts.Claims = x
		claims = x
	}
	if err := s.Configure(opts); err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	pl := &GPUFit{
		handle:  h,
		shared:  s,
		args:    args,
		reqOpts: gpu.RequestOptions{ResourceNames: opts.ResourceNames, Agent: opts.Agent, NeedsDelivery: !args.AccountingOnlySharing},
		hints:   args.Requeue.QueueingHints,
		ctx:     ctx,
		claims:  claims,
	}
	pl.inFlight.Store(int64(bindInFlight))
	if opts.Agent != nil && h.ClientSet() != nil {
		pl.binder = &hami.Binder{Client: h.ClientSet(), Expiry: time.Duration(args.HAMi.NodeLockExpirySeconds) * time.Second,
			Wait: time.Duration(args.HAMi.LockWaitSeconds) * time.Second, Poll: time.Second,
			Abandoned: pl.abandoned, InFlight: abandonAfter}
	}
	if f := h.SharedInformerFactory(); f != nil {
		pods, nodes := f.Core().V1().Pods().Informer(), f.Core().V1().Nodes().Informer()
		// A bound pod waiting on a deferred resize sits in the pool too,
		// where the narrowing does not follow it.
		if pl.hints && !utilfeature.DefaultFeatureGate.Enabled(features.InPlacePodVerticalScalingSchedulerPreemption) {
			pl.narrow = newNarrower(h, pods)
			go pl.narrow.prune(ctx)
			if _, err := pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
				AddFunc:    pl.narrow.observe,
				UpdateFunc: func(_, obj interface{}) { pl.narrow.observe(obj) },
				DeleteFunc: func(obj interface{}) {
					if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
						obj = t.Obj
					}
					if p, ok := obj.(*v1.Pod); ok {
						pl.narrow.forget(p)
					}
				},
			}); err != nil {
				return nil, err
			}
		}
		// One accounting per process: its handlers and monitor run once,
		// whichever profile comes first.
		if s.Once("watch") {
			if len(args.VolatileNodeLabels) > 0 {
				// Before the informers start (New runs first).
				if err := nodes.SetTransform(dropLabels(args.VolatileNodeLabels)); err != nil {
					return nil, fmt.Errorf("volatileNodeLabels: %w", err)
				}
			}
			if err := pl.watch(pods, nodes); err != nil {
				return nil, err
			}
			resync := time.Duration(args.Requeue.ResyncPeriodSeconds) * time.Second
			mon, err := overcommit.New(s, pods, nodes, h.EventRecorder(), s.Leading, pl.reqOpts, resync,
				time.Duration(args.HAMi.NodeLockExpirySeconds)*time.Second)
			if err != nil {
				return nil, err
			}
			if claims != nil {
				claims.AddListener(mon.Touch)
			}
			if opts.Agent != nil && h.ClientSet() != nil {
				mon.ReleaseStaleLocks(h.ClientSet(), pl.abandoned, abandonAfter)
			}
			go mon.Run(ctx)
		}
		if r := args.Requeue; r.Enabled && h.ClientSet() != nil {
			var activator requeue.Activator = h
			if pl.hints {
				nodeLister := f.Core().V1().Nodes().Lister()
				pl.hostless = newHostless(pods.GetStore(), func() ([]*v1.Node, error) { return nodeLister.List(labels.Everything()) },
					func(n *v1.Node) *gpu.NodeState { return s.Tracker().Compute(n, nil, 0, 0, "", false) }, s.SameDevices)
				if err := pl.hostless.watch(pods, nodes); err != nil {
					return nil, err
				}
				activator = ungating{h: pl.hostless, next: h}
			}
			rec, err := requeue.New(requeue.Config{
				SchedulerName: ProfileName(h),
				Workers:       int(r.Workers),
				ResyncPeriod:  time.Duration(r.ResyncPeriodSeconds) * time.Second,
				BackoffBase:   time.Duration(r.BackoffBaseMilliseconds) * time.Millisecond,
				BackoffMax:    time.Duration(r.BackoffMaxSeconds) * time.Second,
				Explain:       r.ExplainPending,
				ExplainEvery:  time.Duration(r.ExplainMinIntervalSeconds) * time.Second,
				ClearClient:   explainClient(h, r.ExplainQPS, r.ExplainBurst),
			}, s, activator, explainClient(h, r.ExplainQPS, r.ExplainBurst), pods, nodes, pl.reqOpts, s.Leading)
			if err != nil {
				return nil, err
			}
			pl.rec = rec
			s.OnRelease(rec.MarkDirty)
			go rec.Run(ctx)
		}
	}
	return pl, nil
}

// abandoned reports whether a pod is one of this profile's that this
// process is not binding: a node lock it holds was taken by a bind that
// died with its scheduler (hami.StaleHolder).
func (pl *GPUFit) abandoned(p *v1.Pod) bool {
	if p.Spec.SchedulerName != ProfileName(pl.handle) {
		return false
	}
	_, _, binding := pl.shared.Tracker().Reserved(p.UID)
	return !binding
}

// ProfileName is the scheduler name of the profile the plugin runs in.
func ProfileName(h fwk.Handle) string {
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
		AddFunc: func(obj interface{}) { pl.podChanged(nil, obj); pl.trackPending(obj) },
		UpdateFunc: func(old, obj interface{}) {
			pl.podChanged(old, obj)
			pl.trackPending(obj)
			if p, ok := obj.(*v1.Pod); ok {
				pl.nominationChanged(old, p)
			}
		},
		DeleteFunc: func(obj interface{}) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			pl.podChanged(nil, obj)
			if p, ok := obj.(*v1.Pod); ok {
				pl.shared.Tracker().Unreserve(p.UID)
				pl.shared.Tracker().SetPending(p, "", time.Time{})
				pl.shared.Tracker().Denominate(p.UID)
			}
		},
	}); err != nil {
		return err
	}
	_, err := nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(old, obj interface{}) {
			o, ok1 := old.(*v1.Node)
			n, ok2 := obj.(*v1.Node)
			if ok1 && ok2 && pl.binder != nil {
				pl.binder.NodeChanged(o, n)
			}
		},
		DeleteFunc: func(obj interface{}) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if n, ok := obj.(*v1.Node); ok {
				pl.shared.Tracker().ForgetNode(n.Name)
				pl.shared.ForgetPodGen(n.Name)
			}
		},
	})
	return err
}

// nominationChanged drops the devices held for a preemptor once it is
// bound (they are its own), or once its nomination is cleared or moved to
// a node it holds nothing on.
func (pl *GPUFit) nominationChanged(old interface{}, p *v1.Pod) {
	tr := pl.shared.Tracker()
	if p.Spec.NodeName != "" {
		tr.Denominate(p.UID)
		return
	}
	if o, ok := old.(*v1.Pod); ok && o.Status.NominatedNodeName != "" && o.Status.NominatedNodeName != p.Status.NominatedNodeName {
		if _, here := tr.Nominated(p.UID, p.Status.NominatedNodeName); !here {
			tr.Denominate(p.UID)
		}
	}
}

// podChanged counts a change of the pods bound to a node: the hints' memo of
// a node's state holds only while the count does.
func (pl *GPUFit) podChanged(old, obj interface{}) {
	if o, ok := old.(*v1.Pod); ok && o.Spec.NodeName != "" {
		pl.shared.BumpPodGen(o.Spec.NodeName)
	}
	if p, ok := obj.(*v1.Pod); ok && p.Spec.NodeName != "" {
		if o, ok := old.(*v1.Pod); !ok || o.Spec.NodeName != p.Spec.NodeName {
			pl.shared.BumpPodGen(p.Spec.NodeName)
		}
	}
}

// trackPending follows the pods another scheduler chose HAMi devices for
// and has not bound yet (HAMi's scheduler writes its record in Filter and
// binds later): they hold those devices meanwhile, as HAMi counts them.
// Our own pods carry our assignment; their reservation counts instead.
func (pl *GPUFit) trackPending(obj interface{}) {
	p, ok := obj.(*v1.Pod)
	if !ok {
		return
	}
	tr := pl.shared.Tracker()
	var node string
	var since time.Time
	ok = false
	if a := pl.reqOpts.Agent; a != nil {
		node, since, ok = a.Pending(p)
	}
	if !ok {
		tr.SetPending(p, "", time.Time{})
		return
	}
	// For as long as a bind under the agent's hold may take.
	tr.SetPending(p, node, since.Add(time.Duration(pl.args.HAMi.NodeLockExpirySeconds)*time.Second))
}

// sameUses reports whether two versions of a pod carry the same record of
// what they hold on the node.
func sameUses(a gpu.Agent, p, q *v1.Pod, node string) bool {
	if a == nil {
		return true
	}
	up, okp := a.Uses(p, node)
	uq, okq := a.Uses(q, node)
	return okp == okq && slices.Equal(up, uq)
}

// TrackerOf is the device accounting of a framework whose profile runs
// GPUFit (tools that drive a framework, as kubectl gpu whatif does).
func TrackerOf(h fwk.Handle) *gpu.Tracker { return shared.For(h).Tracker() }

// WorkloadOf is the target workload GPUScore measures fragmentation against
// in h's profile: static, or learned from the pods GPUFit saw.
func WorkloadOf(h fwk.Handle) *gpu.Workload { return shared.For(h).Workload() }

// ClaimsOf is the index of the GPUs DRA drivers publish and the claims on
// them that the profile's accounting reads (nil when it reads none).
func ClaimsOf(h fwk.Handle) *dra.Index { return shared.For(h).Claims() }

// SetAllocator has a profile's devices handed out by a on every node, in
// place of the policy's choice (the simulator's model of a fleet whose
// devices DRA's allocator hands out); nil restores the policy's.
func SetAllocator(h fwk.Handle, a func(*gpu.NodeState, *gpu.Request) (gpu.Choice, bool)) {
	shared.For(h).SetAllocator(a)
}

// PinWorkload makes wl the target workload of h's profile, in place of
// what it would learn (kubectl gpu: the scheduler's published target).
func PinWorkload(h fwk.Handle, wl *gpu.Workload) {
	s := shared.For(h)
	s.SetScoring(s.Scoring(), nil, wl)
}

// LearnerOf is the learner of h's profile, nil for a static workload.
func LearnerOf(h fwk.Handle) *gpu.Learner { return shared.For(h).Learner() }

// ResumeWorkload has h's profile go on learning from a target another
// learner published (kubectl gpu: the scheduler's), as the scheduler goes
// on learning from the pods it sees. Where it cannot, the target is pinned
// as published (resumed false) and why says why: the profile does not
// learn, the export does not say what it was learned from (a scheduler
// from before it did), or not in a form a learner takes.
func ResumeWorkload(h fwk.Handle, e gpu.ExportedWorkload) (resumed bool, why string, err error) {
	s := shared.For(h)
	switch l := s.Learner(); {
	case l == nil:
		why = "its profile here does not learn"
	case e.SeenPods == 0 && len(e.Kinds) == 0:
		why = "it does not say what it was learned from"
	default:
		if rerr := l.Resume(e); rerr == nil {
			return true, "", nil
		} else {
			why = fmt.Sprintf("it could not be learned from (%v)", rerr)
		}
	}
	wl, err := e.Workload()
	if err != nil {
		return false, why, err
	}
	PinWorkload(h, wl)
	return false, why, nil
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
func (pl *GPUFit) PreFilter(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodes []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	// Only the leader runs cycles: without leader election, this tells the
	// reconciler and the monitor that this process may act.
	pl.shared.SetScheduling()
	if pl.narrow != nil {
		pl.narrow.move(pod, stAttempting)
	}
	if pl.rec != nil {
		// This attempt's PostFilter, if any, tells what blocks the pod now.
		pl.rec.ForgetRejection(pod.UID)
	}
	pl.hostless.clear(pod.UID)
	if node, ok := pl.shared.InDoubt(pod.UID); ok {
		// Its devices on node stay held; placing it again could bind it
		// twice, or free them while the first bind lands. It is activated
		// once the API server says.
		klog.FromContext(ctx).V(4).Info("waiting for a doubtful bind", "pod", klog.KObj(pod), "node", node)
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, ErrReasonBindInDoubt)
	}
	req, err := gpu.ParseRequest(pod, pl.reqOpts)
	if err != nil {
		klog.FromContext(ctx).V(4).Info("invalid GPU request", "pod", klog.KObj(pod), "err", err)
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, err.Error())
	}
	if !req.HasGPU() && pl.claims != nil && len(pod.Spec.ResourceClaims) > 0 {
		// GPUs asked through claims: scored here, judged and allocated
		// by the DynamicResources plugin (Filter is skipped).
		if r, ok := pl.claimRequest(pod); ok {
			r.CPU, r.Memory, r.Models = req.CPU, req.Memory, req.Models
			req = r
		}
	}
	shared.WriteRequest(cs, req)
	pl.shared.Observe(pod.UID, &req)
	if !req.HasGPU() || req.ByClaim {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	if !req.Models.Empty() {
		if why := pl.hostedNowhere(nodes, &req); why != nil {
			// Waiting for a model no node has (a pool scaled to zero, a
			// model not bought yet): every node would say so in Filter,
			// after the other filters ran on all of them. A backlog of such
			// pods, retried by the queue at least every 5 minutes, would
			// cost a full pass each and crowd out the pods that fit.
			// PreEnqueue keeps it out of the queue until that changes
			// (hostless.go).
			pl.hostless.record(pod, &req, why)
			return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, why...)
		}
	}
	return nil, nil
}

// hostedNowhere is nil when some node has a device of a model the request
// allows; otherwise the reasons Filter would give on the nodes, each once.
// The nodes' states are the cached ones Filter reads.
func (pl *GPUFit) hostedNowhere(nodes []fwk.NodeInfo, req *gpu.Request) []string {
	var outs uint64 // a bit per outcome seen
	for _, ni := range nodes {
		if ni.Node() == nil {
			continue
		}
		out := pl.shared.State(ni).Hosts(req)
		if out == gpu.Fits {
			return nil
		}
		outs |= 1 << uint(out)
	}
	if outs == 0 {
		return []string{reasons[gpu.ModelNotAllowed]}
	}
	// In a fixed order: the message is what users read and compare.
	var why []string
	for out := gpu.Outcome(0); out < 64; out++ {
		if outs&(1<<uint(out)) != 0 {
			why = append(why, reasons[out])
		}
	}
	return why
}

// PreFilterExtensions: Filter derives device usage from the node's pods, so
// pods added or removed by preemption are seen without extensions.
func (pl *GPUFit) PreFilterExtensions() fwk.PreFilterExtensions { return nil }

// Filter checks the node device by device.
func (pl *GPUFit) Filter(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodeInfo fwk.NodeInfo) *fwk.Status {
	req, pin, err := shared.ReadPinned(cs)
	if err != nil {
		return fwk.AsStatus(err)
	}
	st := pl.shared.State(nodeInfo)
	var out gpu.Outcome
	if pin != nil && pin.Node == st.Name {
		out = st.FitOn(req, pin.Choice.Mask)
	} else {
		out, _, _ = st.Fit(req)
	}
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
	seq    uint64
	// bind is set once a write that binds the pod has started: the pod may
	// be bound even if the cycle fails, so Unreserve checks before it
	// releases the devices.
	bind atomic.Pointer[bindAttempt]
	// delivery is the bind through the node's agent when it delivers the
	// pod's GPUs (nil otherwise).
	delivery agent.Delivery
	// claimed: the node's GPUs are DRA's, handed out by its claims.
	claimed bool
}

// bindAttempt is what a failed cycle knows of its bind.
type bindAttempt struct {
	// notBound is true when a read after the failure showed the pod unbound
	// and nothing can still land: release at once.
	notBound bool
	// mayLand is false when the request was refused by the server or never
	// reached it: once the pod is seen unbound, nothing can bind it.
	mayLand bool
	at      time.Time
}

func (r *reserveState) Clone() fwk.StateData { return r }

// Reserve takes the devices the profile's policy chooses, the same choice the
// score assumed, and records them until the pod's annotation is seen.
func (pl *GPUFit) Reserve(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodeName string) *fwk.Status {
	s := pl.reserve(ctx, cs, pod, nodeName)
	if s.IsSuccess() && pl.narrow != nil {
		pl.narrow.move(pod, stBinding)
	}
	return s
}

func (pl *GPUFit) reserve(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodeName string) *fwk.Status {
	req, pin, err := shared.ReadPinned(cs)
	if err != nil {
		return fwk.AsStatus(err)
	}
	if !req.HasGPU() {
		return nil
	}
	if fault.FailReserve(pod.Name) && !cs.IsPodGroupSchedulingCycle() {
		return fwk.NewStatus(fwk.Unschedulable, ErrReasonDevicesChanged+" (fault injected)")
	}
	nodeInfo, err := pl.handle.SnapshotSharedLister().NodeInfos().Get(nodeName)
	if err != nil {
		return fwk.AsStatus(err)
	}
	st := pl.shared.ForPod(pl.handle, nodeInfo, pod, true)
	var choice gpu.Choice
	var ok bool
	if pin != nil && pin.Node == nodeName {
		// A pod group's preemption dry run: the devices its plan frees.
		choice, ok = pin.Choice, st.FitOn(req, pin.Choice.Mask) == gpu.Fits
	} else {
		choice, ok = pl.shared.Choose(st, req)
	}
	if !ok && req.ByClaim {
		// DRA's allocator found room our count does not see (a claim
		// freed since): it decides; the claim counts once allocated.
		return nil
	}
	if !ok {
		return fwk.NewStatus(fwk.Unschedulable, ErrReasonDevicesChanged)
	}
	seq := pl.shared.Tracker().Reserve(nodeName, pod.UID, gpu.Reservation{Namespace: pod.Namespace, Name: pod.Name, Choice: choice, Since: time.Now()})
	rs := &reserveState{node: nodeName, choice: choice, seq: seq, claimed: st.Claimed}
	if st.Delivers() && pl.binder != nil && gpu.WholeGPUs(pod, pl.reqOpts) > 0 {
		// The device plugin is asked for the pod's GPUs: it hands out
		// the devices chosen here, with their limits.
		var devs []gpu.Device
		for _, i := range choice.Devices() {
			devs = append(devs, st.Devices[i])
		}
		var err error
		if rs.delivery, err = pl.binder.Plan(pod, nodeName, devs, choice.Share); err != nil {
			pl.shared.Tracker().UnreserveIf(pod.UID, seq)
			return fwk.AsStatus(fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err))
		}
	}
	cs.Write(reserveStateKey, rs)
	klog.FromContext(ctx).V(4).Info("reserved GPUs", "pod", klog.KObj(pod), "node", nodeName, "devices", choice.Devices(), "milli", choice.Milli)
	return nil
}

func readReserve(cs fwk.CycleState) *reserveState {
	if cs == nil {
		return nil
	}
	d, err := cs.Read(reserveStateKey)
	if err != nil {
		return nil
	}
	rs, _ := d.(*reserveState)
	return rs
}

// Unreserve releases the pod's devices, unless a bind that may have landed
// on the server was attempted: then they stay held until a read shows the
// pod unbound (and no request can still be in flight), bound elsewhere, or
// gone; a pod bound here keeps them until its assignment is seen. Releasing
// on a client-side error alone would free devices the pod holds. It is
// idempotent.
func (pl *GPUFit) Unreserve(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, _ string) {
	if pl.narrow != nil {
		// Back to the pool with whatever rejected it after the filters.
		pl.narrow.move(pod, stAttempting)
	}
	if sg := pod.Spec.SchedulingGroup; sg != nil && sg.PodGroupName != nil && cs != nil && !cs.IsPodGroupSchedulingCycle() {
		pl.rejectWaitingGang(ctx, pod, *sg.PodGroupName)
	}
	rs := readReserve(cs)
	if rs == nil {
		return // this cycle reserved nothing
	}
	b := rs.bind.Load()
	if d := rs.delivery; d != nil && d.Held() && (b == nil || b.notBound) {
		// Nothing of this bind reached the node: let the next one in.
		go pl.release(pod, rs.node, d)
	}
	if b != nil && !b.notBound {
		klog.FromContext(ctx).V(2).Info("bind failed but may have landed: keeping the GPUs until the pod is seen", "pod", klog.KObj(pod), "node", rs.node)
		pl.shared.Tracker().SetUncertain(pod.UID, rs.seq, true)
		go pl.verifyRelease(pod, rs.node, rs.seq, b.at, b.mayLand, rs.delivery)
		return
	}
	pl.shared.Tracker().UnreserveIf(pod.UID, rs.seq)
}

// rejectWaitingGang rejects the members of a pod's gang that wait at
// Permit, once the pod failed after its group's placement was committed (a
// Reserve, a Permit or a bind that failed; not the tentative placements of
// the group's own cycle and its preemption's dry run, which are undone by
// design). Upstream's GangScheduling lets them wait for their quorum until
// its Permit timeout (5 minutes), each holding its GPUs, for a member that
// is back in the queue: rejected now, they release them, and the whole gang
// is tried again.
func (pl *GPUFit) rejectWaitingGang(ctx context.Context, pod *v1.Pod, group string) {
	pl.waitsOnce.Do(func() {
		defer func() { _ = recover() }()
		pl.handle.IterateOverWaitingPods(func(fwk.WaitingPod) {})
		pl.waits = true
	})
	if !pl.waits {
		return
	}
	var rejected []*v1.Pod
	pl.handle.IterateOverWaitingPods(func(wp fwk.WaitingPod) {
		p := wp.GetPod()
		if p.UID == pod.UID || p.Namespace != pod.Namespace || p.Spec.SchedulingGroup == nil ||
			p.Spec.SchedulingGroup.PodGroupName == nil || *p.Spec.SchedulingGroup.PodGroupName != group {
			return
		}
		rejected = append(rejected, p)
		wp.Reject(Name, ErrReasonGangMemberFailed)
	})
	if len(rejected) > 0 {
		klog.FromContext(ctx).V(2).Info("rejected the gang's members waiting at Permit: a member failed", "pod", klog.KObj(pod), "podGroup", group, "rejected", klog.KObjSlice(rejected))
	}
}

// verifyRelease reads the pod from the API server until it knows whether the
// failed bind landed, and releases the reservation only if it did not. Then
// the pod may be scheduled again (it is activated), and pods waiting for the
// devices are told.
func (pl *GPUFit) verifyRelease(pod *v1.Pod, node string, seq uint64, at time.Time, mayLand bool, d agent.Delivery) {
	logger := klog.FromContext(pl.ctx).WithValues("pod", klog.KObj(pod), "node", node)
	tr := pl.shared.Tracker()
	client := pl.handle.ClientSet()
	released, pending, boundHere := false, true, false
	held := d != nil && d.Held()
	defer func() {
		if held && !boundHere {
			// The bind did not land here: the node's device plugin will
			// not serve this pod for it (released before the pod may try
			// again; a new attempt's hold is another).
			pl.release(pod, node, d)
		}
		if pending && pl.ctx.Err() == nil {
			pl.handle.Activate(logger, map[string]*v1.Pod{pod.Namespace + "/" + pod.Name: pod})
		}
		if released {
			pl.shared.Released()
		}
	}()
	backoff := 100 * time.Millisecond
	for {
		if _, r, ok := tr.Reserved(pod.UID); !ok || r.Seq != seq {
			// Replaced, or retired (bound here, seen with its record).
			if held && client != nil {
				ctx, cancel := context.WithTimeout(pl.ctx, 10*time.Second)
				p, err := client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
				cancel()
				// Unknown (unreadable) keeps the lock to its expiry; a
				// pod that is gone cannot be served: release it.
				boundHere = (err != nil && !apierrors.IsNotFound(err)) || (err == nil && p.UID == pod.UID && p.Spec.NodeName == node)
			}
			return
		}
		var p *v1.Pod
		var err error
		if client == nil {
			err = fmt.Errorf("no client")
		} else {
			ctx, cancel := context.WithTimeout(pl.ctx, 10*time.Second)
			p, err = client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
			cancel()
		}
		switch {
		case apierrors.IsNotFound(err) || (err == nil && p.UID != pod.UID):
			released, pending = tr.UnreserveIf(pod.UID, seq), false
			logger.V(2).Info("released the GPUs of a failed bind: the pod is gone")
			return
		case err == nil && p.Spec.NodeName == node:
			// Bound here after all: the assignment came with the binding
			// and retires the reservation once the scheduler sees it.
			tr.SetUncertain(pod.UID, seq, false)
			pending, boundHere = false, true
			logger.V(2).Info("a bind reported as failed had landed: the GPUs stay held")
			return
		case err == nil && p.Spec.NodeName != "":
			released, pending = tr.UnreserveIf(pod.UID, seq), false
			logger.V(2).Info("released the GPUs of a failed bind: the pod is bound elsewhere", "boundTo", p.Spec.NodeName)
			return
		case err == nil && (!mayLand || time.Since(at) > time.Duration(pl.inFlight.Load())):
			released = tr.UnreserveIf(pod.UID, seq)
			logger.V(2).Info("released the GPUs of a failed bind: the pod is unbound and no request can still land")
			return
		}
		wait := backoff
		if err == nil {
			wait = min(backoff, time.Until(at.Add(time.Duration(pl.inFlight.Load())))+time.Millisecond)
		} else {
			logger.V(3).Info("cannot read the pod to release its GPUs yet", "err", err)
		}
		select {
		case <-pl.ctx.Done():
			return
		case <-time.After(wait):
		}
		backoff = min(2*backoff, 10*time.Second)
	}
}

// bindFailed records what a failed bind leaves behind: if the server may
// have applied it, the pod is read back. A pod bound to the node means the
// bind worked: the caller reports success. Otherwise the attempt is kept for
// Unreserve.
func (pl *GPUFit) bindFailed(ctx context.Context, rs *reserveState, pod *v1.Pod, nodeName string, bindErr error) (bound bool) {
	var p *v1.Pod
	var err error
	if client := pl.handle.ClientSet(); client != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		p, err = client.CoreV1().Pods(pod.Namespace).Get(rctx, pod.Name, metav1.GetOptions{})
		cancel()
	} else {
		err = fmt.Errorf("no client")
	}
	if err == nil && p.UID == pod.UID && p.Spec.NodeName == nodeName && gpu.HasAssignment(p, nodeName) {
		klog.FromContext(ctx).Info("the bind reported an error but the pod is bound: keeping it", "pod", klog.KObj(pod), "node", nodeName, "err", bindErr)
		return true
	}
	// A definite answer (the server refused, or was never reached), and
	// the pod seen unbound afterwards: nothing can land.
	mayLand := !isDefinite(bindErr)
	rs.bind.Store(&bindAttempt{notBound: !mayLand && err == nil && p.Spec.NodeName == "", mayLand: mayLand, at: time.Now()})
	return false
}

// isDefinite reports whether a bind error means the request was not applied
// and cannot be later: the server's refusal, or a connection it never
// accepted. After a timeout or a broken connection it may still be.
func isDefinite(err error) bool {
	if errors.Is(err, syscall.ECONNREFUSED) {
		return true
	}
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return false
	}
	if apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) || apierrors.IsInternalError(err) ||
		apierrors.IsServiceUnavailable(err) || apierrors.IsUnexpectedServerError(err) {
		return false
	}
	code := status.Status().Code
	return code >= 400 && code < 500
}

// PreBindPreFlight: only GPU pods have an annotation to write, and only
// when it is not written with the binding (assignmentWrite: PreBind; the
// agent's hold is then taken here too). (Success here also makes the
// scheduler record the nominated node: one more write.) A bind through an
// agent does not run in parallel: it runs after VolumeBinding and
// DynamicResources, which may wait for minutes, so that its hold cannot
// expire while they do.
func (pl *GPUFit) PreBindPreFlight(_ context.Context, cs fwk.CycleState, _ *v1.Pod, _ string) (*fwk.PreBindPreFlightResult, *fwk.Status) {
	rs := readReserve(cs)
	if rs == nil || pl.args.AssignmentWrite != config.WriteAtPreBind {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	return &fwk.PreBindPreFlightResult{AllowParallel: rs.delivery == nil}, nil
}

// Bind binds a GPU pod with its assignment annotation in the same write:
// the binding subresource merges the Binding's annotations into the pod, so
// the devices and spec.nodeName land together. Other pods are left to the
// next binder.
func (pl *GPUFit) Bind(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodeName string) *fwk.Status {
	rs := readReserve(cs)
	if rs == nil {
		return fwk.NewStatus(fwk.Skip)
	}
	if pl.args.AssignmentWrite != config.WriteAtBind {
		// The next binder binds it: a failure from here on may be one
		// after which the bind still lands, and its error is not seen
		// here.
		rs.bind.Store(&bindAttempt{mayLand: true, at: time.Now()})
		return fwk.NewStatus(fwk.Skip)
	}
	if rs.delivery != nil {
		// Here, after every PreBind: the hold lasts only as long as
		// its own bind.
		if st := pl.hold(ctx, pod, nodeName, rs); st != nil {
			return st // Unreserve releases it
		}
	}
	binding := &v1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID,
			Annotations: pl.bindAnnotations(rs, nodeName)},
		Target: v1.ObjectReference{Kind: "Node", Name: nodeName},
	}
	client := pl.handle.ClientSet()
	if client == nil {
		return fwk.AsStatus(fmt.Errorf("no client to bind pod %s/%s", pod.Namespace, pod.Name))
	}
	rs.bind.Store(&bindAttempt{mayLand: true, at: time.Now()})
	if err := client.CoreV1().Pods(pod.Namespace).Bind(ctx, binding, metav1.CreateOptions{}); err != nil {
		if pl.bindFailed(ctx, rs, pod, nodeName, err) {
			return nil
		}
		return fwk.AsStatus(fmt.Errorf("binding pod %s/%s to %s: %w", pod.Namespace, pod.Name, nodeName, err))
	}
	return nil
}

// PreBind writes the self-contained assignment annotation when configured
// to (assignmentWrite: PreBind). This needs the right to patch pods, which
// the shipped RBAC does not grant (docs/api.md).
func (pl *GPUFit) PreBind(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodeName string) *fwk.Status {
	rs := readReserve(cs)
	if rs == nil {
		return nil
	}
	if pl.args.AssignmentWrite != config.WriteAtPreBind {
		return nil // written with the binding
	}
	if rs.delivery != nil {
		if st := pl.hold(ctx, pod, nodeName, rs); st != nil {
			return st // Unreserve releases it
		}
	}
	ann := map[string]any{}
	for k, v := range pl.bindAnnotations(rs, nodeName) {
		ann[k] = v
	}
	meta := map[string]any{"annotations": ann}
	if rs.delivery != nil {
		// HAMi's scheduler labels the pod too (its monitor reads it).
		// Only keys given: a null map would remove all the pod's labels.
		if l := rs.delivery.Labels(); len(l) > 0 {
			meta["labels"] = l
		}
	} else {
		// An earlier attempt on a HAMi node may have left its record
		// (the cached pod may not show it yet): HAMi would keep counting
		// the pod there. Removing absent keys changes nothing.
		keys, labelKeys := []string(nil), []string(nil)
		if pl.binder != nil {
			keys, labelKeys = pl.binder.Clear()
		}
		for _, k := range keys {
			ann[k] = nil
		}
		if len(labelKeys) > 0 {
			drop := map[string]any{}
			for _, k := range labelKeys {
				drop[k] = nil
			}
			meta["labels"] = drop
		}
	}
	patch, err := json.Marshal(map[string]any{"metadata": meta})
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
	if rs.delivery != nil {
		// The default binder binds next, at once.
		if err := rs.delivery.Verify(ctx); err != nil {
			return fwk.AsStatus(err)
		}
	}
	return nil
}

// bindAnnotations are what the bind writes on the pod: the assignment, and
// on a node whose HAMi device plugin delivers the pod's GPUs, what that
// plugin reads.
func (pl *GPUFit) bindAnnotations(rs *reserveState, node string) map[string]string {
	if rs.claimed {
		// DRA's allocator chooses the devices and its claim records
		// them: an assignment of ours would name others.
		return nil
	}
	a := map[string]string{gpu.AnnotationAssignment: gpu.NewAssignment(node, rs.choice).String()}
	if rs.delivery != nil {
		for k, v := range rs.delivery.Annotations(time.Now()) {
			a[k] = v
		}
	}
	return a
}

// hold takes the node agent's hold for the bind (HAMi: the node's lock,
// waiting up to hami.lockWaitSeconds while another pod's bind holds it),
// checks the devices chosen against what the agent's other clients placed
// meanwhile, and checks the hold is still this bind's: the device plugin
// serves whichever pod holds it.
func (pl *GPUFit) hold(ctx context.Context, pod *v1.Pod, node string, rs *reserveState) *fwk.Status {
	d := rs.delivery
	if err := d.Hold(ctx); err != nil {
		if agent.IsBusy(err) {
			return fwk.NewStatus(fwk.Unschedulable, ErrReasonNodeLocked+": "+err.Error())
		}
		return fwk.AsStatus(err)
	}
	if st := pl.recheck(ctx, pod, node, rs); st != nil {
		return st
	}
	if err := d.Verify(ctx); err != nil {
		return fwk.AsStatus(err)
	}
	return nil
}

// release gives back a hold whose bind did not land: also while the
// scheduler shuts down (a helm upgrade), when pl.ctx is already cancelled;
// a hold left behind blocks the node until it is judged abandoned.
func (pl *GPUFit) release(pod *v1.Pod, node string, d agent.Delivery) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(pl.ctx), 10*time.Second)
	defer cancel()
	if err := d.Release(ctx); err != nil {
		klog.FromContext(pl.ctx).Info("could not release the node agent's hold; it expires", "pod", klog.KObj(pod), "node", node, "err", err)
	}
}

// recheck runs once the agent's hold is taken: HAMi's scheduler writes its
// device choice on a pod (and labels it) before it takes the lock to bind
// it, so a choice made from the informer's view can have been overtaken.
// The pods the agent names (Others) are read from the API server and added
// to the informer's view for this check only (the informer catches up on
// its own): bound ones as pods of the node, unbound ones by their record.
// The devices chosen must still take the share.
func (pl *GPUFit) recheck(ctx context.Context, pod *v1.Pod, node string, rs *reserveState) *fwk.Status {
	f := pl.handle.SharedInformerFactory()
	if f == nil {
		return nil
	}
	others, err := rs.delivery.Others(ctx)
	if err != nil {
		return fwk.AsStatus(err)
	}
	n, err := f.Core().V1().Nodes().Lister().Get(node)
	if err != nil {
		return fwk.AsStatus(err)
	}
	pods, ok := pl.shared.PodsOnNode(node)
	if !ok {
		return nil
	}
	tr := pl.shared.Tracker()
	known := make(map[types.UID]int, len(pods))
	for i, p := range pods {
		known[p.UID] = i
	}
	var inFlight []*v1.Pod
	for i := range others {
		p := &others[i]
		if p.UID == pod.UID || p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed || p.DeletionTimestamp != nil {
			continue
		}
		switch {
		case p.Spec.NodeName == node:
			if at, ok := known[p.UID]; ok {
				pods[at] = p
			} else {
				pods = append(pods, p)
			}
		case p.Spec.NodeName == "" && p.Annotations[gpu.AnnotationAssignment] == "":
			// Unless the tracker counts this very record here already.
			if q := tr.PendingOn(p.UID, node); q == nil || !sameUses(tr.RequestOptions().Agent, q, p, node) {
				inFlight = append(inFlight, p)
			}
		}
	}
	st := tr.Compute(n, pods, 0, 0, pod.UID, false)
	if len(inFlight) > 0 && st.Delivers() {
		st = st.Clone()
		agent := tr.RequestOptions().Agent
		for _, p := range inFlight {
			if uses, ok := agent.Uses(p, node); ok {
				st.TakeUses(uses)
			}
		}
	}
	if !st.Admits(rs.choice) {
		klog.FromContext(ctx).V(2).Info("the devices chosen were taken before the bind", "pod", klog.KObj(pod), "node", node, "devices", rs.choice.Devices())
		return fwk.NewStatus(fwk.Unschedulable, ErrReasonDevicesChanged)
	}
	return nil
}
