package simulator

import (
	"strings"
	"testing"
)

// A replay checks itself: each deliberately broken placement fails the
// check with a message that says what broke; the sound ones pass.
func TestCheckerCatchesBrokenPlacements(t *testing.T) {
	nodes := []NodeRow{{Name: "n1", CPUMilli: 8000, MemoryMiB: 16384, GPUs: 2, Model: "A100"}, {Name: "n2", CPUMilli: 8000, MemoryMiB: 16384}}
	share := PodRow{Name: "s", CPUMilli: 1000, MemoryMiB: 1024, NumGPU: 1, GPUMilli: 600}
	whole := PodRow{Name: "w", CPUMilli: 1000, MemoryMiB: 1024, NumGPU: 2, GPUMilli: 1000}
	cpu := PodRow{Name: "c", CPUMilli: 7500, MemoryMiB: 1024}
	at := func(r PodRow, node string, milli int, devs ...int) Placement {
		return Placement{Pod: r.Name, Node: node, Devices: devs, Milli: milli}
	}
	type add struct {
		row PodRow
		p   Placement
	}
	tests := []struct {
		name      string
		wholeOnly bool
		adds      []add
		reported  int64
		want      string // "" passes
	}{
		{"sound", false, []add{{share, at(share, "n1", 600, 0)}, {share, at(share, "n1", 600, 1)}}, 1200, ""},
		{"device over a whole GPU", false, []add{{share, at(share, "n1", 600, 0)}, {share, at(share, "n1", 600, 0)}}, 1200, "device 0 holds 1200 milli"},
		{"CPU over", false, []add{{cpu, at(cpu, "n2", 0)}, {share, at(share, "n2", 0)}}, 600, "CPU 8500 of 8000"},
		{"no such device", false, []add{{share, at(share, "n1", 600, 2)}}, 600, "device 2 of 2"},
		{"fewer devices than asked", false, []add{{whole, at(whole, "n1", 1000, 0)}}, 2000, "holds 1 devices of 1000 milli, asked for 2 of 1000"},
		{"a model not allowed", false, []add{{PodRow{Name: "m", NumGPU: 1, GPUMilli: 1000, Models: []string{"V100"}}, at(whole, "n1", 1000, 0)}}, 1000, "model \"A100\" is not one of [V100]"},
		{"metric disagrees", false, []add{{share, at(share, "n1", 600, 0)}}, 1000, "the metric reports 1000 milli allocated"},
		{"no such node", false, []add{{share, at(share, "n9", 600, 0)}}, 600, "not a node of the trace"},
		{"vanilla: whole GPUs over", true, []add{{whole, at(whole, "n1", 0)}, {share, at(share, "n1", 0)}}, 2600, "3 whole GPUs of 2"},
		{"vanilla: sound", true, []add{{whole, at(whole, "n1", 0)}}, 2000, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := NewChecker(nodes, tc.wholeOnly)
			for _, a := range tc.adds {
				c.Add(a.row, a.p)
			}
			err := c.Finish(tc.reported)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("a sound replay fails: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want a failure with %q, got %v", tc.want, err)
			}
		})
	}
}
