package overcommit

import (
	"context"
	"fmt"
	"strconv"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/component-base/metrics"
	"k8s.io/klog/v2"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/agent/hami"
)

// ReasonHandshakeFailed is on a pod whose GPUs the node's device plugin
// did not deliver.
const ReasonHandshakeFailed = "GPUHandshakeFailed"

// HandshakeTimeout is how long a bound pod may wait for the device plugin to
// take its devices, by default (HAMi's node lock expiry; GPUFit passes its
// hami.nodeLockExpirySeconds): past it, the plugin never will, and the
// node's lock goes to the next pod.
const HandshakeTimeout = 5 * time.Minute

var handshakeFailures = metrics.NewCounterVec(&metrics.CounterOpts{
	Subsystem: "gpu_scheduler", Name: "hami_handshake_failures_total", StabilityLevel: metrics.ALPHA,
	Help: "Pods whose GPUs HAMi's device plugin did not deliver, by reason: failed (the plugin refused them) or expired (it never took them).",
}, []string{"reason"})

// handshake reports, once per pod, a failed or expired handshake: the
// counter on every replica, the Event from the leader. The pod's devices
// are freed once it is gone (a failed pod holds none).
func (m *Monitor) handshake(p *v1.Pod, reason, note string) {
	m.mu.Lock()
	told := m.handshook[p.UID]
	if !told {
		if len(m.handshook) >= 100000 {
			m.handshook = map[types.UID]bool{}
		}
		m.handshook[p.UID] = true
	}
	m.mu.Unlock()
	if told {
		return
	}
	handshakeFailures.WithLabelValues(reason).Inc()
	if m.recorder != nil && (m.active == nil || m.active()) {
		m.recorder.Eventf(p, nil, v1.EventTypeWarning, ReasonHandshakeFailed, "Scheduling", note)
	}
}

// ReleaseStaleLocks has the leader release a node's HAMi lock whose holder
// will never be served or was served already (hami.StaleHolder: ended,
// gone, bound elsewhere, served by the device plugin and started, or an unbound
// pod of ours whose bind was abandoned, inFlight after the lock was taken),
// each time it judges the node: after the holder's own change,
// and at every resync. Nobody else releases such a lock: HAMi's scheduler
// waits out its expiry.
func (m *Monitor) ReleaseStaleLocks(client kubernetes.Interface, abandoned func(*v1.Pod) bool, inFlight time.Duration) {
	m.staleLock = func(p *v1.Pod, node string, since time.Time) bool {
		return hami.StaleHolder(p, node, since, time.Now(), abandoned, inFlight)
	}
	m.releaseLock = func(ctx context.Context, node, value string) (bool, error) {
		return hami.ReleaseStale(ctx, client, node, value, func(p *v1.Pod, since time.Time) bool { return m.staleLock(p, node, since) })
	}
}

// checkLock releases the node's lock if the informer shows its holder
// stale or gone (the API server has the last word, in hami.ReleaseStale).
func (m *Monitor) checkLock(ctx context.Context, node *v1.Node) {
	v, ok := node.Annotations[hami.AnnotationNodeLock]
	if !ok || m.releaseLock == nil || m.pods == nil {
		return
	}
	since, ns, name, err := hami.ParseNodeLock(v)
	if err != nil || name == "" {
		return
	}
	if obj, exists, _ := m.pods.GetIndexer().GetByKey(ns + "/" + name); exists {
		if p, ok := obj.(*v1.Pod); ok && !m.staleLock(p, node.Name, since) {
			return
		}
	}
	released, err := m.releaseLock(ctx, node.Name, v)
	logger := klog.FromContext(ctx)
	switch {
	case err != nil:
		logger.Info("could not release a stale HAMi lock; it expires", "node", klog.KObj(node), "lock", v, "err", err)
	case released:
		logger.Info("released a stale HAMi lock: its pod ended, went elsewhere, was served already, or its bind was abandoned", "node", klog.KObj(node), "pod", klog.KRef(ns, name))
	}
}

// checkHandshake looks at a bound pod's bind phase.
func (m *Monitor) checkHandshake(p *v1.Pod, now time.Time) {
	if p.Spec.NodeName == "" || p.Annotations[hami.AnnotationVGPUNode] != p.Spec.NodeName {
		return
	}
	switch p.Annotations[hami.AnnotationBindPhase] {
	case hami.BindFailed:
		why := ""
		if p.Status.Message != "" {
			why = ": " + p.Status.Message
		}
		m.handshake(p, "failed", fmt.Sprintf("HAMi's device plugin on node %s refused the GPUs chosen for the pod (bind phase failed)%s", p.Spec.NodeName, why))
	case hami.BindAllocating:
		if p.Status.Phase == v1.PodFailed {
			// The kubelet rejected the pod before the device plugin saw
			// it; the lock it held is released (checkLock).
			m.handshake(p, "failed", fmt.Sprintf("the pod failed on node %s before HAMi's device plugin delivered its GPUs (bind phase still allocating): %s %s",
				p.Spec.NodeName, p.Status.Reason, p.Status.Message))
			return
		}
		sec, err := strconv.ParseInt(p.Annotations[hami.AnnotationBindTime], 10, 64)
		if err != nil || p.Status.Phase != v1.PodPending || now.Sub(time.Unix(sec, 0)) < m.handshakeTimeout {
			return
		}
		m.handshake(p, "expired", fmt.Sprintf("HAMi's device plugin on node %s has not taken the pod's GPUs %s after its bind (bind phase still allocating); "+
			"the node's lock has expired and other pods bind there again; the pod keeps its GPUs until it is deleted", p.Spec.NodeName, m.handshakeTimeout))
	}
}
