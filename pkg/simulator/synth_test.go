package simulator

import (
	"context"
	"math"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// A synthetic trace is what its fleet and mix say: the same for a seed,
// nodes in the fleet's shares, pods in the mix's shares (within sampling
// error), every request drawn from its kind and fitting some node it may
// use, and it loads back from disk as written.
func TestSynthesize(t *testing.T) {
	for _, f := range Fleets {
		for _, m := range Mixes {
			tr, err := Synthesize(f.Name, m.Name, 200, 4000, 1)
			if err != nil {
				t.Fatal(err)
			}
			again, _ := Synthesize(f.Name, m.Name, 200, 4000, 1)
			if diff := cmp.Diff(tr, again); diff != "" {
				t.Fatalf("%s/%s: not the same for a seed:\n%s", f.Name, m.Name, diff)
			}
			other, _ := Synthesize(f.Name, m.Name, 200, 4000, 2)
			if cmp.Equal(tr.Pods, other.Pods) {
				t.Errorf("%s/%s: seeds 1 and 2 give the same pods", f.Name, m.Name)
			}
			if len(tr.Nodes) != 200 || len(tr.Pods) != 4000 {
				t.Fatalf("%s/%s: %d nodes, %d pods", f.Name, m.Name, len(tr.Nodes), len(tr.Pods))
			}
			for _, fn := range f.Nodes {
				n := 0
				for _, r := range tr.Nodes {
					if r.Model == fn.Model && r.GPUs == fn.GPUs && r.CPUMilli == fn.CPUMilli {
						n++
					}
				}
				if math.Abs(float64(n)-fn.Share*200) > 1 {
					t.Errorf("%s: %d nodes of %s×%d, want %.0f", f.Name, n, fn.Model, fn.GPUs, fn.Share*200)
				}
			}
			kinds := map[string]int{}
			for _, p := range tr.Pods {
				fits := false
				for _, n := range tr.Nodes {
					if p.CPUMilli <= n.CPUMilli && p.MemoryMiB <= n.MemoryMiB && p.NumGPU <= n.GPUs &&
						(len(p.Models) == 0 || slices.Contains(p.Models, n.Model)) {
						fits = true
						break
					}
				}
				if !fits {
					t.Fatalf("%s/%s: %+v fits no node", f.Name, m.Name, p)
				}
				if p.NumGPU > 0 && (p.GPUMilli <= 0 || p.GPUMilli > 1000 || (p.NumGPU > 1 && p.GPUMilli != 1000)) {
					t.Fatalf("%s/%s: bad GPU request %+v", f.Name, m.Name, p)
				}
				for _, k := range m.Kinds {
					if len(p.Name) > len(m.Name)+len(k.Name)+1 && p.Name[len(m.Name)+1:len(m.Name)+1+len(k.Name)+1] == k.Name+"-" {
						kinds[k.Name]++
					}
				}
			}
			for _, k := range m.Kinds {
				// 4000 draws: the share is within 4 standard errors.
				sd := math.Sqrt(k.Share * (1 - k.Share) / 4000)
				if got := float64(kinds[k.Name]) / 4000; math.Abs(got-k.Share) > 4*sd {
					t.Errorf("%s/%s: kind %s is %.3f of the pods, want %.3f", f.Name, m.Name, k.Name, got, k.Share)
				}
			}
			dir := t.TempDir()
			if err := WriteTrace(dir, tr); err != nil {
				t.Fatal(err)
			}
			back, err := Load(dir, m.Name)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tr.Nodes, back.Nodes); diff != "" {
				t.Fatalf("%s/%s: nodes differ after a round trip:\n%s", f.Name, m.Name, diff)
			}
			if diff := cmp.Diff(tr.Pods, back.Pods); diff != "" {
				t.Fatalf("%s/%s: pods differ after a round trip:\n%s", f.Name, m.Name, diff)
			}
		}
	}
	if _, err := Synthesize("nope", "mixed", 10, 10, 1); err == nil {
		t.Error("an unknown fleet is accepted")
	}
	if _, err := Synthesize("hopper", "nope", 10, 10, 1); err == nil {
		t.Error("an unknown mix is accepted")
	}
}

// A synthetic trace replays through the real framework like openb's, and
// every policy it is meant for places pods on it.
func TestSynthesizedReplays(t *testing.T) {
	tr, err := Synthesize("hopper", "mixed", 40, 400, 3)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []Policy{Learned, FGD} {
		r, err := Run(context.Background(), Experiment{Trace: tr, Policy: p, Seed: 42, Tune: 1.3})
		if err != nil {
			t.Fatal(err)
		}
		if r.Bound == 0 || r.Failed == 0 || math.IsNaN(r.Curve[100]) {
			t.Errorf("%s: %d bound, %d failed, @100 %v", p, r.Bound, r.Failed, r.Curve[100])
		}
	}
}
