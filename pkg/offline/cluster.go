package offline

import (
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	internalcache "k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"
)

// Cluster is the scheduler's view of nodes and bound pods. It serves the
// framework's SharedLister from the scheduler's own Snapshot, except that
// nodes are listed in a fixed order: the scheduler breaks score ties by the
// order of the feasible nodes, and a replay must be deterministic.
type Cluster struct {
	*internalcache.Snapshot
	nodes  []fwk.NodeInfo
	byName map[string]int
}

var _ fwk.SharedLister = &Cluster{}

// NewCluster lists the nodes in the given order, with the given bound pods.
func NewCluster(nodes []*v1.Node, pods []*v1.Pod) (*Cluster, error) {
	snap := internalcache.NewSnapshot(pods, nodes)
	c := &Cluster{Snapshot: snap, byName: make(map[string]int, len(nodes))}
	for i, n := range nodes {
		ni, err := snap.Get(n.Name)
		if err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, ni)
		c.byName[n.Name] = i
	}
	return c, nil
}

// NodeInfos lists nodes in the cluster's order.
func (c *Cluster) NodeInfos() fwk.NodeInfoLister { return (*nodeLister)(c) }

// Nodes returns the node infos in order (do not modify the slice).
func (c *Cluster) Nodes() []fwk.NodeInfo { return c.nodes }

// Bind adds a pod to its node (pod.Spec.NodeName), as the scheduler's cache
// does when the binding is confirmed.
func (c *Cluster) Bind(pod *v1.Pod) error {
	i, ok := c.byName[pod.Spec.NodeName]
	if !ok {
		return fmt.Errorf("pod %s/%s: no node %q", pod.Namespace, pod.Name, pod.Spec.NodeName)
	}
	c.nodes[i].(*framework.NodeInfo).AddPod(pod)
	return nil
}

// Remove takes a bound pod off its node, as the scheduler's cache does when
// the pod is deleted.
func (c *Cluster) Remove(pod *v1.Pod) error {
	i, ok := c.byName[pod.Spec.NodeName]
	if !ok {
		return fmt.Errorf("pod %s/%s: no node %q", pod.Namespace, pod.Name, pod.Spec.NodeName)
	}
	return c.nodes[i].(*framework.NodeInfo).RemovePod(klog.Background(), pod)
}

type nodeLister Cluster

func (l *nodeLister) List() ([]fwk.NodeInfo, error) { return l.nodes, nil }

func (l *nodeLister) filter(keep func(fwk.NodeInfo) bool) ([]fwk.NodeInfo, error) {
	var out []fwk.NodeInfo
	for _, n := range l.nodes {
		if keep(n) {
			out = append(out, n)
		}
	}
	return out, nil
}

func (l *nodeLister) HavePodsWithAffinityList() ([]fwk.NodeInfo, error) {
	return l.filter(func(n fwk.NodeInfo) bool { return len(n.GetPodsWithAffinity()) > 0 })
}

func (l *nodeLister) HavePodsWithRequiredAntiAffinityList() ([]fwk.NodeInfo, error) {
	return l.filter(func(n fwk.NodeInfo) bool { return len(n.GetPodsWithRequiredAntiAffinity()) > 0 })
}

func (l *nodeLister) HavePodsWithRequiredNonHostScopedAntiAffinityList() ([]fwk.NodeInfo, error) {
	return l.filter(func(n fwk.NodeInfo) bool { return len(n.GetPodsWithRequiredNonHostScopedAntiAffinity()) > 0 })
}

func (l *nodeLister) Get(name string) (fwk.NodeInfo, error) {
	i, ok := l.byName[name]
	if !ok {
		return nil, fmt.Errorf("nodeinfo not found for node name %q", name)
	}
	return l.nodes[i], nil
}
