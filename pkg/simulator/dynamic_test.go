package simulator

import (
	"context"
	"testing"
	"time"
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

// The queue's flush on the simulated clock: a pod no node can hold (two
// GPUs, on one-GPU nodes) is refused at 1 s, and with Flush 5m goes back at
// the first 30 s tick more than 5 minutes after its last try (330, 660 and
// 990 s) until the last pod leaves at 1200 s; without it, it is tried once
// more at most (on a departure, if a hint lets it). No pod is placed by a
// flush: the hints missed nothing.
func TestDynamicFlush(t *testing.T) {
	tr := &Trace{Workload: "tiny",
		Nodes: []NodeRow{{Name: "a", CPUMilli: 32000, MemoryMiB: 131072, GPUs: 1, Model: "A"}, {Name: "b", CPUMilli: 32000, MemoryMiB: 131072, GPUs: 1, Model: "A"}},
		Pods: []PodRow{
			{Name: "y", CPUMilli: 1000, MemoryMiB: 1024, NumGPU: 1, GPUMilli: 1000, Created: 0, Deleted: 1200},
			{Name: "x", CPUMilli: 1000, MemoryMiB: 1024, NumGPU: 2, GPUMilli: 1000, Created: 1, Deleted: 2},
		}}
	run := func(flush time.Duration) *DynamicResult {
		t.Helper()
		// 3000 milli asked on 2000: tune 1.5 keeps the pods as they are.
		r, err := RunDynamic(context.Background(), DynamicExperiment{Trace: tr, Policy: Learned, Seed: 42, Tune: 1.5, ArrivalSpan: time.Second, Flush: flush})
		if err != nil {
			t.Fatal(err)
		}
		if r.End != 1200 || r.NeverPlaced != 1 || r.FlushPlaced != 0 {
			t.Fatalf("flush %v: ended at %v, %d never placed, %d placed by the flush; want 1200, 1, 0", flush, r.End, r.NeverPlaced, r.FlushPlaced)
		}
		return r
	}
	off, on := run(0), run(5*time.Minute)
	if on.Attempts-off.Attempts != 3 {
		t.Errorf("attempts %d with the flush, %d without; want 3 more (at 330, 660 and 990 s)", on.Attempts, off.Attempts)
	}
}
