package simulator

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/utils/ptr"

	"github.com/gpu-scheduler/gpu-scheduler/manifests"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/offline"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/plugins/gpufit"
)

// Policy is a scheduler setup to compare.
type Policy string

const (
	// Learned is the shipped configuration: Fragmentation against a target
	// workload learned online from the pods seen so far.
	Learned Policy = "learned"
	// FGD is Fragmentation with the target workload taken from the whole
	// trace, as the published method does.
	FGD Policy = "fgd"
	// BestFit, Packing and Spread are GPUScore's other policies.
	BestFit Policy = "bestfit"
	Packing Policy = "packing"
	Spread  Policy = "spread"
	// Vanilla is kube-scheduler v1.37.2's default profile, whole GPUs only.
	Vanilla Policy = "vanilla"
)

// Ablations of the fragmentation policy (trace target), one idea removed each:
//   - FGDPaper: FGD as published: no memory in the fit;
//   - FGDNoPrio: no stable node order: ties fall to the scheduler's heap;
//   - FGDExact: ranked by the exact growth, ties to the least idle node
//     (our first design, so without the stranded-GPU term either);
//   - FGDCPUOrder: CPU-only pods tie by the node order alone, not the
//     least idle GPU first.
const (
	FGDPaper    Policy = "fgd-paper"
	FGDNoPrio   Policy = "fgd-noprio"
	FGDExact    Policy = "fgd-exact"
	FGDCPUOrder Policy = "fgd-cpuorder"
	// FGDPure is the paper's FGD and nothing more: no memory in the fit,
	// CPU-only pods by the node order alone (no least-idle rule), no
	// stranded-GPU term.
	FGDPure Policy = "fgd-pure"
	// LearnedXDev is Learned with a share's device chosen by the exact
	// growth instead of the first device of the best bucket.
	LearnedXDev Policy = "learned-xdev"
	// LearnedIdle is Learned with ties between GPU pods' nodes broken by
	// the least idle GPU first, before the node order, as for CPU-only pods.
	LearnedIdle Policy = "learned-idle"
	// LearnedNoDecay is Learned with no forgetting (halfLifePods 0).
	LearnedNoDecay Policy = "learned-nodecay"
	// LearnedBucketCPU is Learned with kinds grouped by a bucket of their
	// CPU request (three significant bits) from the first pod, as before
	// exact keys.
	LearnedBucketCPU Policy = "learned-bucketcpu"
	// LearnedNoStrand is Learned without the stranded-GPU term.
	LearnedNoStrand Policy = "learned-nostrand"
	// LearnedNoScarce is Learned without the model-scarcity term.
	LearnedNoScarce Policy = "learned-noscarce"
)

// A fleet whose GPUs DRA hands out (issue 33): the nodes are chosen as by
// Learned, but each pod's devices are what DRA's structured allocator
// gives, the first that fit in the order it is shown:
//   - DRAFirstFit: the slices' order, as upstream's plugin shows them;
//   - DRABestFit: our order (gpu.NodeState.DeviceOrder, the most used
//     first), as GPUDynamicResources shows them.
const (
	DRAFirstFit Policy = "learned-dra-firstfit"
	DRABestFit  Policy = "learned-dra"
)

// Policies lists every policy, in report order; the ablations come last.
var Policies = []Policy{Learned, FGD, BestFit, Packing, Spread, Vanilla, FGDPure, FGDPaper, FGDNoPrio, FGDExact, FGDCPUOrder, LearnedXDev, LearnedIdle, LearnedNoDecay, LearnedBucketCPU, LearnedNoStrand, LearnedNoScarce, DRAFirstFit, DRABestFit}

// Compared is the default set: the six the benchmark compares.
var Compared = Policies[:6]

// PolicyHelp describes the policies for --help.
var PolicyHelp = map[Policy]string{
	Learned:          "the shipped profile: GPUScore Fragmentation, target workload learned online",
	FGD:              "GPUScore Fragmentation with the trace's typical pods as target (the paper's FGD with our refinements: the oracle twin of learned)",
	BestFit:          "GPUScore BestFit",
	Packing:          "GPUScore Packing",
	Spread:           "GPUScore Spread",
	Vanilla:          "kube-scheduler v1.37.2 default profile; shared pods take whole GPUs",
	FGDPure:          "the paper's FGD: fgd without memory in the fit, the least-idle rule for CPU-only pods or the stranded-GPU term",
	FGDPaper:         "ablation: fgd without memory in the fit",
	FGDNoPrio:        "ablation: fgd without the stable node-order tie-break",
	FGDExact:         "ablation: fgd ranked by the exact growth, least-idle tie-break, no node order",
	FGDCPUOrder:      "ablation: fgd with CPU-only pods on GPU nodes by the node order alone (no least-idle first)",
	LearnedXDev:      "experiment: learned with a share's device chosen by the exact fragmentation growth",
	LearnedIdle:      "experiment: learned with every pod's ties broken by the least idle GPU first",
	LearnedNoDecay:   "experiment: learned with no forgetting (halfLifePods 0)",
	LearnedBucketCPU: "ablation: learned with kinds of pod grouped by a bucket of their CPU, not the exact request",
	LearnedNoStrand:  "ablation: learned without the stranded-GPU term (strandedGPUWeightPercent 0)",
	LearnedNoScarce:  "ablation: learned without the model-scarcity term (modelScarcityWeightPercent 0)",
	DRAFirstFit:      "DRA fleet: nodes as learned, devices by DRA's allocator over the slices' order (upstream's first fit)",
	DRABestFit:       "DRA fleet: nodes as learned, devices by DRA's allocator over our order (the most used first, GPUDynamicResources)",
}

// ParsePolicy validates a policy name.
func ParsePolicy(s string) (Policy, error) {
	for _, p := range Policies {
		if string(p) == s {
			return p, nil
		}
	}
	return "", fmt.Errorf("unknown policy %q (want one of %v)", s, Policies)
}

// Experiment is one replay.
type Experiment struct {
	Trace  *Trace
	Policy Policy
	Seed   int64
	Tune   float64
	// Parallelism of Filter and Score inside a cycle (the scheduler's 16).
	Parallelism int
	// Progress, if set, is called every 1000 pods.
	Progress func(done, total int)
	// Limit stops after so many pods (profiling); 0 replays all.
	Limit int
	// KeepPlacements keeps every bound pod's placement in the result (the
	// placement log).
	KeepPlacements bool
	// TieOrder is how the last ties are broken: TieHash (the shipped
	// stable order) or TieReference (the published simulator's).
	TieOrder string
}

// Tie orders.
const (
	TieHash      = "hash"
	TieReference = "reference"
)

// Result is what one replay measured.
type Result struct {
	// Format is ResultFormat when the run was made: a cached run of another
	// format is made again, not reused.
	Format   int
	Workload string
	Policy   Policy
	Seed     int64
	Tune     float64
	TieOrder string
	Curve    Curve
	Events   []Event
	Pods     int
	Bound    int
	Failed   int
	// Capacity is the cluster's GPU capacity (milli); FinalAllocated what
	// the bound pods hold at the end.
	Capacity       int64
	FinalAllocated int64
	Wall           time.Duration
	// FailReasons counts, per Filter reason, the nodes that refused the
	// failed pods (summed over failed pods).
	FailReasons map[string]int `json:",omitempty"`
	// Placements are where the bound pods went (with KeepPlacements).
	Placements []Placement `json:"-"`
}

// ResultFormat changes whenever a change to the replay or the metric can
// change a saved curve (3: the original's ten draws before the node ranks
// and its per-event rounding; 4: the stranded-GPU term, which moves
// learned's and fgd's placements; 5: the model-scarcity term, which moves
// them on traces whose pods restrict their GPU model), so that no grid
// mixes runs of two versions.
const ResultFormat = 5

// Profile builds the scheduler profile a policy runs: the shipped
// configuration (with GPUScore's args set for the policy), or the vanilla
// default. Every node is evaluated (percentageOfNodesToScore 100), as in the
// published method.
func Profile(p Policy, t *Trace, tieOrder string) (*schedconfig.KubeSchedulerProfile, error) {
	data := manifests.SchedulerConfig
	name := gpu.SchedulerName
	if p == Vanilla {
		data = []byte("apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n")
		name = v1.DefaultSchedulerName
	}
	cfg, err := offline.LoadConfig(data)
	if err != nil {
		return nil, err
	}
	prof, err := offline.Profile(cfg, name)
	if err != nil {
		return nil, err
	}
	prof.PercentageOfNodesToScore = ptr.To[int32](100)
	noPublishing(prof)
	var args *config.GPUScoreArgs
	for _, pc := range prof.PluginConfig {
		if a, ok := pc.Args.(*config.GPUScoreArgs); ok {
			args = a
		}
		if a, ok := pc.Args.(*config.GPUFitArgs); ok {
			// The trace's nodes run no device plugin: shares are
			// accounted, as in the published method.
			a.AccountingOnlySharing = true
		}
	}
	if args != nil && tieOrder == TieReference {
		args.Scoring.ReferenceNodeOrder = true
	}
	switch p {
	case Learned, Vanilla, DRAFirstFit, DRABestFit:
	case LearnedXDev:
		args.Scoring.ExactDeviceChoice = true
	case LearnedIdle:
		args.Scoring.LeastIdleTieBreak = true
	case LearnedNoDecay:
		args.TargetWorkload.HalfLifePods = 0
	case LearnedBucketCPU:
		args.TargetWorkload.BucketCPU = true
	case LearnedNoStrand:
		args.Scoring.StrandedGPUWeightPercent = 0
	case LearnedNoScarce:
		args.Scoring.ModelScarcityWeightPercent = 0
	case FGD, FGDPure, FGDPaper, FGDNoPrio, FGDExact, FGDCPUOrder:
		args.Policy = string(gpu.Fragmentation)
		args.TargetWorkload.Mode = config.WorkloadStatic
		args.TargetWorkload.Tasks = TraceTasks(t, float64(args.TargetWorkload.CoveragePercent)/100)
		switch p {
		case FGDPaper:
			args.Scoring.MemoryAware = false
		case FGDPure:
			args.Scoring.MemoryAware = false
			args.Scoring.CPUOnlyLeastIdleTieBreak = false
			args.Scoring.StrandedGPUWeightPercent = 0
			args.Scoring.ModelScarcityWeightPercent = 0
			if tieOrder == TieReference {
				// The paper's FGD as its simulator computes it, float
				// rounding included, to land on its placements.
				args.Scoring.ReferenceArithmetic = true
				args.TargetWorkload.ReferenceTracePods = int64(len(t.Pods))
			}
		case FGDNoPrio:
			args.Scoring.NodePriorityTieBreak = false
		case FGDCPUOrder:
			args.Scoring.CPUOnlyLeastIdleTieBreak = false
		case FGDExact:
			args.Scoring = config.ScoringOptions{Resolution: config.ResolutionExact, LeastIdleTieBreak: true}
		}
	case BestFit:
		args.Policy = string(gpu.BestFit)
	case Packing:
		args.Policy = string(gpu.Packing)
	case Spread:
		args.Policy = string(gpu.Spread)
	default:
		return nil, fmt.Errorf("unknown policy %q", p)
	}
	return prof, nil
}

// TraceTasks is the paper's target workload: the trace's typical pods (all
// of them, before shuffling and tuning), most frequent first, covering the
// given share.
func TraceTasks(t *Trace, coverage float64) []config.WorkloadTask {
	reqs := make([]gpu.Request, 0, len(t.Pods))
	for _, p := range t.Pods {
		r := gpu.Request{CPU: p.CPUMilli, Memory: p.MemoryMiB, Models: gpu.ModelSelector{Exact: p.Models}}
		switch {
		case p.NumGPU == 0:
		case p.GPUMilli >= gpu.MilliPerGPU || p.NumGPU > 1:
			r.Count = int32(p.NumGPU)
		default:
			r.Milli = int32(p.GPUMilli)
		}
		if p.NumGPU == 0 {
			r.Models = gpu.ModelSelector{}
		}
		reqs = append(reqs, r)
	}
	var out []config.WorkloadTask
	for _, tk := range gpu.TypicalTasks(reqs, coverage) {
		out = append(out, config.WorkloadTask{CPUMilli: tk.CPU, MemoryMiB: tk.Memory, GPUMilli: tk.Milli, GPUCount: tk.Count,
			Models: slices.Clone(tk.Models.Exact), Weight: int64(tk.Weight)})
	}
	return out
}

// setAllocator models a fleet whose devices DRA's allocator hands out, for
// the DRA policies.
func setAllocator(fw fwk.Handle, p Policy) {
	switch p {
	case DRAFirstFit:
		gpufit.SetAllocator(fw, func(st *gpu.NodeState, r *gpu.Request) (gpu.Choice, bool) { return st.FirstFit(r, nil) })
	case DRABestFit:
		gpufit.SetAllocator(fw, func(st *gpu.NodeState, r *gpu.Request) (gpu.Choice, bool) { return st.FirstFit(r, st.DeviceOrder(nil)) })
	}
}

// Run replays one experiment.
func Run(ctx context.Context, e Experiment) (*Result, error) {
	start := time.Now()
	arrival, err := NewArrival(e.Trace, e.Seed, e.Tune)
	if err != nil {
		return nil, err
	}
	prof, err := Profile(e.Policy, e.Trace, e.TieOrder)
	if err != nil {
		return nil, err
	}
	nodes := make([]*v1.Node, 0, len(arrival.Nodes))
	for _, n := range arrival.Nodes {
		nodes = append(nodes, NodeObject(n))
	}
	cluster, err := offline.NewCluster(nodes, nil)
	if err != nil {
		return nil, err
	}
	client, _ := newClient()
	ctx, cancel := context.WithCancel(klog.NewContext(ctx, klog.Background().V(0)))
	defer cancel()
	fw, _, err := offline.NewFramework(ctx, prof, cluster, client, offline.Options{Parallelism: e.Parallelism})
	if err != nil {
		return nil, err
	}
	defer fw.Close()
	setAllocator(fw, e.Policy)

	res := &Result{Format: ResultFormat, Workload: e.Trace.Workload, Policy: e.Policy, Seed: e.Seed, Tune: e.Tune,
		TieOrder: e.TieOrder, Pods: len(arrival.Pods), Capacity: e.Trace.Capacity()}
	res.Events = make([]Event, 0, len(arrival.Pods))
	pods := client.CoreV1().Pods(Namespace)
	var arrived, allocated int64
	check := NewChecker(arrival.Nodes, e.Policy == Vanilla)
	for i, row := range arrival.Pods {
		if e.Limit > 0 && i >= e.Limit {
			break
		}
		// An interrupted replay must not pass for a result: the cancelled
		// framework would fail every remaining pod.
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		var pod *v1.Pod
		if e.Policy == Vanilla {
			pod = VanillaPodObject(row, i)
		} else {
			pod = PodObject(row, i, gpu.SchedulerName)
		}
		// The pod exists in the API, so that PreBind can write on it.
		if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return nil, err
		}
		sched := offline.Schedule(ctx, fw, cluster, pod)
		arrived += row.GPURequest()
		bound := false
		if sched.Node != "" {
			committed, err := offline.Commit(ctx, fw, cluster, pod, sched, func(p *v1.Pod) *v1.Pod {
				got, err := pods.Get(ctx, p.Name, metav1.GetOptions{})
				if err != nil {
					return p
				}
				return got
			})
			if bound = err == nil; bound {
				pl := placementOf(row, sched.Node, committed.Annotations, i)
				check.Add(row, pl)
				if e.KeepPlacements {
					res.Placements = append(res.Placements, pl)
				}
			}
		} else if _, isFit := sched.Err.(*framework.FitError); sched.Err != nil && !isFit {
			return nil, fmt.Errorf("pod %s: %w", pod.Name, sched.Err)
		}
		if bound {
			allocated += row.GPURequest()
			res.Bound++
		} else {
			if res.FailReasons == nil {
				res.FailReasons = map[string]int{}
			}
			for _, st := range sched.Rejected {
				for _, r := range st.Reasons() {
					res.FailReasons[r]++
				}
			}
			// Failed pods are dropped for good, as in the published method.
			res.Failed++
			pods.Delete(ctx, pod.Name, metav1.DeleteOptions{})
		}
		res.Events = append(res.Events, Event{Arrived: arrived, Allocated: allocated})
		if e.Progress != nil && (i+1)%1000 == 0 {
			e.Progress(i+1, len(arrival.Pods))
		}
	}
	res.FinalAllocated = allocated
	if err := check.Finish(allocated); err != nil {
		return nil, fmt.Errorf("%s %s seed %d: %w", e.Trace.Workload, e.Policy, e.Seed, err)
	}
	res.Curve = Discretize(res.Events, res.Capacity)
	res.Wall = time.Since(start)
	runtime.GC()
	return res, nil
}
