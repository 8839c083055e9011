package gpu

import (
	"slices"
	"strconv"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// share is a bound share pod with its assignment on one device.
func share(name string, dev, milli int) *v1.Pod {
	p := gpuPod(name, types.UID(name), 0, map[string]string{AnnotationMilli: itoa(milli), AnnotationAssignment: "n:" + itoa(dev) + "=" + itoa(milli)})
	p.Spec.NodeName = "n"
	return p
}

// whole is a bound whole-GPU pod on the given devices.
func whole(name string, devs ...int) *v1.Pod {
	a := "n:"
	for k, d := range devs {
		if k > 0 {
			a += ","
		}
		a += itoa(d) + "=1000"
	}
	p := gpuPod(name, types.UID(name), int64(len(devs)), map[string]string{AnnotationAssignment: a})
	p.Spec.NodeName = "n"
	return p
}

func itoa(i int) string { return strconv.Itoa(i) }

// manyShares puts two 300m shares on each device of a node, one on device
// single (-1: none).
func manyShares(devices, single int) []*v1.Pod {
	var pods []*v1.Pod
	for d := 0; d < devices; d++ {
		pods = append(pods, share("s"+itoa(d)+"a", d, 300))
		if d != single {
			pods = append(pods, share("s"+itoa(d)+"b", d, 300))
		}
	}
	return pods
}

func TestPlanEviction(t *testing.T) {
	all := func(pods []*v1.Pod, except ...string) map[types.UID]Victim {
		m := map[types.UID]Victim{}
		for _, p := range pods {
			if !slices.Contains(except, p.Name) {
				m[p.UID] = Victim{}
			}
		}
		return m
	}
	// Every device of an 8-GPU node holds two 300m shares; device 5 one.
	var shares []*v1.Pod
	for d := 0; d < 8; d++ {
		shares = append(shares, share("s"+itoa(d)+"a", d, 300))
		if d != 5 {
			shares = append(shares, share("s"+itoa(d)+"b", d, 300))
		}
	}
	tests := map[string]struct {
		devices int64
		pods    []*v1.Pod
		req     Request
		victims func([]*v1.Pod) map[types.UID]Victim
		allowed []int32  // disruptions each budget allows
		want    []string // nil: no plan
	}{
		"whole GPU: the one share of device 5, not a device's two": {
			devices: 8, pods: shares, req: Request{Count: 1},
			want: []string{"s5a"},
		},
		"whole GPU: both shares of one device when all have two": {
			devices: 2, pods: []*v1.Pod{share("a", 0, 300), share("b", 0, 300), share("c", 1, 300), share("d", 1, 300)}, req: Request{Count: 1},
			want: []string{"a", "b"},
		},
		"whole GPU: never a device a pod that is no victim holds": {
			devices: 2, pods: []*v1.Pod{share("a", 0, 300), share("keep", 1, 100)}, req: Request{Count: 1},
			victims: func(p []*v1.Pod) map[types.UID]Victim { return all(p, "keep") },
			want:    []string{"a"},
		},
		"whole GPU: nothing when every device has a pod that stays": {
			devices: 2, pods: []*v1.Pod{share("a", 0, 300), share("k0", 0, 100), share("k1", 1, 100)}, req: Request{Count: 1},
			victims: func(p []*v1.Pod) map[types.UID]Victim { return all(p, "k0", "k1") },
		},
		"share: one 600m share frees enough, not a device's worth": {
			devices: 2, pods: []*v1.Pod{share("a", 0, 600), share("b", 0, 300), share("c", 1, 600), share("d", 1, 300)}, req: Request{Milli: 500},
			want: []string{"a"},
		},
		"share: the smallest that frees enough": {
			devices: 2, pods: []*v1.Pod{share("big", 0, 600), share("small", 0, 300), share("c", 1, 800)}, req: Request{Milli: 300},
			want: []string{"small"},
		},
		"share: two on one device when no single pod frees enough": {
			devices: 1, pods: []*v1.Pod{share("a", 0, 300), share("b", 0, 300), share("c", 0, 300)}, req: Request{Milli: 600},
			want: []string{"a", "b"},
		},
		"a PodDisruptionBudget costs more than a second pod": {
			devices: 2, pods: []*v1.Pod{share("guarded", 0, 600), share("c", 1, 300), share("d", 1, 300)}, req: Request{Count: 1},
			victims: func(p []*v1.Pod) map[types.UID]Victim {
				m := all(p)
				m["guarded"] = Victim{Budgets: []int{0}}
				return m
			},
			allowed: []int32{0},
			want:    []string{"c", "d"},
		},
		"a budget that allows one disruption is charged to the pods evicted only": {
			devices: 2, pods: []*v1.Pod{share("a", 0, 600), share("b", 1, 300), share("c", 1, 300)}, req: Request{Count: 1},
			victims: func(p []*v1.Pod) map[types.UID]Victim {
				m := map[types.UID]Victim{}
				for _, n := range []types.UID{"a", "b", "c"} {
					m[n] = Victim{Budgets: []int{0}}
				}
				return m
			},
			allowed: []int32{1},
			want:    []string{"a"},
		},
		"a pod of a group is evicted with its whole group": {
			devices: 2, pods: []*v1.Pod{share("g", 0, 300), share("b", 1, 300), share("c", 1, 300)}, req: Request{Count: 1},
			victims: func(p []*v1.Pod) map[types.UID]Victim {
				m := all(p)
				m["g"] = Victim{Pods: 8}
				return m
			},
			want: []string{"b", "c"},
		},
		"20 devices (greedy): the one device with one share": {
			devices: 20, pods: manyShares(20, 7), req: Request{Count: 1},
			want: []string{"s7a"},
		},
		"16 devices, 8 to clear (too many sets: greedy)": {
			devices: 16, pods: manyShares(16, -1), req: Request{Count: 8},
			want: []string{"s0a", "s0b", "s1a", "s1b", "s2a", "s2b", "s3a", "s3b", "s4a", "s4b", "s5a", "s5b", "s6a", "s6b", "s7a", "s7b"},
		},
		"lower priority before fewer pods": {
			devices: 2, pods: []*v1.Pod{share("important", 0, 600), share("c", 1, 300), share("d", 1, 300)}, req: Request{Count: 1},
			victims: func(p []*v1.Pod) map[types.UID]Victim {
				m := all(p)
				m["important"] = Victim{Priority: 5}
				return m
			},
			want: []string{"c", "d"},
		},
		"share: two pods of priority 0 before one of priority 100": {
			devices: 2, pods: []*v1.Pod{share("important", 0, 600), share("x", 1, 300), share("y", 1, 300), share("z", 1, 300)}, req: Request{Milli: 500},
			victims: func(p []*v1.Pod) map[types.UID]Victim {
				m := all(p)
				m["important"] = Victim{Priority: 100}
				return m
			},
			want: []string{"x", "y"},
		},
		"share: one pod when the others are no cheaper": {
			devices: 2, pods: []*v1.Pod{share("one", 0, 600), share("x", 1, 300), share("y", 1, 300), share("z", 1, 300)}, req: Request{Milli: 500},
			want: []string{"one"},
		},
		"share: a set below the top priority on a mixed device": {
			devices: 1, pods: []*v1.Pod{share("hi", 0, 500), share("lo1", 0, 250), share("lo2", 0, 250)}, req: Request{Milli: 500},
			victims: func(p []*v1.Pod) map[types.UID]Victim {
				m := all(p)
				m["hi"] = Victim{Priority: 10}
				return m
			},
			want: []string{"lo1", "lo2"},
		},
		"a pod on two devices frees both": {
			devices: 4, pods: []*v1.Pod{whole("pair", 0, 1), share("c", 2, 300), share("d", 3, 300)}, req: Request{Count: 2},
			want: []string{"pair"},
		},
		"two whole GPUs: the cheapest two devices": {
			devices: 4, pods: []*v1.Pod{share("a", 0, 300), share("b", 0, 300), share("c", 1, 300), share("d", 2, 300), whole("w", 3)}, req: Request{Count: 2},
			want: []string{"c", "d"},
		},
		"no GPU eviction needed: no plan": {
			devices: 2, pods: []*v1.Pod{share("a", 0, 300)}, req: Request{Count: 1},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			n := node("n", tc.devices, tc.devices, nil)
			victims := all(tc.pods)
			if tc.victims != nil {
				victims = tc.victims(tc.pods)
			}
			tr := NewTracker(DefaultNodeOptions)
			e, ok := tr.PlanEviction(n, tc.pods, &tc.req, victims, tc.allowed)
			if tc.want == nil {
				if ok {
					t.Fatalf("want no plan, got %v (%s)", e.UIDs, e.Why)
				}
				return
			}
			if !ok {
				t.Fatalf("want %v, got no plan", tc.want)
			}
			var got []string
			for _, u := range e.UIDs {
				got = append(got, string(u))
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Errorf("want %v, got %v (%s)", tc.want, got, e.Why)
			}
		})
	}
}

// A pod nominated to a node holds the devices its preemption freed for it,
// in the other pods' filters, and never overcommits the node while its
// victims are still there.
func TestNomineeHoldsItsDevices(t *testing.T) {
	n := node("n", 2, 2, nil)
	victim := share("victim", 0, 600)
	victim.DeletionTimestamp = nil
	nominee := gpuPod("p", "p", 1, nil)
	nominee.Status.NominatedNodeName = "n"
	tr := NewTracker(DefaultNodeOptions)

	// No record of what it freed: it takes a free device if one fits, and
	// the node is not overcommitted when none does.
	st := tr.Compute(n, []*v1.Pod{victim, nominee}, 0, 0, "", false)
	if st.Overcommitted || st.Free[0] != 400 || st.Free[1] != 0 {
		t.Errorf("without a record: free %v overcommitted %v, want [400 0] false", st.Free[:2], st.Overcommitted)
	}
	full := whole("full", 1)
	st = tr.Compute(n, []*v1.Pod{victim, full, nominee}, 0, 0, "", false)
	if st.Overcommitted || st.Free[0] != 400 {
		t.Errorf("nowhere to go: free %v overcommitted %v, want [400 0] false", st.Free[:2], st.Overcommitted)
	}

	// With the record, device 0 is its own: the share left there is not
	// free for anyone else, and device 1 is.
	tr.Nominate("p", "n", Choice{Mask: 1, Milli: MilliPerGPU})
	st = tr.Compute(n, []*v1.Pod{victim, nominee}, 0, 0, "", false)
	if st.Overcommitted || st.Free[0] != 0 || st.Free[1] != 1000 {
		t.Errorf("with the record: free %v overcommitted %v, want [0 1000] false", st.Free[:2], st.Overcommitted)
	}
	// A whole GPU short of devices holds the free ones it can.
	pair := gpuPod("pair", "pair", 2, nil)
	pair.Status.NominatedNodeName = "n"
	st = tr.Compute(n, []*v1.Pod{victim, pair}, 0, 0, "", false)
	if st.Overcommitted || st.Free[0] != 400 || st.Free[1] != 0 {
		t.Errorf("two GPUs, one free: free %v overcommitted %v, want [400 0] false", st.Free[:2], st.Overcommitted)
	}
	// With a record for another node and no nomination here, the pod is
	// not a nominee here: an unbound pod in the list counts as any pod
	// does, laid down on what is free, and it overcommits when it does not fit.
	tr.Nominate("p", "other", Choice{Mask: 1, Milli: MilliPerGPU})
	nominee.Status.NominatedNodeName = ""
	st = tr.Compute(n, []*v1.Pod{victim, full, nominee}, 0, 0, "", false)
	if !st.Overcommitted {
		t.Errorf("record for another node: free %v, want the pod counted (overcommitted)", st.Free[:2])
	}
	tr.Denominate("p")
	if _, ok := tr.Nominated("p", "other"); ok {
		t.Errorf("denominated pod still recorded")
	}
}

func TestRoomAndKinds(t *testing.T) {
	n := node("n", 4, 4, map[string]string{LabelGPUProduct: "A100"})
	st := NewTracker(DefaultNodeOptions).Compute(n, []*v1.Pod{share("a", 0, 600), whole("b", 1)}, 0, 0, "", false)
	// Free: 400, 0, 1000, 1000.
	a100 := ModelSelector{Exact: []string{"A100"}}
	t4 := ModelSelector{Exact: []string{"T4"}}
	for name, tc := range map[string]struct {
		task      Task
		cpu, want int64
	}{
		"shares by device":      {Task{Milli: 300, Count: 1}, 0, 1 + 3 + 3},
		"whole by free devices": {Task{Milli: 1000, Count: 2}, 0, 1},
		"bounded by CPU":        {Task{Milli: 300, Count: 1, CPU: 2000}, 5000, 2},
		"model allowed":         {Task{Milli: 1000, Count: 1, Models: a100}, 0, 2},
		"model not allowed":     {Task{Milli: 1000, Count: 1, Models: t4}, 0, 0},
	} {
		cpu := tc.cpu
		if cpu == 0 {
			cpu = 1 << 40
		}
		if got := st.Room(&tc.task, cpu, 1<<40, false); got != tc.want {
			t.Errorf("%s: %d, want %d", name, got, tc.want)
		}
	}
	// Where shares must be delivered, a node without an agent takes none
	// (whole GPUs still); on an agent's node the free slots bound them.
	if got := st.Room(&Task{Milli: 300, Count: 1}, 1<<40, 1<<40, true); got != 0 {
		t.Errorf("shares on a plain node that must deliver them: %d, want 0", got)
	}
	if got := st.Room(&Task{Milli: 1000, Count: 2}, 1<<40, 1<<40, true); got != 1 {
		t.Errorf("whole GPUs on a plain node: %d, want 1", got)
	}
	shares, _ := NewWorkload([]Task{{Milli: 300, Count: 1, Weight: 1}})
	if got, idle := FragAt(shares, st, 1<<40, true), float64(st.Idle()); got != idle {
		t.Errorf("a share-only workload on a plain node that must deliver shares: fragmentation %v, want all the idle %v", got, idle)
	}
	if got := FragAt(shares, st, 1<<40, false); got >= float64(st.Idle()) {
		t.Errorf("accounting-only shares: fragmentation %v, want less than the idle %d", got, st.Idle())
	}
	ag := NewTracker(agentOpts).Compute(agentNode("n", "A:80000:100:2,B:80000:100:4"), nil, 0, 0, "", false)
	if got := ag.Room(&Task{Milli: 100, Count: 1}, 1<<40, 1<<40, true); got != 2+4 {
		t.Errorf("100m shares on devices of 2 and 4 slots: %d, want 6", got)
	}
	wl, _ := NewWorkload([]Task{{Milli: 500, Count: 1, CPU: 4000, Weight: 1}, {Milli: 1000, Count: 2, CPU: 16000, Memory: 65536, Models: a100, Weight: 3}, {CPU: 1000, Weight: 5}})
	var kinds []string
	for _, task := range TopGPUTasks(wl, 8) {
		kinds = append(kinds, TaskKind(task))
	}
	if want := []string{"2x1000m 16cpu 64Gi A100", "1x500m 4cpu"}; !slices.Equal(kinds, want) {
		t.Errorf("kinds %q, want %q", kinds, want)
	}
}

// Devices held for another nominee of the node are no one's to free: the
// plan clears another device, or none.
func TestPlanEvictionLeavesNomineesDevices(t *testing.T) {
	n := node("n", 2, 2, nil)
	pods := []*v1.Pod{share("a", 0, 300), share("b", 1, 300), share("c", 1, 300)}
	victims := map[types.UID]Victim{"a": {}, "b": {}, "c": {}}
	other := gpuPod("other", "other", 1, nil)
	other.Status.NominatedNodeName = "n"
	for name, tc := range map[string]struct {
		held uint64 // the device the other nominee's preemption freed for it
		want []string
	}{
		"none held: the device with one share":   {want: []string{"a"}},
		"device 0 held: the other device":        {held: 1 << 0, want: []string{"b", "c"}},
		"device 1 held: the device of one share": {held: 1 << 1, want: []string{"a"}},
	} {
		t.Run(name, func(t *testing.T) {
			tr := NewTracker(DefaultNodeOptions)
			in := pods
			if tc.held != 0 {
				tr.Nominate(other.UID, "n", Choice{Mask: tc.held, Milli: MilliPerGPU})
				in = append(slices.Clone(pods), other)
			}
			e, ok := tr.PlanEviction(n, in, &Request{Count: 1}, victims, nil)
			var got []string
			for _, u := range e.UIDs {
				got = append(got, string(u))
			}
			slices.Sort(got)
			if !ok || !slices.Equal(got, tc.want) {
				t.Errorf("plan %v (%v, %s), want %v", got, ok, e.Why, tc.want)
			}
		})
	}
}

// A device held for a nominee is blocked even while its victim still fills
// it; a nominee known only by its status blocks nothing (it holds wherever
// it fits now, which verify judges).
func TestPlanEvictionNomineeRecords(t *testing.T) {
	n := node("n", 2, 2, nil)
	// v (the nominee's victim, still terminating) fills device 0.
	tr := NewTracker(DefaultNodeOptions)
	nominee := gpuPod("nominee", "nominee", 1, nil)
	nominee.Status.NominatedNodeName = "n"
	tr.Nominate(nominee.UID, "n", Choice{Mask: 1 << 0, Milli: MilliPerGPU})
	pods := []*v1.Pod{whole("v", 0), share("w", 1, 300), nominee}
	e, ok := tr.PlanEviction(n, pods, &Request{Count: 1}, map[types.UID]Victim{"v": {}, "w": {Priority: 5}}, nil)
	if !ok || !slices.Equal(e.UIDs, []types.UID{"w"}) {
		t.Errorf("held device still filled: plan %v (%v, %s), want [w]", e.UIDs, ok, e.Why)
	}

	// Three devices: x alone on 0, y (stays) on 1, z1 and z2 on 2; a 300m
	// nominee with no record fits on device 1 beside y.
	n3 := node("n", 3, 3, nil)
	status := gpuPod("status", "status", 0, map[string]string{AnnotationMilli: "300"})
	status.Status.NominatedNodeName = "n"
	pods = []*v1.Pod{share("x", 0, 600), share("y", 1, 300), share("z1", 2, 300), share("z2", 2, 300), status}
	e, ok = NewTracker(DefaultNodeOptions).PlanEviction(n3, pods, &Request{Count: 1}, map[types.UID]Victim{"x": {}, "z1": {}, "z2": {}}, nil)
	if !ok || !slices.Equal(e.UIDs, []types.UID{"x"}) {
		t.Errorf("status-only nominee: plan %v (%v, %s), want [x]", e.UIDs, ok, e.Why)
	}
}
