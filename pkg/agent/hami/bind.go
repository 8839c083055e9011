package hami

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/agent"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
)

// Binder is HAMi's device plugin's side of a bind: the plugin serves
// whichever pod holds the node's lock (hami-protocol.md §3, §4), so a bind
// takes the lock, checks its choice against what HAMi's scheduler placed
// meanwhile, checks the lock is still its own, and writes the device list
// with the binding; the plugin releases the lock once it has served the
// pod, the scheduler if the bind did not land.
type Binder struct {
	Client kubernetes.Interface
	// Expiry is HAMi's NodeLockTimeout: an older lock is anyone's.
	Expiry time.Duration
	// Wait is how long a bind waits for another bind's lock.
	Wait time.Duration
	// Poll is how often a waiting bind tries again without seeing the
	// lock change (a stale lock expires without an event).
	Poll time.Duration
	// Now is the clock (tests).
	Now func() time.Time
	// Abandoned reports whether a pod is one of the scheduler's own that
	// it is not binding now: a lock such a pod holds, unbound, was taken by
	// a bind that will not finish (the scheduler that took it died, its
	// standby took over). Once InFlight has passed since the lock was taken
	// (a Binding sent before the death could still land until then), it
	// is taken over, instead of blocking the node until Expiry.
	Abandoned func(*v1.Pod) bool
	InFlight  time.Duration
}

var _ agent.Binder = &Binder{}

// Plan implements agent.Binder: the pod's device list for the plugin.
func (b *Binder) Plan(pod *v1.Pod, node string, devs []gpu.Device, share gpu.DeviceShare) (agent.Delivery, error) {
	pd, err := Allocation(pod, devs, share)
	if err != nil {
		return nil, err
	}
	return &Delivery{b: b, pod: pod, node: node, Devices: pd}, nil
}

// NodeChanged implements agent.Binder.
func (b *Binder) NodeChanged(old, new *v1.Node) {
	if old.Annotations[AnnotationNodeLock] != new.Annotations[AnnotationNodeLock] {
		NodeLockChanged(new.Name)
	}
}

// Clear implements agent.Binder.
func (b *Binder) Clear() ([]string, []string) {
	return []string{AnnotationVGPUNode, AnnotationVGPUTime, AnnotationToAllocate, AnnotationAllocated, AnnotationBindPhase, AnnotationBindTime},
		[]string{AnnotationVGPUNode}
}

func (b *Binder) now() time.Time {
	if b.Now != nil {
		return b.Now()
	}
	return time.Now()
}

// Delivery is one pod's bind on a HAMi node.
type Delivery struct {
	b    *Binder
	pod  *v1.Pod
	node string
	// Devices is the device list the plugin reads.
	Devices PodDevices
	// lock is the lock's value once Hold has written it (set before the
	// write, so that a write whose answer is lost is released too); prev
	// the value before a renewal whose answer was lost.
	lock, prev atomic.Pointer[string]
}

var _ agent.Delivery = &Delivery{}

// Lock is the lock's value this delivery wrote, or "".
func (d *Delivery) Lock() string {
	if v := d.lock.Load(); v != nil {
		return *v
	}
	return ""
}

// Held implements agent.Delivery.
func (d *Delivery) Held() bool { return d.Lock() != "" }

// Hold implements agent.Delivery: it takes the node's lock, waiting up to
// Wait while another pod's bind holds it. A stale lock (older than Expiry,
// or whose pod is gone, has ended, is bound elsewhere or was deleted before
// it was bound here) is taken over.
func (d *Delivery) Hold(ctx context.Context) error {
	deadline := d.b.now().Add(d.b.Wait)
	// One bind of this process at a time waits for the node's lock: many
	// would each read the node and the holder on every change and poll,
	// and race for it when it is released, a herd that slowed a node's
	// binds threefold with 40 of them waiting (docs/benchmarks.md, kind).
	release, err := acquireTurn(ctx, d.node, d.b.Wait)
	if err != nil {
		return err
	}
	defer release()
	wrote := func(v string) { d.lock.Store(&v) }
	for {
		// Before the attempt, so that a release right after it wakes us.
		changed := lockWait(d.node)
		v, err := LockNode(ctx, d.b.Client, d.node, d.pod.Namespace, d.pod.Name, d.b.now(), d.b.Expiry, d.holderGone, wrote)
		if err == nil {
			d.lock.Store(&v)
			return nil
		}
		var locked *ErrLocked
		if !errors.As(err, &locked) {
			return fmt.Errorf("taking %s on node %s: %w", AnnotationNodeLock, d.node, err)
		}
		if d.b.now().After(deadline) {
			return &agent.ErrBusy{Err: err}
		}
		poll := d.b.Poll
		if poll <= 0 {
			poll = time.Second
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		case <-time.After(poll):
		}
	}
}

// holderGone: a holder that is gone, has ended or is being deleted never
// reaches the device plugin (the kubelet rejected it before Allocate, say).
// Bound to another node, or deleted before it was bound here, likewise. A
// pod bound here and being deleted may still be in its admission: it keeps
// the lock.
func (d *Delivery) holderGone(ctx context.Context, ns, name string, since time.Time) (bool, error) {
	p, err := d.b.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	return StaleHolder(p, d.node, since, d.b.now(), d.b.Abandoned, d.b.InFlight), nil
}

// StaleHolder reports whether a lock on node, taken at since for pod p,
// will never be served or was served already: p has ended, is bound to
// another node, was bound here and served (the device plugin ended its bind
// with success and the kubelet started the pod: a release the plugin lost
// would otherwise hold the node until expiry; the pod's status says it, not
// its annotation alone, which its owner could write), was deleted before it
// was bound here, or (with abandoned) is an unbound pod of the scheduler's
// own whose bind was abandoned at least inFlight ago.
func StaleHolder(p *v1.Pod, node string, since, now time.Time, abandoned func(*v1.Pod) bool, inFlight time.Duration) bool {
	switch {
	case p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed:
		return true
	case p.Spec.NodeName != "":
		if p.Spec.NodeName != node {
			return true
		}
		return p.Annotations[AnnotationBindPhase] == BindSuccess && p.Status.Phase == v1.PodRunning
	case p.DeletionTimestamp != nil:
		return true
	}
	return abandoned != nil && now.Sub(since) > inFlight && abandoned(p)
}

// Others implements agent.Delivery: HAMi's scheduler labels a pod for the
// node when it chooses its devices, before it takes the lock to bind it.
// A node name longer than a label value can be was never labelled (HAMi's
// own patch fails there): the pods bound to it are read instead.
func (d *Delivery) Others(ctx context.Context) ([]v1.Pod, error) {
	opts := metav1.ListOptions{LabelSelector: AnnotationVGPUNode + "=" + d.node}
	if len(validation.IsValidLabelValue(d.node)) > 0 {
		opts = metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", d.node).String()}
	}
	list, err := d.b.Client.CoreV1().Pods("").List(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("reading the pods HAMi placed on %s: %w", d.node, err)
	}
	return list.Items, nil
}

// Verify implements agent.Delivery: the node's lock is still this hold.
// It is written again with the time of now, in the same compare-and-swap:
// the lock's time then says when the binding was sent, which is what its
// expiry and a successor's judgement of an abandoned bind (StaleHolder)
// must count from, however long the bind took to get here.
func (d *Delivery) Verify(ctx context.Context) error {
	for attempt := 0; attempt < 5; attempt++ {
		n, err := d.b.Client.CoreV1().Nodes().Get(ctx, d.node, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("reading node %s to check its %s: %w", d.node, AnnotationNodeLock, err)
		}
		old := d.Lock()
		if got := n.Annotations[AnnotationNodeLock]; got != old {
			return fmt.Errorf("node %s: %s is %q, no longer this bind's %q", d.node, AnnotationNodeLock, got, old)
		}
		v := NodeLockValue(d.b.now(), d.pod.Namespace, d.pod.Name)
		if v == old {
			v = NodeLockValue(d.b.now().Add(time.Nanosecond), d.pod.Namespace, d.pod.Name)
		}
		// Stored first: a write whose answer is lost is released too.
		d.lock.Store(&v)
		err = patchLock(ctx, d.b.Client, d.node, n.ResourceVersion, &v)
		if err == nil {
			return nil
		}
		if !apierrors.IsConflict(err) {
			// It may have landed or not: Release tries both.
			d.prev.Store(&old)
			return fmt.Errorf("renewing %s on node %s: %w", AnnotationNodeLock, d.node, err)
		}
		// Refused: the hold is still the old value.
		d.lock.Store(&old)
	}
	return fmt.Errorf("node %s kept changing while its %s was checked", d.node, AnnotationNodeLock)
}

// Annotations implements agent.Delivery.
func (d *Delivery) Annotations(now time.Time) map[string]string {
	return BindAnnotations(d.node, d.Devices, now)
}

// Labels implements agent.Delivery: HAMi's monitor finds its containers by
// this label. It needs the right to patch pods, which the shipped RBAC does
// not grant (the binding carries annotations only). None on a node whose
// name no label value can hold.
func (d *Delivery) Labels() map[string]string {
	if len(validation.IsValidLabelValue(d.node)) > 0 {
		return nil
	}
	return map[string]string{AnnotationVGPUNode: d.node}
}

// Release implements agent.Delivery.
func (d *Delivery) Release(ctx context.Context) error {
	if p := d.prev.Load(); p != nil {
		if err := ReleaseNodeLock(ctx, d.b.Client, d.node, *p); err != nil {
			return err
		}
	}
	v := d.Lock()
	if v == "" {
		return nil
	}
	return ReleaseNodeLock(ctx, d.b.Client, d.node, v)
}

// NodeLockChanged wakes the binds waiting for the node's lock: the node
// informer saw it change (the device plugin releases it once it has served
// a pod, and the next bind should go at once).
func NodeLockChanged(node string) {
	lockWaiters.Lock()
	defer lockWaiters.Unlock()
	if ch := lockWaiters.m[node]; ch != nil {
		close(ch)
		delete(lockWaiters.m, node)
	}
}

// turns are the per-node turns to wait for a node's lock in this process.
var turns struct {
	sync.Mutex
	m map[string]chan struct{}
}

// acquireTurn waits up to wait for the node's turn.
func acquireTurn(ctx context.Context, node string, wait time.Duration) (func(), error) {
	turns.Lock()
	if turns.m == nil {
		turns.m = map[string]chan struct{}{}
	}
	ch := turns.m[node]
	if ch == nil {
		ch = make(chan struct{}, 1)
		turns.m[node] = ch
	}
	turns.Unlock()
	release := func() { <-ch }
	busy := &agent.ErrBusy{Err: fmt.Errorf("node %s: another bind of this scheduler is waiting for its %s", node, AnnotationNodeLock)}
	// A free turn is taken whatever the wait (a zero wait must not lose
	// the race against its own timer).
	select {
	case ch <- struct{}{}:
		return release, nil
	default:
	}
	if wait <= 0 {
		return nil, busy
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case ch <- struct{}{}:
		return release, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-t.C:
		return nil, busy
	}
}

var lockWaiters struct {
	sync.Mutex
	m map[string]chan struct{}
}

func lockWait(node string) <-chan struct{} {
	lockWaiters.Lock()
	defer lockWaiters.Unlock()
	if lockWaiters.m == nil {
		lockWaiters.m = map[string]chan struct{}{}
	}
	ch := lockWaiters.m[node]
	if ch == nil {
		ch = make(chan struct{})
		lockWaiters.m[node] = ch
	}
	return ch
}
