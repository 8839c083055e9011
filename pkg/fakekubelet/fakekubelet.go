// Package fakekubelet plays the kubelet for fake nodes (label
// gpu-scheduler.io/fake-node=true): it renews their node leases and Ready
// condition so that a node lifecycle controller (kind) keeps them Ready,
// moves pods bound to them to Running, and finishes their graceful deletes.
// Nothing is executed. It is level-based: every resync looks at all pods.
//
// Its heartbeat costs the API server what real kubelets' do, no more: one
// lease update per node per HeartbeatPeriod from the lease it last wrote
// (one node after another: a round of 5,000 at 2 ms each fits the period),
// and Ready re-posted once per StatusReportPeriod, spread evenly over the
// period (a kubelet's nodeStatusReportFrequency). At 5,000 nodes the first
// version (a GET and a PUT per lease, Ready every 40 s) took 0.78–1.11 of
// the 2 cores here on an idle cluster, and posted as many node updates per
// second as GPU Feature Discovery's label churn.
package fakekubelet

import (
	"context"
	"hash/fnv"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/fakehami"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/fleet"
)

// Kubelet is the fake kubelet of all fake nodes.
type Kubelet struct {
	client  kubernetes.Interface
	factory informers.SharedInformerFactory
	nodes   cache.Indexer
	pods    cache.Indexer
	queue   workqueue.TypedRateLimitingInterface[string]
	// HeartbeatPeriod is how often node leases are renewed (a kubelet's
	// lease duration over 4), on the heartbeat's 10 s ticks: a period
	// under 10 s is 10 s. 0 renews none: for a control plane with no node
	// lifecycle controller to read them.
	HeartbeatPeriod time.Duration
	// StatusReportPeriod is how often each node's Ready is re-posted, in
	// whole ticks.
	StatusReportPeriod time.Duration
	now                func() time.Time
	start, leasesAt    time.Time
	leases             map[string]*coordinationv1.Lease
	// HAMi is the device plugin of the nodes that register HAMi devices:
	// pods there are admitted through it, as a kubelet's device manager
	// calls the plugin before containers start.
	HAMi *fakehami.Plugin
}

// New watches fake nodes and all bound pods.
func New(client kubernetes.Interface) *Kubelet {
	f := informers.NewSharedInformerFactoryWithOptions(client, 0)
	k := &Kubelet{
		client:             client,
		factory:            f,
		queue:              workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
		HeartbeatPeriod:    10 * time.Second,
		StatusReportPeriod: 5 * time.Minute,
		now:                time.Now,
		leases:             map[string]*coordinationv1.Lease{},
		HAMi:               fakehami.New(client),
	}
	nodeInf := f.InformerFor(&v1.Node{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return coreinformers.NewFilteredNodeInformer(c, resync, cache.Indexers{}, func(o *metav1.ListOptions) {
			o.LabelSelector = fleet.LabelFake + "=true"
		})
	})
	podInf := f.Core().V1().Pods().Informer()
	k.nodes, k.pods = nodeInf.GetIndexer(), podInf.GetIndexer()
	enqueue := func(obj interface{}) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if p, ok := obj.(*v1.Pod); ok && p.Spec.NodeName != "" {
			if key, err := cache.MetaNamespaceKeyFunc(p); err == nil {
				k.queue.Add(key)
			}
		}
	}
	podInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, n interface{}) { enqueue(n) },
	})
	return k
}

// Run works until ctx ends.
func (k *Kubelet) Run(ctx context.Context) {
	defer k.queue.ShutDown()
	k.factory.Start(ctx.Done())
	k.factory.WaitForCacheSync(ctx.Done())
	for i := 0; i < 4; i++ {
		go wait.UntilWithContext(ctx, k.worker, time.Second)
	}
	go wait.NonSlidingUntilWithContext(ctx, k.heartbeat, heartbeatTick)
	// Resync: a missed event only delays a pod.
	go wait.UntilWithContext(ctx, func(context.Context) {
		for _, o := range k.pods.List() {
			if p := o.(*v1.Pod); p.Spec.NodeName != "" {
				key, _ := cache.MetaNamespaceKeyFunc(p)
				k.queue.Add(key)
			}
		}
	}, 30*time.Second)
	<-ctx.Done()
}

func (k *Kubelet) worker(ctx context.Context) {
	for {
		key, quit := k.queue.Get()
		if quit {
			return
		}
		if err := k.syncPod(ctx, key); err != nil {
			klog.FromContext(ctx).V(4).Info("fake kubelet retry", "pod", key, "err", err)
			k.queue.AddRateLimited(key)
		} else {
			k.queue.Forget(key)
		}
		k.queue.Done(key)
	}
}

func (k *Kubelet) managed(node string) bool {
	_, ok, _ := k.nodes.GetByKey(node)
	return ok
}

func (k *Kubelet) syncPod(ctx context.Context, key string) error {
	o, ok, err := k.pods.GetByKey(key)
	if err != nil || !ok {
		return err
	}
	pod := o.(*v1.Pod)
	if !k.managed(pod.Spec.NodeName) {
		return nil
	}
	if pod.DeletionTimestamp != nil {
		// A kubelet confirms a graceful delete once containers stopped.
		err := k.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: ptr.To[int64](0),
			Preconditions:      &metav1.Preconditions{UID: &pod.UID},
		})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil
		}
		return err
	}
	if pod.Status.Phase != v1.PodPending {
		return nil
	}
	now := metav1.Now()
	if o, ok, _ := k.nodes.GetByKey(pod.Spec.NodeName); ok && k.HAMi != nil && fakehami.Serves(o.(*v1.Node)) {
		if err := k.HAMi.Admit(ctx, o.(*v1.Node), pod); err != nil {
			// As the kubelet's device manager: the pod fails admission.
			p := pod.DeepCopy()
			p.Status.Phase = v1.PodFailed
			p.Status.Reason = "UnexpectedAdmissionError"
			p.Status.Message = "Allocate failed due to " + err.Error()
			_, err = k.client.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
			if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
				return nil
			}
			return err
		}
	}
	p := pod.DeepCopy()
	p.Status.Phase = v1.PodRunning
	p.Status.StartTime = &now
	p.Status.HostIP = "127.0.0.1"
	p.Status.Conditions = upsert(p.Status.Conditions,
		v1.PodCondition{Type: v1.PodInitialized, Status: v1.ConditionTrue, LastTransitionTime: now},
		v1.PodCondition{Type: v1.ContainersReady, Status: v1.ConditionTrue, LastTransitionTime: now},
		v1.PodCondition{Type: v1.PodReady, Status: v1.ConditionTrue, LastTransitionTime: now})
	p.Status.ContainerStatuses = nil
	for _, c := range p.Spec.Containers {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, v1.ContainerStatus{
			Name: c.Name, Image: c.Image, Ready: true, Started: ptr.To(true),
			State: v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: now}},
		})
	}
	_, err = k.client.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		// Gone, or changed: the update event brings it back.
		return nil
	}
	return err
}

func upsert(conds []v1.PodCondition, add ...v1.PodCondition) []v1.PodCondition {
	for _, a := range add {
		found := false
		for i := range conds {
			if conds[i].Type == a.Type {
				conds[i] = a
				found = true
			}
		}
		if !found {
			conds = append(conds, a)
		}
	}
	return conds
}

// heartbeatTick is the heartbeat's period: Ready is re-posted for a
// StatusReportPeriod/heartbeatTick-th of the nodes on each tick.
const heartbeatTick = 10 * time.Second

// heartbeat renews the fake nodes' leases when due, and re-posts Ready for
// the nodes of this tick's slot (by a hash of the name, so that nodes coming
// and going move no other node's slot). The slot follows the clock, so a
// round slower than a tick skips slots rather than stretching the period;
// a node whose Ready went stale or false is posted at once.
func (k *Kubelet) heartbeat(ctx context.Context) {
	now := k.now()
	if k.start.IsZero() {
		k.start = now
	}
	slots := uint32(max(k.StatusReportPeriod/heartbeatTick, 1))
	slot := uint32(now.Sub(k.start)/heartbeatTick) % slots
	leaseDue := k.HeartbeatPeriod > 0 && (k.leasesAt.IsZero() || now.Sub(k.leasesAt) >= k.HeartbeatPeriod-heartbeatTick/2)
	if leaseDue {
		k.leasesAt = now
	}
	for _, o := range k.nodes.List() {
		n := o.(*v1.Node)
		if leaseDue {
			k.renewLease(ctx, n)
		}
		if slotOf(n.Name, slots) == slot || !ready(n, now, k.StatusReportPeriod+2*heartbeatTick) {
			k.renewReady(ctx, n)
		}
	}
	for name := range k.leases {
		if _, ok, _ := k.nodes.GetByKey(name); !ok {
			delete(k.leases, name)
		}
	}
}

func slotOf(node string, slots uint32) uint32 {
	h := fnv.New32a()
	h.Write([]byte(node))
	return h.Sum32() % slots
}

// renewLease updates the lease last written (a kubelet keeps it too), and
// reads or creates it only when that fails.
func (k *Kubelet) renewLease(ctx context.Context, n *v1.Node) {
	leases := k.client.CoordinationV1().Leases(v1.NamespaceNodeLease)
	now := metav1.NewMicroTime(time.Now())
	if l := k.leases[n.Name]; l != nil {
		l = l.DeepCopy()
		l.Spec.RenewTime = &now
		if l, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err == nil {
			k.leases[n.Name] = l
			return
		}
		delete(k.leases, n.Name)
	}
	l, err := leases.Get(ctx, n.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		l, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: n.Name, Namespace: v1.NamespaceNodeLease,
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: n.Name, UID: n.UID}}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(n.Name), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &now},
		}, metav1.CreateOptions{})
	} else if err == nil {
		l.Spec.RenewTime = &now
		l, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	}
	if err != nil {
		klog.FromContext(ctx).V(4).Info("fake kubelet lease", "node", n.Name, "err", err)
		return
	}
	k.leases[n.Name] = l
}

// ready reports whether n is Ready with a heartbeat younger than age.
func ready(n *v1.Node, now time.Time, age time.Duration) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady && c.Status == v1.ConditionTrue && now.Sub(c.LastHeartbeatTime.Time) < age {
			return true
		}
	}
	return false
}

func (k *Kubelet) renewReady(ctx context.Context, n *v1.Node) {
	nn := n.DeepCopy()
	var conds []v1.NodeCondition
	for _, c := range nn.Status.Conditions {
		if c.Type != v1.NodeReady {
			conds = append(conds, c)
		}
	}
	nn.Status.Conditions = append(conds, fleet.ReadyCondition())
	if _, err := k.client.CoreV1().Nodes().UpdateStatus(ctx, nn, metav1.UpdateOptions{}); err != nil {
		klog.FromContext(ctx).V(4).Info("fake kubelet ready", "node", n.Name, "err", err)
	}
}
