package integration

import (
	"fmt"
	"testing"
	"time"

	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	featuregatetesting "k8s.io/component-base/featuregate/testing"
	"k8s.io/kubernetes/pkg/features"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/fleet"
	"github.com/gpu-scheduler/gpu-scheduler/test/harness"
)

// The in-process scheduler with GenericWorkload on (GangScheduling joins the
// shipped profile): a gang of 4 x 2 GPUs on a node of 6 binds none and holds
// nothing; a gang of 3 x 2 then takes all six.
func TestGangs(t *testing.T) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.GenericWorkload, true)
	sched := startScheduler(t)
	defer sched.Stop()
	s := cluster.NewScope(t)
	s.AddNodes(fleet.Node{Name: "a100", CPU: "64", Memory: "256Gi", GPUs: 6, Model: "NVIDIA-A100-SXM4-80GB", MemoryMiB: 81920})
	group := func(name string, n int32) []string {
		pg := &schedulingv1beta1.PodGroup{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.NS},
			Spec: schedulingv1beta1.PodGroupSpec{SchedulingPolicy: schedulingv1beta1.PodGroupSchedulingPolicy{
				Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: n}}},
		}
		if _, err := cluster.Client.SchedulingV1beta1().PodGroups(s.NS).Create(s.Ctx, pg, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		var names []string
		for i := int32(0); i < n; i++ {
			names = append(names, fmt.Sprintf("%s-%d", name, i))
			s.Create(s.Pod(harness.PodSpec{Name: names[i], GPUs: 2, PodGroup: name}))
		}
		return names
	}
	big := group("big", 4)
	msg := s.WaitUnschedulable(30*time.Second, big[0])
	t.Logf("big: %s", msg)
	small := group("small", 3)
	s.WaitBound(30*time.Second, small...)
	for _, n := range big {
		if p := s.Get(n); p.Spec.NodeName != "" {
			t.Errorf("%s bound to %s", n, p.Spec.NodeName)
		}
	}
	use, err := harness.CheckDevices(s.Ctx, cluster.Client)
	if err != nil {
		t.Fatal(err)
	}
	var total int32
	for _, m := range use[s.Node("a100")] {
		total += m
	}
	if total != 6000 {
		t.Errorf("booked %d milli on the node, want 6000: %v", total, use)
	}
}
