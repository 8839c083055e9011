// Package gputest builds objects for tests of the GPU accounting.
package gputest

import (
	"fmt"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
)

// BoundPod is a pod bound to node with the given assignment and the request
// that agrees with it: whole GPUs when every share is 1000 milli, else one
// share (gpu-milli). The accounting counts requests; an assignment alone
// holds nothing. An empty assignment gives a CPU-only pod.
func BoundPod(namespace, name, node, assignment string) *v1.Pod {
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, UID: types.UID(name), Annotations: map[string]string{}},
		Spec:       v1.PodSpec{NodeName: node, Containers: []v1.Container{{Name: "c"}}},
	}
	if assignment == "" {
		return p
	}
	a, err := gpu.ParseAssignment(assignment)
	if err != nil {
		panic(err)
	}
	p.Annotations[gpu.AnnotationAssignment] = assignment
	c := &p.Spec.Containers[0]
	if len(a.Shares) == 1 && a.Shares[0].Milli < gpu.MilliPerGPU {
		p.Annotations[gpu.AnnotationMilli] = fmt.Sprint(a.Shares[0].Milli)
		return p
	}
	q := *resource.NewQuantity(int64(len(a.Shares)), resource.DecimalSI)
	c.Resources.Requests = v1.ResourceList{gpu.ResourceNvidiaGPU: q}
	c.Resources.Limits = v1.ResourceList{gpu.ResourceNvidiaGPU: q}
	return p
}

// Activator records the pods moved back to the active queue (a framework
// handle's PodActivator, for tests).
type Activator struct {
	mu  sync.Mutex
	got []string
}

// Activate records the pods' keys.
func (a *Activator) Activate(_ klog.Logger, pods map[string]*v1.Pod) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for k := range pods {
		a.got = append(a.got, k)
	}
}

// Activated lists the keys activated so far.
func (a *Activator) Activated() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.got...)
}

// PodsOn lists the pods in an informer's store that are bound to node.
func PodsOn(store cache.Store, node string) []*v1.Pod {
	var out []*v1.Pod
	for _, o := range store.List() {
		if p := o.(*v1.Pod); p.Spec.NodeName == node {
			out = append(out, p)
		}
	}
	return out
}
