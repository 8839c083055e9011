package gpufit

import (
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
)

// BenchmarkQueueingHint is the cost of one hint call, that is, per pending
// pod per event: the scheduling queue calls it for every pod GPUFit
// rejected, back to back for one event, inside its lock. The node has 8
// GPUs, 4 taken; the pending pod asks for 8 and fits nowhere (the common
// case of a backlog).
func BenchmarkQueueingHint(b *testing.B) {
	_, tCtx := ktesting.NewTestContext(b)
	// The scheduler's logger at its default verbosity: V(5) is off.
	logger := klog.Background()
	node := gpuNode("n", "8").Label(gpu.LabelGPUProduct, "A100").Label("feature.node.kubernetes.io/gfd.timestamp", "1").Obj()
	var pods []*v1.Pod
	for i := 0; i < 4; i++ {
		pods = append(pods, boundPod(fmt.Sprint("g", i), "n", fmt.Sprintf("n:%d=1000", i)))
	}
	cpuPod := boundPod("cpu", "n", "")
	pods = append(pods, cpuPod)
	e := newEnv(tCtx, b, nil, []*v1.Node{node}, pods)
	pending := wholePod("p", "8").Obj()

	relabelled := node.DeepCopy()
	relabelled.Labels["feature.node.kubernetes.io/gfd.timestamp"] = "2"
	cases := []struct {
		name     string
		hint     fwk.QueueingHintFn
		old, new any
	}{
		{"node-timestamp-label", e.pl.isSchedulableAfterNodeChange, node, relabelled},
		{"cpu-pod-deleted", e.pl.isSchedulableAfterPodDelete, cpuPod, nil},
		// Something GPU-relevant: a GPU pod left the node.
		{"gpu-pod-deleted", e.pl.isSchedulableAfterPodDelete, pods[0], nil},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if h, err := c.hint(logger, pending, c.old, c.new); err != nil || h != fwk.QueueSkip {
					b.Fatalf("want QueueSkip, got %v %v", h, err)
				}
			}
		})
	}
}
