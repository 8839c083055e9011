package simulator

import (
	"context"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	internalqueue "k8s.io/kubernetes/pkg/scheduler/backend/queue"
)

// A replay with departures on two one-GPU nodes: two half shares arrive,
// then a whole GPU. Spread puts the shares on both devices, so the whole GPU
// waits, with as much GPU idle as it asks for (a fragmentation-induced
// wait), until the first share leaves at 50 s; Packing stacks them and it
// binds at once. A pod for a model no node has never binds (its wait runs to
// the end of the replay, 80 s), and every device is free again at the end
// (the replay's check).
func TestDynamicReplay(t *testing.T) {
	tr := &Trace{Workload: "tiny",
		Nodes: []NodeRow{{Name: "a", CPUMilli: 32000, MemoryMiB: 131072, GPUs: 1, Model: "A"}, {Name: "b", CPUMilli: 32000, MemoryMiB: 131072, GPUs: 1, Model: "A"}},
		Pods: []PodRow{
			{Name: "q1", CPUMilli: 1000, MemoryMiB: 1024, NumGPU: 1, GPUMilli: 500, Created: 0, Deleted: 50},
			{Name: "q2", CPUMilli: 1000, MemoryMiB: 1024, NumGPU: 1, GPUMilli: 500, Created: 0, Deleted: 80},
			{Name: "w", CPUMilli: 1000, MemoryMiB: 1024, NumGPU: 1, GPUMilli: 1000, Created: 1, Deleted: 11},
			{Name: "x", CPUMilli: 1000, MemoryMiB: 1024, NumGPU: 1, GPUMilli: 1000, Models: []string{"Z"}, Created: 1, Deleted: 2},
		}}
	// The pods ask for 3000 milli on 2000: tune 1.5 keeps them as they are.
	for _, tc := range []struct {
		policy           Policy
		mean             float64
		waited, fragWait int
	}{
		{Spread, (49 + 79) / 4.0, 2, 1},
		{Packing, 79 / 4.0, 1, 0},
	} {
		r, err := RunDynamic(context.Background(), DynamicExperiment{Trace: tr, Policy: tc.policy, Seed: 42, Tune: 1.5, ArrivalSpan: time.Second})
		if err != nil {
			t.Fatalf("%s: %v", tc.policy, err)
		}
		if r.Pods != 4 || r.GPUPods != 4 || r.Compression != 1 {
			t.Fatalf("%s: %d pods (%d GPU), compression %v; want 4, 4, 1", tc.policy, r.Pods, r.GPUPods, r.Compression)
		}
		if r.WaitMean != tc.mean || r.WaitP99 != 79 || r.Waited != tc.waited || r.FragWaited != tc.fragWait || r.NeverPlaced != 1 {
			t.Errorf("%s: wait mean %v, p99 %v, waited %d (fragmented %d), never placed %d; want %v, 79, %d (%d), 1",
				tc.policy, r.WaitMean, r.WaitP99, r.Waited, r.FragWaited, r.NeverPlaced, tc.mean, tc.waited, tc.fragWait)
		}
		if r.End != 80 && tc.policy == Spread {
			t.Errorf("%s: ended at %v, want 80 (the last share leaves)", tc.policy, r.End)
		}
	}
}

// The queue's flush on the simulated clock. A pod no node can hold (two
// GPUs on one-GPU nodes) goes back at the first 30 s tick more than 5
// minutes after its last try (330, 660, 990 s); the last departure's hint
// tries it once more, so no flush follows. A pod that a hint wrongly keeps
// waiting (every hint answers Skip here) is placed by the flush, and
// counted, whether the departure it missed came before others (z at 100 s)
// or was the last one (y at 1200 s: the flush goes on after it); with the
// hints as they are, the departure places it and the flush counts none.
func TestDynamicFlush(t *testing.T) {
	node := func(n string) NodeRow {
		return NodeRow{Name: n, CPUMilli: 32000, MemoryMiB: 131072, GPUs: 1, Model: "A"}
	}
	pod := func(n string, gpus int, created, deleted int64) PodRow {
		return PodRow{Name: n, CPUMilli: 1000, MemoryMiB: 1024, NumGPU: gpus, GPUMilli: 1000, Created: created, Deleted: deleted}
	}
	skipAll := func(m internalqueue.QueueingHintMap) {
		for _, fns := range m {
			for _, f := range fns {
				f.QueueingHintFn = func(klog.Logger, *v1.Pod, interface{}, interface{}) (fwk.QueueingHint, error) {
					return fwk.QueueSkip, nil
				}
				f.PreQueueingHintFn = nil
			}
		}
	}
	type want struct {
		end, xWait              float64
		neverPlaced, byTheFlush int
	}
	for _, tc := range []struct {
		name         string
		nodes        []NodeRow
		pods         []PodRow
		tune         float64 // keeps the pods as they are
		hints        func(internalqueue.QueueingHintMap)
		off, on      want
		moreAttempts int // with the flush on
	}{{
		name:         "never fits",
		nodes:        []NodeRow{node("a"), node("b")},
		pods:         []PodRow{pod("y", 1, 0, 1200), pod("x", 2, 1, 2)},
		tune:         1.5,
		off:          want{end: 1200, xWait: 1199, neverPlaced: 1},
		on:           want{end: 1200, xWait: 1199, neverPlaced: 1},
		moreAttempts: 3,
	}, {
		name:         "a missed departure before others",
		nodes:        []NodeRow{node("a"), node("b")},
		pods:         []PodRow{pod("y", 1, 0, 1200), pod("z", 1, 0, 100), pod("x", 1, 1, 61)},
		tune:         1.5,
		hints:        skipAll,
		off:          want{end: 1200, xWait: 1199, neverPlaced: 1},
		on:           want{end: 1200, xWait: 329, byTheFlush: 1},
		moreAttempts: 1,
	}, {
		name:         "the last departure missed",
		nodes:        []NodeRow{node("a")},
		pods:         []PodRow{pod("y", 1, 0, 1200), pod("x", 1, 1, 61)},
		tune:         2,
		hints:        skipAll,
		off:          want{end: 1200, xWait: 1199, neverPlaced: 1},
		on:           want{end: 1380, xWait: 1319, byTheFlush: 1},
		moreAttempts: 4,
	}, {
		name:  "the hints as they are",
		nodes: []NodeRow{node("a"), node("b")},
		pods:  []PodRow{pod("y", 1, 0, 1200), pod("z", 1, 0, 100), pod("x", 1, 1, 61)},
		tune:  1.5,
		off:   want{end: 1200, xWait: 99},
		on:    want{end: 1200, xWait: 99},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			editHints = tc.hints
			defer func() { editHints = nil }()
			tr := &Trace{Workload: "tiny", Nodes: tc.nodes, Pods: tc.pods}
			run := func(flush time.Duration, w want) *DynamicResult {
				t.Helper()
				r, err := RunDynamic(context.Background(), DynamicExperiment{Trace: tr, Policy: Learned, Seed: 42, Tune: tc.tune, ArrivalSpan: time.Second, Flush: flush})
				if err != nil {
					t.Fatal(err)
				}
				// The other pods never wait: the p99 of three is x's wait.
				got := want{end: r.End, xWait: r.WaitP99, neverPlaced: r.NeverPlaced, byTheFlush: r.FlushPlaced}
				if got != w {
					t.Errorf("flush %v: got %+v, want %+v", flush, got, w)
				}
				return r
			}
			off, on := run(0, tc.off), run(5*time.Minute, tc.on)
			if on.Attempts-off.Attempts != tc.moreAttempts {
				t.Errorf("%d attempts with the flush, %d without; want %d more", on.Attempts, off.Attempts, tc.moreAttempts)
			}
			if on.Flush != 300 || off.Flush != 0 {
				t.Errorf("flush recorded as %v and %v s; want 300 and 0", on.Flush, off.Flush)
			}
		})
	}
}
