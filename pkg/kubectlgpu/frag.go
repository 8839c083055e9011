package kubectlgpu

import (
	"context"
	"fmt"
	"os"
	"sort"
	"text/tabwriter"

	v1 "k8s.io/api/core/v1"
	"k8s.io/component-helpers/resource"
	"sigs.k8s.io/yaml"

	ourconfig "github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config"
	configv1 "github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config/v1"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
)

// maxKinds bounds the typical kinds shown (the scheduler exports as many).
const maxKinds = 8

// Kind is a typical kind of pod of the target workload.
type Kind struct {
	Kind  string  `json:"kind"`
	Share float64 `json:"share"`
	// Placeable is how many more of it would fit, each node alone.
	Placeable int64 `json:"placeable"`
}

// NodeFrag is one node's fragmentation.
type NodeFrag struct {
	Name      string  `json:"name"`
	Model     string  `json:"model,omitempty"`
	IdleMilli int64   `json:"idleMilli"`
	FragMilli float64 `json:"fragmentationMilli"`
	// Placeable is per kind, in the order of FragReport.Kinds.
	Placeable []int64 `json:"placeable"`
}

// FragReport is `kubectl gpu frag`.
type FragReport struct {
	// Workload says where the target workload comes from.
	Workload  string     `json:"workload"`
	Kinds     []Kind     `json:"kinds"`
	Nodes     []NodeFrag `json:"nodes"`
	IdleMilli int64      `json:"idleMilli"`
	FragMilli float64    `json:"fragmentationMilli"`
	// Ratio is FragMilli / IdleMilli.
	Ratio float64 `json:"ratio"`
}

// Frag measures, per node and for the cluster, the idle GPU that the
// typical pods of the target workload could not use (the scheduler's
// fragmentation metric), and how many more of each would fit.
func (o *Options) Frag(ctx context.Context) (*FragReport, error) {
	c, err := o.view(ctx, "")
	if err != nil {
		return nil, err
	}
	defer c.Close()
	wl, from := o.Workload, "given"
	if wl == nil {
		// The scheduler's own: static from its configuration, or learned
		// by its profile from the pods it sees.
		wl = c.Workload()
		switch a := c.scoreArgs(); {
		case a != nil && a.TargetWorkload.Mode == ourconfig.WorkloadStatic:
			from = "static, from " + c.from
		case c.published != "":
			from = "learned: " + c.published
		default:
			from = fmt.Sprintf("learned from the %d GPU pods of %s, as %s learns it", c.seen, o.SchedulerName, c.from)
			if c.targetNote != "" {
				from += " (" + c.targetNote + ")"
			}
		}
	}
	r := &FragReport{Workload: from, Kinds: []Kind{}, Nodes: []NodeFrag{}}
	if wl == nil {
		r.Workload = "none: no GPU pods to learn from (give --workload)"
		return r, nil
	}
	tasks := gpu.TopGPUTasks(wl, maxKinds)
	for _, t := range tasks {
		r.Kinds = append(r.Kinds, Kind{Kind: gpu.TaskKind(t), Share: t.Weight})
	}
	tr := c.Tracker()
	for i := range c.nodes {
		n := &c.nodes[i]
		pods := c.onNode[n.Name]
		cpuFree, memFree := free(n, pods)
		st := tr.Compute(n, pods, cpuFree, memFree, "", false)
		if st.Usable() == 0 {
			continue
		}
		nf := NodeFrag{Name: n.Name, Model: st.Model, IdleMilli: st.Idle(), FragMilli: gpu.FragAt(wl, st, cpuFree, c.ropts.NeedsDelivery)}
		for k := range tasks {
			var room int64
			if !n.Spec.Unschedulable {
				// Cordoned: no more pods, as the scheduler's metric counts.
				room = st.Room(&tasks[k], cpuFree, memFree, c.ropts.NeedsDelivery)
			}
			nf.Placeable = append(nf.Placeable, room)
			r.Kinds[k].Placeable += room
		}
		r.Nodes = append(r.Nodes, nf)
		r.IdleMilli += nf.IdleMilli
		r.FragMilli += nf.FragMilli
	}
	if r.IdleMilli > 0 {
		r.Ratio = r.FragMilli / float64(r.IdleMilli)
	}
	return r, nil
}

// free is the CPU (milli) and memory (MiB) the node's pods leave.
func free(n *v1.Node, pods []*v1.Pod) (int64, int64) {
	cpu, mem := n.Status.Allocatable.Cpu().MilliValue(), n.Status.Allocatable.Memory().Value()
	for _, p := range pods {
		req := resource.PodRequests(p, resource.PodResourcesOptions{})
		cpu -= req.Cpu().MilliValue()
		mem -= req.Memory().Value()
	}
	return cpu, mem >> 20
}

// PrintFrag writes the report.
func (o *Options) PrintFrag(r *FragReport) error {
	if !o.table() {
		names := make([]string, len(r.Nodes))
		for i := range r.Nodes {
			names[i] = "node/" + r.Nodes[i].Name
		}
		return o.print("FragReport", r, names)
	}
	if !o.NoHeaders {
		fmt.Fprintf(o.Out, "Target workload: %s\n", r.Workload)
	}
	w := tabwriter.NewWriter(o.Out, 0, 0, 2, ' ', 0)
	o.header(w, "KIND\tSHARE\tMORE WOULD FIT")
	for _, k := range r.Kinds {
		fmt.Fprintf(w, "%s\t%.1f%%\t%d\n", k.Kind, 100*k.Share, k.Placeable)
	}
	w.Flush()
	fmt.Fprintln(o.Out)
	w = tabwriter.NewWriter(o.Out, 0, 0, 2, ' ', 0)
	if !o.NoHeaders {
		fmt.Fprint(w, "NODE\tMODEL\tIDLE\tFRAGMENTED\t")
		for k := range r.Kinds {
			fmt.Fprintf(w, "K%d\t", k+1)
		}
		fmt.Fprintln(w)
	}
	nodes := append([]NodeFrag{}, r.Nodes...)
	sort.SliceStable(nodes, func(i, j int) bool { return nodes[i].FragMilli > nodes[j].FragMilli })
	for _, n := range nodes {
		fmt.Fprintf(w, "%s\t%s\t%dm\t%.0fm (%s)\t", n.Name, n.Model, n.IdleMilli, n.FragMilli, ratio(n.FragMilli, n.IdleMilli))
		for _, p := range n.Placeable {
			fmt.Fprintf(w, "%d\t", p)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "CLUSTER\t\t%dm\t%.0fm (%s)\t\n", r.IdleMilli, r.FragMilli, ratio(r.FragMilli, r.IdleMilli))
	if err := w.Flush(); err != nil {
		return err
	}
	if len(r.Kinds) > 0 && !o.NoHeaders {
		fmt.Fprintln(o.Out, "\nK1..: how many more pods of each kind above the node could take on its own.")
	}
	return nil
}

func ratio(f float64, idle int64) string {
	if idle == 0 {
		return "0%"
	}
	return fmt.Sprintf("%.0f%%", 100*f/float64(idle))
}

// ReadWorkload reads a workload file: a YAML list of tasks, as in
// GPUScoreArgs.targetWorkload.tasks.
func ReadWorkload(path string) (*gpu.Workload, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var tasks []configv1.WorkloadTask
	if err := yaml.UnmarshalStrict(b, &tasks); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var out []gpu.Task
	for _, t := range tasks {
		out = append(out, gpu.Task{CPU: t.CPUMilli, Memory: t.MemoryMiB, Milli: t.GPUMilli, Count: t.GPUCount,
			Models: gpu.ModelSelector{Exact: t.Models}, Weight: float64(t.Weight)})
	}
	wl, err := gpu.NewWorkload(out)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return wl, nil
}
