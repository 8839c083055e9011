package simulator

import (
	"encoding/csv"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Synthetic traces: fleets and mixes unlike openb (newer GPU models,
// LLM-sized requests, another balance of shares and whole GPUs), written in
// openb's format so that every mode of gpu-sim replays them. Seeded: the same
// fleet, mix, sizes and seed give the same trace.

// FleetNode is one kind of node in a fleet, with its share of the nodes.
type FleetNode struct {
	Model     string
	GPUs      int
	CPUMilli  int64
	MemoryMiB int64
	Share     float64
	// Tier: 1 the training GPUs, 2 the large inference ones, 3 the small.
	Tier int
}

// Fleet is a cluster's node kinds.
type Fleet struct {
	Name, Help string
	Nodes      []FleetNode
}

// PodKind is one kind of pod in a mix, with its share of the pods. A pod
// draws one of each list. Tiers, if set, restrict the pod to the fleet's
// models of those tiers (a model constraint, as openb's gpu_spec).
type PodKind struct {
	Name      string
	Share     float64
	NumGPU    int
	Milli     []int
	CPUMilli  []int64
	MemoryMiB []int64
	Tiers     []int
}

// Mix is a workload's pod kinds.
type Mix struct {
	Name, Help string
	Kinds      []PodKind
}

const gib = 1024

// Fleets are the synthetic fleets (docs/benchmarks.md, "Learning fast").
var Fleets = []Fleet{
	{Name: "hopper", Help: "H100 and A100 (8 GPUs) for training, L40S and L4 (4 GPUs, and single L4s) for inference, with a cloud's cores per GPU", Nodes: []FleetNode{
		{Model: "H100", GPUs: 8, CPUMilli: 192000, MemoryMiB: 2048 * gib, Share: 0.20, Tier: 1},
		{Model: "A100", GPUs: 8, CPUMilli: 96000, MemoryMiB: 1152 * gib, Share: 0.25, Tier: 1},
		{Model: "L40S", GPUs: 4, CPUMilli: 48000, MemoryMiB: 384 * gib, Share: 0.25, Tier: 2},
		{Model: "L4", GPUs: 4, CPUMilli: 48000, MemoryMiB: 192 * gib, Share: 0.15, Tier: 3},
		{Model: "L4", GPUs: 1, CPUMilli: 8000, MemoryMiB: 32 * gib, Share: 0.15, Tier: 3},
	}},
	{Name: "a100", Help: "A100 only: 8-GPU nodes (80 and 40 GB) and 4-GPU ones, 12 cores per GPU", Nodes: []FleetNode{
		{Model: "A100-80", GPUs: 8, CPUMilli: 96000, MemoryMiB: 1152 * gib, Share: 0.50, Tier: 1},
		{Model: "A100-40", GPUs: 8, CPUMilli: 96000, MemoryMiB: 1152 * gib, Share: 0.30, Tier: 2},
		{Model: "A100-40", GPUs: 4, CPUMilli: 48000, MemoryMiB: 576 * gib, Share: 0.20, Tier: 2},
	}},
	{Name: "edge", Help: "small inference nodes: L4 and T4 (1 GPU with 4 cores, or 4 GPUs), a few L40S (4)", Nodes: []FleetNode{
		{Model: "L4", GPUs: 1, CPUMilli: 4000, MemoryMiB: 16 * gib, Share: 0.30, Tier: 3},
		{Model: "L4", GPUs: 4, CPUMilli: 48000, MemoryMiB: 192 * gib, Share: 0.25, Tier: 3},
		{Model: "T4", GPUs: 1, CPUMilli: 4000, MemoryMiB: 16 * gib, Share: 0.20, Tier: 3},
		{Model: "T4", GPUs: 4, CPUMilli: 48000, MemoryMiB: 192 * gib, Share: 0.15, Tier: 3},
		{Model: "L40S", GPUs: 4, CPUMilli: 48000, MemoryMiB: 384 * gib, Share: 0.10, Tier: 2},
	}},
}

// Mixes are the synthetic workloads. Requests are the sizes users write
// (whole cores, powers of two of memory), with the cores per GPU that
// training and serving ask for (6–12), so that CPU, not only GPUs, runs out.
// A pod is clipped to half of the largest node it may use; a kind whose
// tiers the fleet lacks takes the fleet's best tier (tierModels).
var Mixes = []Mix{
	{Name: "llm-train", Help: "LLM training: 8- and 4-GPU jobs with 6-12 cores per GPU, some 1-2 GPU, data loaders", Kinds: []PodKind{
		{Name: "train8", Share: 0.30, NumGPU: 8, Milli: []int{1000}, CPUMilli: []int64{48000, 64000, 96000}, MemoryMiB: []int64{256 * gib, 512 * gib}, Tiers: []int{1}},
		{Name: "train4", Share: 0.20, NumGPU: 4, Milli: []int{1000}, CPUMilli: []int64{24000, 32000, 48000}, MemoryMiB: []int64{128 * gib, 256 * gib}, Tiers: []int{1, 2}},
		{Name: "train2", Share: 0.15, NumGPU: 2, Milli: []int{1000}, CPUMilli: []int64{12000, 16000, 24000}, MemoryMiB: []int64{64 * gib, 128 * gib}},
		{Name: "dev1", Share: 0.20, NumGPU: 1, Milli: []int{1000}, CPUMilli: []int64{4000, 8000, 16000}, MemoryMiB: []int64{32 * gib, 64 * gib}},
		{Name: "loader", Share: 0.15, CPUMilli: []int64{4000, 8000, 16000, 32000}, MemoryMiB: []int64{16 * gib, 32 * gib, 64 * gib}},
	}},
	{Name: "inference", Help: "serving: one whole GPU or a share of one (0.1-0.7), a few 2-GPU replicas, CPU front-ends", Kinds: []PodKind{
		{Name: "serve1", Share: 0.30, NumGPU: 1, Milli: []int{1000}, CPUMilli: []int64{4000, 8000, 12000}, MemoryMiB: []int64{16 * gib, 32 * gib, 64 * gib}},
		{Name: "serve-frac", Share: 0.25, NumGPU: 1, Milli: []int{300, 500, 700}, CPUMilli: []int64{2000, 4000, 8000}, MemoryMiB: []int64{8 * gib, 16 * gib}, Tiers: []int{2, 3}},
		{Name: "serve-small", Share: 0.20, NumGPU: 1, Milli: []int{100, 150, 200, 250}, CPUMilli: []int64{1000, 2000}, MemoryMiB: []int64{4 * gib, 8 * gib}},
		{Name: "serve2", Share: 0.10, NumGPU: 2, Milli: []int{1000}, CPUMilli: []int64{16000, 24000}, MemoryMiB: []int64{64 * gib, 96 * gib}, Tiers: []int{1, 2}},
		{Name: "frontend", Share: 0.15, CPUMilli: []int64{2000, 4000, 8000, 16000}, MemoryMiB: []int64{4 * gib, 8 * gib, 16 * gib}},
	}},
	{Name: "notebook", Help: "notebooks: shares of 0.1-0.8, some whole GPUs, many CPU-only kernels", Kinds: []PodKind{
		{Name: "nb-small", Share: 0.35, NumGPU: 1, Milli: []int{100, 200, 300, 400}, CPUMilli: []int64{2000, 4000, 8000}, MemoryMiB: []int64{8 * gib, 16 * gib}},
		{Name: "nb-large", Share: 0.15, NumGPU: 1, Milli: []int{500, 600, 800}, CPUMilli: []int64{4000, 8000}, MemoryMiB: []int64{16 * gib, 32 * gib}},
		{Name: "nb-gpu", Share: 0.15, NumGPU: 1, Milli: []int{1000}, CPUMilli: []int64{8000, 16000}, MemoryMiB: []int64{32 * gib, 64 * gib}},
		{Name: "nb-cpu", Share: 0.35, CPUMilli: []int64{2000, 4000, 8000, 16000}, MemoryMiB: []int64{4 * gib, 8 * gib, 16 * gib}},
	}},
	{Name: "mixed", Help: "a shared cluster: a quarter training, a third serving, the rest notebooks and CPU jobs", Kinds: []PodKind{
		{Name: "train8", Share: 0.08, NumGPU: 8, Milli: []int{1000}, CPUMilli: []int64{48000, 96000}, MemoryMiB: []int64{256 * gib, 512 * gib}, Tiers: []int{1}},
		{Name: "train4", Share: 0.07, NumGPU: 4, Milli: []int{1000}, CPUMilli: []int64{24000, 48000}, MemoryMiB: []int64{128 * gib}, Tiers: []int{1, 2}},
		{Name: "train2", Share: 0.10, NumGPU: 2, Milli: []int{1000}, CPUMilli: []int64{12000, 24000}, MemoryMiB: []int64{64 * gib}},
		{Name: "serve1", Share: 0.15, NumGPU: 1, Milli: []int{1000}, CPUMilli: []int64{4000, 8000, 12000}, MemoryMiB: []int64{16 * gib, 32 * gib}},
		{Name: "serve-frac", Share: 0.10, NumGPU: 1, Milli: []int{300, 500, 700}, CPUMilli: []int64{2000, 4000, 8000}, MemoryMiB: []int64{8 * gib, 16 * gib}, Tiers: []int{2, 3}},
		{Name: "serve-small", Share: 0.10, NumGPU: 1, Milli: []int{100, 200, 250}, CPUMilli: []int64{1000, 2000}, MemoryMiB: []int64{4 * gib, 8 * gib}},
		{Name: "nb-small", Share: 0.15, NumGPU: 1, Milli: []int{100, 200, 300, 400}, CPUMilli: []int64{2000, 4000}, MemoryMiB: []int64{8 * gib, 16 * gib}},
		{Name: "cpu", Share: 0.25, CPUMilli: []int64{2000, 4000, 8000, 16000}, MemoryMiB: []int64{4 * gib, 8 * gib, 16 * gib, 32 * gib}},
	}},
}

// FleetNames and MixNames list the names, comma-separated.
func FleetNames() string {
	var n []string
	for _, f := range Fleets {
		n = append(n, f.Name)
	}
	return strings.Join(n, ", ")
}

func MixNames() string {
	var n []string
	for _, m := range Mixes {
		n = append(n, m.Name)
	}
	return strings.Join(n, ", ")
}

func findFleet(name string) (*Fleet, error) {
	var names []string
	for i := range Fleets {
		if Fleets[i].Name == name {
			return &Fleets[i], nil
		}
		names = append(names, Fleets[i].Name)
	}
	return nil, fmt.Errorf("unknown fleet %q (have %s)", name, strings.Join(names, ", "))
}

func findMix(name string) (*Mix, error) {
	var names []string
	for i := range Mixes {
		if Mixes[i].Name == name {
			return &Mixes[i], nil
		}
		names = append(names, Mixes[i].Name)
	}
	return nil, fmt.Errorf("unknown mix %q (have %s)", name, strings.Join(names, ", "))
}

// tierModels is the fleet's models of the given tiers; where the fleet has
// none, its best tier (a fleet without training GPUs trains on what it has).
func tierModels(f *Fleet, tiers []int) []string {
	pick := func(ok func(int) bool) []string {
		var out []string
		for _, n := range f.Nodes {
			if ok(n.Tier) && !slices.Contains(out, n.Model) {
				out = append(out, n.Model)
			}
		}
		return out
	}
	if m := pick(func(t int) bool { return slices.Contains(tiers, t) }); len(m) > 0 {
		return m
	}
	best := 99
	for _, n := range f.Nodes {
		best = min(best, n.Tier)
	}
	return pick(func(t int) bool { return t == best })
}

// pickShare draws an index with probability proportional to its share.
func pickShare(r *rand.Rand, shares []float64) int {
	var total float64
	for _, s := range shares {
		total += s
	}
	x := r.Float64() * total
	for i, s := range shares {
		if x < s {
			return i
		}
		x -= s
	}
	return len(shares) - 1
}

// Synthesize draws a trace of the fleet and mix: nodes in the fleet's shares
// (largest remainders, so the shares hold exactly), and pods drawn kind by
// kind, each request drawn from its kind's lists, clipped to the largest node
// that may take it, so that no pod is larger than every node it may use.
func Synthesize(fleetName, mixName string, nodes, pods int, seed int64) (*Trace, error) {
	f, err := findFleet(fleetName)
	if err != nil {
		return nil, err
	}
	m, err := findMix(mixName)
	if err != nil {
		return nil, err
	}
	if nodes < len(f.Nodes) || pods < 1 {
		return nil, fmt.Errorf("want at least %d nodes and 1 pod, got %d and %d", len(f.Nodes), nodes, pods)
	}
	r := rand.New(rand.NewSource(seed))
	t := &Trace{Workload: mixName}
	counts := make([]int, len(f.Nodes))
	type rem struct {
		i    int
		frac float64
	}
	var rems []rem
	left := nodes
	for i, n := range f.Nodes {
		x := n.Share * float64(nodes)
		counts[i] = int(x)
		left -= counts[i]
		rems = append(rems, rem{i, x - float64(counts[i])})
	}
	sort.SliceStable(rems, func(a, b int) bool { return rems[a].frac > rems[b].frac })
	for k := 0; k < left; k++ {
		counts[rems[k%len(rems)].i]++
	}
	for i, n := range f.Nodes {
		for k := 0; k < counts[i]; k++ {
			t.Nodes = append(t.Nodes, NodeRow{Name: fmt.Sprintf("%s-node-%04d", f.Name, len(t.Nodes)),
				CPUMilli: n.CPUMilli, MemoryMiB: n.MemoryMiB, GPUs: n.GPUs, Model: n.Model})
		}
	}
	shares := make([]float64, len(m.Kinds))
	for i, k := range m.Kinds {
		shares[i] = k.Share
	}
	for i := 0; i < pods; i++ {
		k := &m.Kinds[pickShare(r, shares)]
		p := PodRow{Name: fmt.Sprintf("%s-%s-%05d", mixName, k.Name, i), NumGPU: k.NumGPU,
			CPUMilli: k.CPUMilli[r.Intn(len(k.CPUMilli))], MemoryMiB: k.MemoryMiB[r.Intn(len(k.MemoryMiB))]}
		if k.NumGPU > 0 {
			p.GPUMilli = k.Milli[r.Intn(len(k.Milli))]
			if len(k.Tiers) > 0 {
				p.Models = tierModels(f, k.Tiers)
			}
		}
		// The largest node the pod may use (most CPU, then memory) bounds
		// its request, so that it fits that node.
		var cpu, mem int64
		largest := func(ok func(FleetNode) bool) {
			for _, n := range f.Nodes {
				if ok(n) && (n.CPUMilli > cpu || (n.CPUMilli == cpu && n.MemoryMiB > mem)) {
					cpu, mem = n.CPUMilli, n.MemoryMiB
				}
			}
		}
		largest(func(n FleetNode) bool {
			return n.GPUs >= p.NumGPU && (len(p.Models) == 0 || slices.Contains(p.Models, n.Model))
		})
		if cpu == 0 {
			// No node it may use has that many GPUs (8-GPU jobs on a fleet
			// of 4-GPU nodes): the fleet's largest GPU count, on any model.
			g := 0
			for _, n := range f.Nodes {
				g = max(g, n.GPUs)
			}
			p.NumGPU, p.Models = g, nil
			largest(func(n FleetNode) bool { return n.GPUs == g })
		}
		p.CPUMilli, p.MemoryMiB = min(p.CPUMilli, cpu/2), min(p.MemoryMiB, mem/2)
		if k.NumGPU == 0 {
			p.CPUMilli, p.MemoryMiB = min(p.CPUMilli, cpu/4), min(p.MemoryMiB, mem/4)
		}
		t.Pods = append(t.Pods, p)
	}
	return t, nil
}

// WriteTrace writes a trace in openb's format: DIR/NodeFile and
// DIR/PodFile(t.Workload). A directory holds one fleet.
func WriteTrace(dir string, t *Trace) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	write := func(name string, header []string, rows [][]string) error {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		w := csv.NewWriter(f)
		w.Write(header)
		w.WriteAll(rows)
		if err := w.Error(); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
	var rows [][]string
	for _, n := range t.Nodes {
		rows = append(rows, []string{n.Name, strconv.FormatInt(n.CPUMilli, 10), strconv.FormatInt(n.MemoryMiB, 10), strconv.Itoa(n.GPUs), n.Model})
	}
	if err := write(NodeFile, []string{"sn", "cpu_milli", "memory_mib", "gpu", "model"}, rows); err != nil {
		return err
	}
	rows = rows[:0]
	for _, p := range t.Pods {
		rows = append(rows, []string{p.Name, strconv.FormatInt(p.CPUMilli, 10), strconv.FormatInt(p.MemoryMiB, 10), strconv.Itoa(p.NumGPU),
			strconv.Itoa(p.GPUMilli), strings.Join(p.Models, "|"), "LS", "Running", "0", "0", "0"})
	}
	return write(PodFile(t.Workload), []string{"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase", "creation_time", "deletion_time", "scheduled_time"}, rows)
}
