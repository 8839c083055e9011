package fleet

import (
	"context"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// A real API server taints every new node not-ready (TaintNodesByCondition
// admission); Create leaves a Ready node schedulable at once, and keeps the
// taint on a node declared NotReady.
func TestCreateLiftsAdmissionTaint(t *testing.T) {
	client := fake.NewClientset()
	client.PrependReactor("create", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		n := a.(k8stesting.CreateAction).GetObject().(*v1.Node)
		for _, tn := range n.Spec.Taints {
			if tn.Key == v1.TaintNodeNotReady {
				return false, nil, nil
			}
		}
		n.Spec.Taints = append(n.Spec.Taints, v1.Taint{Key: v1.TaintNodeNotReady, Effect: v1.TaintEffectNoSchedule})
		return false, nil, nil
	})
	gpuTaint := v1.Taint{Key: "gpu", Value: "true", Effect: v1.TaintEffectNoSchedule}
	ctx := context.Background()
	err := Create(ctx, client,
		Node{Name: "ready", CPU: "8", Memory: "32Gi", GPUs: 2, Taints: []v1.Taint{gpuTaint}},
		Node{Name: "down", CPU: "8", Memory: "32Gi", NotReady: true})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string][]string{"ready": {"gpu"}, "down": {v1.TaintNodeNotReady}} {
		n, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, tn := range n.Spec.Taints {
			got = append(got, tn.Key)
		}
		if len(got) != len(want) || got[0] != want[0] {
			t.Errorf("%s: taints %v, want %v", name, got, want)
		}
		if c := n.Status.Conditions; len(c) != 1 || (c[0].Status == v1.ConditionTrue) != (name == "ready") {
			t.Errorf("%s: conditions %v", name, c)
		}
	}
}
