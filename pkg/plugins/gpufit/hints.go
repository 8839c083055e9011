package gpufit

import (
	"context"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	schedutil "k8s.io/kubernetes/pkg/scheduler/util"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/fault"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
)

// EventsToRegister lists every event that can turn a GPUFit rejection into a
// fit. Each hint asks one level question: could the pod fit on the node in
// the event, given that node's current devices and reservations?
func (pl *GPUFit) EventsToRegister(_ context.Context) ([]fwk.ClusterEventWithHint, error) {
	// Every event registered here makes the scheduling queue visit every
	// pending pod when it happens, whatever the hint answers: at tens of
	// thousands of pending pods that is the scheduler's main cost. So only
	// events that free or add GPUs come here. Not the general update of a
	// bound pod (every kubelet status update would be one): a pod that ends
	// leaves the scheduler's informer, as a deletion, and an assignment
	// rewritten on a bound pod frees nothing (the request counts; the
	// admission policy forbids the edit). Node annotations only where a
	// device agent reports devices in them (HAMi's registration and cordon;
	// its handshake and node lock change them all the time, and the hint
	// skips those at once).
	nodeActions := fwk.Add | fwk.UpdateNodeAllocatable | fwk.UpdateNodeLabel
	if pl.reqOpts.Agent != nil {
		nodeActions |= fwk.UpdateNodeAnnotation
	}
	events := []fwk.ClusterEventWithHint{
		{Event: fwk.ClusterEvent{Resource: fwk.Node, ActionType: nodeActions}, QueueingHintFn: pl.isSchedulableAfterNodeChange},
		{Event: fwk.ClusterEvent{Resource: fwk.AssignedPod, ActionType: fwk.Delete}, QueueingHintFn: pl.isSchedulableAfterPodDelete},
		{Event: fwk.ClusterEvent{Resource: fwk.TargetPod, ActionType: fwk.Update}, QueueingHintFn: pl.isSchedulableAfterTargetPodUpdate},
	}
	if pl.claims != nil {
		// DRA's GPUs: published, or freed by a claim.
		events = append(events,
			fwk.ClusterEventWithHint{Event: fwk.ClusterEvent{Resource: fwk.ResourceSlice, ActionType: fwk.Add | fwk.Update},
				QueueingHintFn: pl.isSchedulableAfterSliceChange},
			fwk.ClusterEventWithHint{Event: fwk.ClusterEvent{Resource: fwk.ResourceClaim, ActionType: fwk.Update | fwk.Delete},
				QueueingHintFn: pl.isSchedulableAfterClaimChange})
	}
	if pl.narrow != nil {
		// Bound pods that come or go without freeing a GPU: the queue
		// visits only the pods some other plugin rejected (narrow.go).
		events[1].PreQueueingHintFn = pl.narrowAfterPodDelete
		events = append(events, fwk.ClusterEventWithHint{Event: fwk.ClusterEvent{Resource: fwk.AssignedPod, ActionType: fwk.Add},
			QueueingHintFn: pl.isSchedulableAfterPodAdd, PreQueueingHintFn: pl.narrowAfterPodAdd})
	}
	for i := range events {
		if !pl.hints {
			// Measured baseline: every registered event requeues.
			events[i].QueueingHintFn = nil
			continue
		}
		events[i].QueueingHintFn = pl.hostless.ungateOnQueue(events[i].QueueingHintFn)
	}
	return events, nil
}

// hintMemo is what judging one event costs, done for the first pending pod
// and reused for the others: the scheduling queue runs the hints of every
// pod GPUFit rejected for one event back to back, with the same objects,
// inside its lock. At 20,000 pending pods a node label churned by GPU
// Feature Discovery must not reach the device math 20,000 times.
type hintMemo struct {
	kind     uint8
	old, new interface{}
	at       time.Time
	err      error
	// relevant: the event can change whether a GPU pod fits (devices came,
	// went or were freed); otherwise every pod is skipped at once.
	relevant bool
	node     *v1.Node
	st       *gpu.NodeState
	// What st was computed from, besides node: the count of changes of the
	// node's pods, and the tracker's version of its reservations. The state
	// is reused only while both hold, at O(1) per pending pod.
	gen, ver uint64
}

const (
	memoNode uint8 = iota + 1
	memoDelete
)

// memoTTL bounds how long one event's judgement is reused.
const memoTTL = time.Second

func (pl *GPUFit) eventMemo(kind uint8, oldObj, newObj interface{}, judge func(m *hintMemo)) *hintMemo {
	if m := pl.memo.Load(); m != nil && m.kind == kind && m.old == oldObj && m.new == newObj && time.Since(m.at) < memoTTL && pl.current(m) {
		return m
	}
	m := &hintMemo{kind: kind, old: oldObj, new: newObj, at: time.Now()}
	judge(m)
	pl.memo.Store(m)
	return m
}

// judgeNode computes the node's current state once per event; nil node:
// the node is gone, nothing fits there.
func (pl *GPUFit) judgeNode(m *hintMemo, node *v1.Node) {
	m.relevant, m.node = true, node
	if node == nil {
		return
	}
	// The counts first: a change after them only makes the memo stale.
	m.gen, m.ver = pl.shared.PodGen(node.Name), pl.shared.Tracker().NodeVersion(node.Name)
	if pods, ok := pl.shared.PodsOnNode(node.Name); ok {
		m.st = pl.shared.Tracker().Compute(node, pods, 0, 0, "", false)
	} else {
		// Without an informer only the inventory is known: answer Queue
		// whenever it could host the pod.
		m.st = gpu.NewNodeState(node.Name, gpu.ReadInventory(node, pl.shared.Tracker().Options()), 0)
	}
}

// current reports whether a memo's device state still is the level truth:
// the queue also replays events that came during a pod's cycle when the
// cycle ends, after the cluster may have moved on.
func (pl *GPUFit) current(m *hintMemo) bool {
	if m.st == nil || m.node == nil {
		return true // judged from the objects alone
	}
	return pl.shared.PodGen(m.node.Name) == m.gen && pl.shared.Tracker().NodeVersion(m.node.Name) == m.ver
}

// fitsNow is the level check of one pod against the event's node state.
func (pl *GPUFit) fitsNow(logger klog.Logger, pod *v1.Pod, m *hintMemo) fwk.QueueingHint {
	if m.node == nil {
		return fwk.QueueSkip
	}
	req, err := gpu.ParseRequest(pod, pl.reqOpts)
	if err != nil {
		// Only the pod's own update can fix an invalid request.
		return fwk.QueueSkip
	}
	if !req.HasGPU() {
		return fwk.QueueSkip
	}
	out, _, _ := m.st.Fit(&req)
	if out == gpu.Fits {
		logger.V(5).Info("pod now fits the node's GPUs", "pod", klog.KObj(pod), "node", klog.KObj(m.node))
		return fwk.Queue
	}
	logger.V(5).Info("pod still does not fit the node's GPUs", "pod", klog.KObj(pod), "node", klog.KObj(m.node), "reason", reasons[out])
	return fwk.QueueSkip
}

func (pl *GPUFit) isSchedulableAfterNodeChange(logger klog.Logger, pod *v1.Pod, oldObj, newObj interface{}) (fwk.QueueingHint, error) {
	m := pl.eventMemo(memoNode, oldObj, newObj, func(m *hintMemo) {
		old, node, err := schedutil.As[*v1.Node](oldObj, newObj)
		if err != nil {
			m.err = err
			return
		}
		if old != nil && pl.shared.SameDevices(old, node) {
			// A GFD timestamp, a node lock taken or released, a
			// heartbeat: no device came or went.
			return
		}
		pl.judgeNode(m, node)
	})
	if m.err != nil {
		return fwk.Queue, m.err
	}
	if !m.relevant {
		return fwk.QueueSkip, nil
	}
	return pl.fitsNow(logger, pod, m), nil
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
	m := pl.eventMemo(memoDelete, oldObj, newObj, func(m *hintMemo) {
		deleted, _, err := schedutil.As[*v1.Pod](oldObj, newObj)
		if err != nil {
			m.err = err
			return
		}
		node := heldNode(deleted)
		if node == "" || !pl.usesGPU(deleted) || fault.DropFreedGPU() {
			return
		}
		pl.judgeBoundNode(logger, m, node)
	})
	return pl.answer(logger, pod, m)
}

func (pl *GPUFit) answer(logger klog.Logger, pod *v1.Pod, m *hintMemo) (fwk.QueueingHint, error) {
	switch {
	case m.err != nil:
		return fwk.Queue, m.err
	case !m.relevant:
		return fwk.QueueSkip, nil
	case m.node == nil && m.st == nil && pl.handle.SharedInformerFactory() == nil:
		return fwk.Queue, nil
	}
	return pl.fitsNow(logger, pod, m), nil
}

// judgeBoundNode judges the node a deleted pod held GPUs on; a node that is
// gone cannot take the pod. Without an informer nothing is known: Queue.
func (pl *GPUFit) judgeBoundNode(logger klog.Logger, m *hintMemo, node string) {
	m.relevant = true
	if pl.handle.SharedInformerFactory() == nil {
		return
	}
	pl.judgeNode(m, pl.nodeOf(logger, node))
}

// heldNode is the node whose GPUs a pod holds in the scheduler's view: its
// own, or the one it is nominated to (the framework counts a nominated pod
// there, so its deletion, or a changed nomination, which the scheduler
// reports as a bound pod's deletion, frees them).
func heldNode(p *v1.Pod) string {
	if p.Spec.NodeName != "" {
		return p.Spec.NodeName
	}
	return p.Status.NominatedNodeName
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

// sameGPURequest compares what ParseRequest reads, without parsing.
func sameGPURequest(a, b *v1.Pod, opts gpu.RequestOptions) bool {
	return gpu.SameRequestAnnotations(a, b) && gpu.WholeGPUs(a, opts) == gpu.WholeGPUs(b, opts)
}
