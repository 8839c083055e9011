package objects

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/agent/hami"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
)

// TestSameDevices: every input of the device inventory is compared, and
// nothing else.
func TestSameDevices(t *testing.T) {
	res := v1.ResourceList{gpu.ResourceNvidiaGPU: resource.MustParse("8"), v1.ResourceCPU: resource.MustParse("32")}
	base := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{gpu.LabelGPUProduct: "A100", gpu.LabelGPUMemory: "40960", "nvidia.com/gfd.timestamp": "1"},
			Annotations: map[string]string{hami.AnnotationRegister: "r", hami.AnnotationCordon: ""}},
		Status: v1.NodeStatus{Allocatable: res.DeepCopy(), Capacity: res.DeepCopy()},
	}
	opts := gpu.DefaultNodeOptions
	opts.ResourceNames = append([]v1.ResourceName{"example.com/gpu"}, opts.ResourceNames...)
	for _, tc := range []struct {
		name string
		edit func(*v1.Node)
		same bool
	}{
		{"nothing", func(*v1.Node) {}, true},
		{"the GFD timestamp", func(n *v1.Node) { n.Labels["nvidia.com/gfd.timestamp"] = "2" }, true},
		{"another label", func(n *v1.Node) { n.Labels["team"] = "a" }, true},
		{"CPU allocatable", func(n *v1.Node) { n.Status.Allocatable[v1.ResourceCPU] = resource.MustParse("16") }, true},
		{"a heartbeat", func(n *v1.Node) { n.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady}} }, true},
		{"another annotation", func(n *v1.Node) { n.Annotations["x"] = "y" }, true},
		{"the product", func(n *v1.Node) { n.Labels[gpu.LabelGPUProduct] = "H100" }, false},
		{"the memory", func(n *v1.Node) { n.Labels[gpu.LabelGPUMemory] = "81920" }, false},
		{"GPUs allocatable", func(n *v1.Node) { n.Status.Allocatable[gpu.ResourceNvidiaGPU] = resource.MustParse("7") }, false},
		{"GPUs capacity (unhealthy)", func(n *v1.Node) { n.Status.Capacity[gpu.ResourceNvidiaGPU] = resource.MustParse("9") }, false},
		{"GPUs gone", func(n *v1.Node) { delete(n.Status.Allocatable, gpu.ResourceNvidiaGPU) }, false},
		{"another GPU resource", func(n *v1.Node) { n.Status.Allocatable["example.com/gpu"] = resource.MustParse("1") }, false},
		{"HAMi's registration", func(n *v1.Node) { n.Annotations[hami.AnnotationRegister] = "r2" }, false},
		{"HAMi's cordon", func(n *v1.Node) { n.Annotations[hami.AnnotationCordon] = "x" }, false},
		// What tells a HAMi node that has not registered from a plain one.
		{"GFD's GPU count", func(n *v1.Node) { n.Labels[gpu.LabelGPUCount] = "4" }, false},
		{"GFD's replicas", func(n *v1.Node) { n.Labels[gpu.LabelGPUReplicas] = "2" }, false},
		{"HAMi's handshake", func(n *v1.Node) { n.Annotations[hami.AnnotationHandshake] = "Requesting_x" }, true},
	} {
		n := base.DeepCopy()
		tc.edit(n)
		if got := SameDevices(base, n, opts); got != tc.same {
			t.Errorf("%s: SameDevices = %v, want %v", tc.name, got, tc.same)
		}
	}
}
