package gpu

import (
	"fmt"
	"reflect"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Build steps from its previous state: pods seen before are not parsed
// again, and the devices are reused when the pods that use them are the
// same. Each step checks the state against one computed afresh, and which
// of the two paths it took.
func TestBuildIncrement(t *testing.T) {
	tr := NewTracker(DefaultNodeOptions)
	n := node("n1", 4, 4, nil)
	on := func(p *v1.Pod) *v1.Pod { p.Spec.NodeName = "n1"; return p }
	cpu := func(i int) *v1.Pod {
		return on(gpuPod(fmt.Sprint("cpu-", i), types.UID(fmt.Sprint("cpu-", i)), 0, nil))
	}
	var pods []*v1.Pod
	for i := range 5 {
		pods = append(pods, cpu(i))
	}
	share := on(gpuPod("share", "share", 0, map[string]string{AnnotationMilli: "300", AnnotationAssignment: "n1:2=300"}))
	whole := on(gpuPod("whole", "whole", 1, nil))
	remove := func(i int) { // as the scheduler's NodeInfo does: the last takes its place
		pods[i] = pods[len(pods)-1]
		pods = pods[:len(pods)-1]
	}
	gen := int64(0)
	steps := []struct {
		name   string
		change func()
		reused bool
	}{
		{"first build", func() {}, false},
		{"a CPU pod added", func() { pods = append(pods, cpu(5)) }, true},
		{"a share added", func() { pods = append(pods, share) }, false},
		{"CPU pods added after it", func() { pods = append(pods, cpu(6), cpu(7)) }, true},
		{"a CPU pod removed (the last moves)", func() { remove(0) }, true},
		{"a whole GPU added", func() { pods = append(pods, whole) }, false},
		{"the share removed (a CPU pod takes its place)", func() {
			for i, p := range pods {
				if p == share {
					remove(i)
					return
				}
			}
		}, false},
		{"a CPU pod's object replaced by a GPU pod's", func() {
			p := pods[1].DeepCopy()
			p.Annotations = map[string]string{AnnotationMilli: "500"}
			pods[1] = p
		}, false},
		{"a GPU pod's object replaced, unchanged", func() {
			for i, p := range pods {
				if p == whole {
					pods[i] = p.DeepCopy()
				}
			}
		}, false},
		{"the GPU pods reordered", func() {
			var idx []int
			for i, p := range pods {
				if UsesGPU(p, tr.RequestOptions()) {
					idx = append(idx, i)
				}
			}
			pods[idx[0]], pods[idx[1]] = pods[idx[1]], pods[idx[0]]
		}, false},
		{"nothing but the generation", func() {}, true},
		{"the node's object replaced", func() { n = n.DeepCopy() }, false},
		{"a CPU pod added again", func() { pods = append(pods, cpu(8)) }, true},
		{"a reservation", func() {
			tr.Reserve("n1", "r", Reservation{Namespace: "ns", Name: "r", Choice: Choice{Mask: 1, Milli: MilliPerGPU}})
		}, false},
		{"a CPU pod added while it holds", func() { pods = append(pods, cpu(9)) }, false},
		{"the reservation dropped", func() { tr.Unreserve("r") }, false},
		{"a CPU pod added after", func() { pods = append(pods, cpu(10)) }, true},
		{"a pod not bound (a nominee)", func() { pods = append(pods, gpuPod("nom", "nom", 1, nil)) }, false},
		{"a CPU pod added beside it", func() { pods = append(pods, cpu(11)) }, false},
	}
	for _, step := range steps {
		step.change()
		gen++
		cpuFree, memFree := 64000-gen*100, 1<<20-gen
		b0 := Builds()
		got := tr.Build(n, gen, append([]*v1.Pod(nil), pods...), cpuFree, memFree)
		b1 := Builds()
		r0, c0, r1, c1 := b0.Reused, b0.Computed, b1.Reused, b1.Computed
		want := tr.Compute(n, pods, cpuFree, memFree, "", true)
		if got.Free != want.Free || got.Overcommitted != want.Overcommitted || got.CPUFree != want.CPUFree ||
			got.MemFree != want.MemFree || !reflect.DeepEqual(got.Inventory, want.Inventory) {
			t.Errorf("%s: built free %v overcommitted %v cpu %d mem %d, computed afresh %v %v %d %d", step.name,
				got.Free[:4], got.Overcommitted, got.CPUFree, got.MemFree, want.Free[:4], want.Overcommitted, want.CPUFree, want.MemFree)
		}
		if reused := r1-r0 == 1 && c1 == c0; reused != step.reused {
			t.Errorf("%s: reused %v (reused %d, computed %d), want %v", step.name, reused, r1-r0, c1-c0, step.reused)
		}
		if st := tr.Lookup("n1", gen); st != got {
			t.Errorf("%s: the build is not cached", step.name)
		}
	}
}
