package gpu

import (
	"fmt"
	"reflect"
	"runtime"
	"testing"
	"time"
	"weak"

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
		// parsed is how many pods are parsed (-1: not checked).
		parsed int
	}{
		{"first build", func() {}, false, 5},
		{"a CPU pod added", func() { pods = append(pods, cpu(5)) }, true, 1},
		{"a share added", func() { pods = append(pods, share) }, false, 1},
		{"CPU pods added after it", func() { pods = append(pods, cpu(6), cpu(7)) }, true, -1},
		{"a CPU pod removed (the last moves)", func() { remove(0) }, true, -1},
		{"a whole GPU added", func() { pods = append(pods, whole) }, false, -1},
		{"the share removed (a CPU pod takes its place)", func() {
			for i, p := range pods {
				if p == share {
					remove(i)
					return
				}
			}
		}, false, -1},
		{"a CPU pod's object replaced by a GPU pod's", func() {
			p := pods[1].DeepCopy()
			p.Annotations = map[string]string{AnnotationMilli: "500"}
			pods[1] = p
		}, false, -1},
		{"a GPU pod's object replaced, unchanged", func() {
			for i, p := range pods {
				if p == whole {
					pods[i] = p.DeepCopy()
				}
			}
		}, false, -1},
		{"the GPU pods reordered", func() {
			var idx []int
			for i, p := range pods {
				if UsesGPU(p, tr.RequestOptions()) {
					idx = append(idx, i)
				}
			}
			pods[idx[0]], pods[idx[1]] = pods[idx[1]], pods[idx[0]]
		}, false, -1},
		{"nothing but the generation", func() {}, true, 0},
		{"the node's object replaced", func() { n = n.DeepCopy() }, false, 0},
		{"the node's devices changed", func() {
			n = node("n1", 3, 4, nil)
		}, false, 0},
		{"a CPU pod added again", func() { pods = append(pods, cpu(8)) }, true, -1},
		{"a reservation", func() {
			tr.Reserve("n1", "r", Reservation{Namespace: "ns", Name: "r", Choice: Choice{Mask: 1, Milli: MilliPerGPU}})
		}, false, -1},
		{"a CPU pod added while it holds", func() { pods = append(pods, cpu(9)) }, false, -1},
		{"the reservation dropped", func() { tr.Unreserve("r") }, false, -1},
		{"a CPU pod added after", func() { pods = append(pods, cpu(10)) }, true, -1},
		{"a pod not bound (a nominee)", func() { pods = append(pods, gpuPod("nom", "nom", 1, nil)) }, false, -1},
		{"a CPU pod added beside it", func() { pods = append(pods, cpu(11)) }, false, -1},
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
			got.MemFree != want.MemFree || !reflect.DeepEqual(got.Inventory, want.Inventory) || !reflect.DeepEqual(got.agent, want.agent) {
			t.Errorf("%s: built free %v overcommitted %v cpu %d mem %d, computed afresh %v %v %d %d", step.name,
				got.Free[:4], got.Overcommitted, got.CPUFree, got.MemFree, want.Free[:4], want.Overcommitted, want.CPUFree, want.MemFree)
		}
		if reused := r1-r0 == 1 && c1 == c0; reused != step.reused {
			t.Errorf("%s: reused %v (reused %d, computed %d), want %v", step.name, reused, r1-r0, c1-c0, step.reused)
		}
		if parsed := b1.Parsed - b0.Parsed; step.parsed >= 0 && parsed != uint64(step.parsed) {
			t.Errorf("%s: %d pods parsed, want %d", step.name, parsed, step.parsed)
		}
		if st := tr.Lookup("n1", gen); st != got {
			t.Errorf("%s: the build is not cached", step.name)
		}
	}
}

// On a node whose agent enforces shares, the increment keeps what each
// device holds per dimension as a computation afresh has it.
func TestBuildIncrementAgent(t *testing.T) {
	tr := NewTracker(agentOpts)
	n := agentNode("n", "A:80000:100:4,B:80000:100:4")
	cpuPod := func(name string) *v1.Pod {
		p := gpuPod(name, types.UID(name), 0, nil)
		p.Spec.NodeName = "n"
		return p
	}
	pods := []*v1.Pod{
		agentPod("h1", 0, map[string]string{keyUses: "A:40000:50:1", keyUsesOn: "n", AnnotationMilli: "500"}),
		cpuPod("c1"),
	}
	for gen, step := range []struct {
		change func()
		reused bool
	}{
		{func() {}, false},
		{func() { pods = append(pods, cpuPod("c2")) }, true},
		{func() {
			pods = append(pods, agentPod("h2", 0, map[string]string{keyUses: "B:20000:25:1", keyUsesOn: "n", AnnotationMilli: "250"}))
		}, false},
		{func() { pods = append(pods, cpuPod("c3")) }, true},
	} {
		step.change()
		before := Builds()
		got := tr.Build(n, int64(gen), append([]*v1.Pod(nil), pods...), 1000, 1000)
		if reused := Builds().Reused-before.Reused == 1; reused != step.reused {
			t.Errorf("step %d: devices reused %v, want %v", gen, reused, step.reused)
		}
		want := tr.Compute(n, pods, 1000, 1000, "", true)
		if got.Free != want.Free || !reflect.DeepEqual(got.agent, want.agent) || got.agent == nil {
			t.Errorf("step %d: built free %v agent %+v, computed afresh %v %+v", gen, got.Free[:2], got.agent, want.Free[:2], want.agent)
		}
	}
}

// The oldest in-flight reservation is what the leaked-reservation alert
// reads.
func TestOldestReservation(t *testing.T) {
	tr := NewTracker(DefaultNodeOptions)
	if !tr.OldestReservation().IsZero() {
		t.Fatal("no reservation, yet an oldest")
	}
	old := time.Now().Add(-time.Hour)
	tr.Reserve("n1", "a", Reservation{Name: "a", Since: time.Now()})
	tr.Reserve("n2", "b", Reservation{Name: "b", Since: old})
	if got := tr.OldestReservation(); !got.Equal(old) {
		t.Errorf("oldest %v, want %v", got, old)
	}
	tr.Unreserve("b")
	if got := tr.OldestReservation(); got.Equal(old) || got.IsZero() {
		t.Errorf("after the old one is released: %v", got)
	}
	tr.Unreserve("a")
	if !tr.OldestReservation().IsZero() {
		t.Error("all released, yet an oldest")
	}
}

// A built state must not keep the objects it was built from alive: a node
// scored no more (full, or no longer a candidate) would hold every pod
// version and node version the informers have replaced since.
func TestBuildKeepsNoObjectAlive(t *testing.T) {
	tr := NewTracker(DefaultNodeOptions)
	n := node("n1", 4, 4, nil)
	pods := []*v1.Pod{gpuPod("cpu", "cpu", 0, nil), gpuPod("share", "share", 0, map[string]string{AnnotationMilli: "300", AnnotationAssignment: "n1:2=300"})}
	for _, p := range pods {
		p.Spec.NodeName = "n1"
	}
	st := tr.Build(n, 1, pods, 1000, 1000)
	wn, wp := weak.Make(n), []weak.Pointer[v1.Pod]{weak.Make(pods[0]), weak.Make(pods[1])}
	n, pods = nil, nil
	runtime.GC()
	runtime.GC()
	if tr.Lookup("n1", 1) != st {
		t.Fatal("the state is no longer cached")
	}
	if wn.Value() != nil {
		t.Error("the node object it was built from is still alive")
	}
	for i, w := range wp {
		if w.Value() != nil {
			t.Errorf("pod %d it was built from is still alive", i)
		}
	}
}
